"""``debug="underflow_overflow"``: stop training at the first inf/nan, showing what the model computed before it.

HF's Trainer attaches ``transformers.debug_utils.DebugUnderflowOverflow`` to the model when ``train()`` starts.
:class:`UnderflowOverflowDetector` does the same job with forward hooks of its own and prints the same text, so
logs users grep (``Detected inf/nan during batch_number=``, ``... has infs``) read alike. ``HFLightningModule``
installs it in ``setup("fit")`` and removes it in ``teardown("fit")`` (HF never removes its hooks).

Pure torch: nothing here imports Lightning or transformers.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from torch import nn

__all__ = ["UnderflowOverflowDetector"]

_INDENT = " " * 17
_HEADER = f"{'abs min':8} {'abs max':8} metadata"
ABORT_MESSAGE = (
    "DebugUnderflowOverflow: inf/nan detected, aborting as there is no point running further. "
    "Please scroll up above this traceback to see the activation values prior to this event."
)


class UnderflowOverflowDetector:
    """Watch every module's weights, inputs and outputs; on the first inf/nan, report and raise ``ValueError``.

    Each forward call of a module becomes a *frame*: the module's path and class, then the absolute min/max of
    each of its own parameters, positional inputs and outputs. The last ``max_frames_to_save`` frames are kept;
    when an inf/nan appears they are printed (oldest first) under ``Detected inf/nan during batch_number=N``
    and training stops with HF's ``ValueError``. A batch is one forward call of the top-level model (so
    evaluation forwards count too, as in HF).

    Args:
        model: the model to watch; hooks go on it and every submodule.
        max_frames_to_save: how many recent frames the report shows (HF's default, 21).
    """

    def __init__(self, model: nn.Module, max_frames_to_save: int = 21) -> None:
        self.model = model
        self.frames: deque[str] = deque(maxlen=max_frames_to_save)
        self.batch_number = 0
        self._pending: list[str] = []
        self._calls = 0
        self._found = False
        # A module shared under several names is reported under the first one, as named_modules() yields it.
        self._names = {module: name for name, module in model.named_modules()}
        self._handles = [module.register_forward_hook(self._on_forward) for module in model.modules()]

    def remove(self) -> None:
        """Take the hooks off the model."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # The hook of the top-level model runs last in a forward pass: that is where a batch ends.
    def _on_forward(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if self._calls == 0:
            self._start_batch()
        self._calls += 1
        finished_batch = module is self.model
        if finished_batch:
            self.batch_number += 1
        self._record(module, inputs, output)
        if finished_batch:
            self._start_batch()
        if self._found:
            self._report()
            raise ValueError(ABORT_MESSAGE)

    def _start_batch(self) -> None:
        self._pending += [f"\n\n{_INDENT} *** Starting batch number={self.batch_number} ***", _HEADER]

    def _record(self, module: nn.Module, inputs: Any, output: Any) -> None:
        self._pending.append(f"{_INDENT} {self._names.get(module, '?')} {type(module).__name__}")
        for name, param in module.named_parameters(recurse=False):
            self._describe(param, name)
        for label, value in _labelled(inputs, "input"):
            self._describe(value, label)
        for label, value in _labelled(output, "output", nested=True):
            self._describe(value, label)
        self.frames.append("\n".join(self._pending))
        self._pending = []

    def _describe(self, value: Any, label: str) -> None:
        if value is None:
            self._pending.append(f"{'None':>17} {label}")
        elif not torch.is_tensor(value):
            self._pending.append(f"{'not a tensor':>17} {label}")
        else:
            magnitude = value.abs()
            self._pending.append(f"{magnitude.min():8.2e} {magnitude.max():8.2e} {label}")
            # HF prints each finding as it checks the tensor, before the frames.
            if torch.isnan(value).any().item():
                self._found = True
                print(f"{label} has nans")
            if torch.isinf(value).any().item():
                self._found = True
                print(f"{label} has infs")

    def _report(self) -> None:
        print(f"\nDetected inf/nan during batch_number={self.batch_number}")
        print(f"Last {len(self.frames)} forward frames:")
        print(_HEADER)
        print("\n".join(self.frames))
        print("\n\n")
        self.frames.clear()


def _labelled(value: Any, name: str, nested: bool = False) -> list[tuple[str, Any]]:
    """``(label, item)`` for a hook's inputs or output: a tuple is listed item by item (one level deeper for
    outputs), anything else is one item."""
    if not isinstance(value, tuple):
        return [(name, value)]
    items = []
    for i, item in enumerate(value):
        if nested and isinstance(item, tuple):
            items += [(f"{name}[{i}][{j}]", inner) for j, inner in enumerate(item)]
        else:
            items.append((f"{name}[{i}]", item))
    return items
