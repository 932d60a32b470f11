"""Mixed precision with HF's autocast scope: the model's forward only, never the loss scaling or the backward.

HF's Trainer (through accelerate) wraps the model's ``forward`` in ``torch.autocast`` and turns its fp16 / bf16
outputs back into fp32; everything else of a step (a ``compute_loss`` override's own arithmetic, the division by
the accumulation window, the backward) runs outside autocast. Lightning's ``MixedPrecision`` enters autocast
around the whole ``training_step`` instead, which under manual optimization includes the backward and changes
the numbers. :class:`HFMixedPrecision` keeps Lightning's plugin (its ``GradScaler`` for fp16, its optimizer step)
and moves the autocast: the step contexts enter nothing, and ``convert_module`` wraps the HF model's ``forward``
(``module.model``) for the duration of the run; ``teardown`` puts the original back.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from contextlib import contextmanager, nullcontext
from typing import Any, Generator

import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from torch import nn

_NO_OWN_FORWARD = object()


class HFMixedPrecision(MixedPrecision):
    """Lightning's ``"bf16-mixed"`` / ``"16-mixed"`` plugin with autocast around the HF model's forward only."""

    def __init__(self, precision: str, device: str, scaler: Any = None) -> None:
        super().__init__(precision, device, scaler)  # type: ignore[arg-type]
        self._wrapped: list[tuple[nn.Module, Any]] = []

    @contextmanager
    def forward_context(self) -> Generator[None, None, None]:
        """No autocast around Lightning's step methods (the model's forward enters it itself)."""
        with nullcontext():
            yield

    def convert_module(self, module: nn.Module) -> nn.Module:
        model = getattr(module, "model", None)
        if isinstance(model, nn.Module) and all(m is not model for m, _ in self._wrapped):
            own = model.__dict__.get("forward", _NO_OWN_FORWARD)
            model.forward = _autocast_forward(model.forward, self.autocast_context_manager)
            self._wrapped.append((model, own))
        return module

    def teardown(self) -> None:
        for model, own in reversed(self._wrapped):
            if own is _NO_OWN_FORWARD:
                model.__dict__.pop("forward", None)
            else:
                model.forward = own
        self._wrapped.clear()
        super().teardown()


def _autocast_forward(forward: Any, autocast: Any) -> Any:
    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with autocast():
            outputs = forward(*args, **kwargs)
        return outputs_to_fp32(outputs)

    return autocast_forward


def outputs_to_fp32(data: Any) -> Any:
    """fp16 / bf16 tensors anywhere in ``data`` (a tensor, a ``ModelOutput`` / dict, a (named) tuple or list) as
    fp32, the container types kept (accelerate's ``convert_outputs_to_fp32``)."""
    if isinstance(data, torch.Tensor):
        return data.float() if data.dtype in (torch.float16, torch.bfloat16) else data
    if isinstance(data, Mapping):
        return type(data)({key: outputs_to_fp32(value) for key, value in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(outputs_to_fp32(value) for value in data))
    if isinstance(data, (tuple, list)):
        return type(data)(outputs_to_fp32(value) for value in data)
    return data
