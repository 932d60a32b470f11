"""``HFEvents``: what HF's Trainer keeps for its callbacks — ``TrainerState``, ``TrainerControl`` and the handler.

The flow callback and the helpers it drives (training log, evaluation, checkpoint saver, resume) share one
instance: each reads the same state and fires events on the same control, as code inside HF's Trainer does with
``self.state`` / ``self.control`` / ``self.callback_handler``.
"""

from __future__ import annotations

from typing import Any

from hf_lightning.callbacks.hf_api import CallbackHandler
from hf_lightning.state import TrainerControl, TrainerState, is_exportable_state


class HFEvents:
    """HF's per-trainer callback state and dispatch.

    Args:
        args: a ``TrainingArguments`` (passed to every event).
        handler: the ``CallbackHandler`` holding the HF-style callbacks, in HF's order.

    Attributes:
        state: the ``TrainerState`` of the run (replaced by the checkpoint's on resume).
        control: the ``TrainerControl`` the callbacks raise flags on (replaced by whatever each event returns).
    """

    def __init__(self, args: Any, handler: CallbackHandler) -> None:
        self.args = args
        self.handler = handler
        self.state = TrainerState()
        self.control = TrainerControl()

    def fire(self, event: str, **kwargs: Any) -> TrainerControl:
        """Call ``event`` (``"on_log"``, ``"on_step_end"``, ...) on every callback and keep the control it returns.

        Args:
            event: a ``TrainerCallback`` event name.
            **kwargs: the event's extra arguments (``logs=`` for ``on_log``, ``metrics=`` for ``on_evaluate``).

        Returns:
            The new control.
        """
        self.control = getattr(self.handler, event)(self.args, self.state, self.control, **kwargs)
        return self.control

    def exportable_callbacks(self) -> list[Any]:
        """The callbacks (and the control) whose state ``trainer_state.json`` stores, as HF lists them."""
        return [cb for cb in self.handler.callbacks + [self.control] if is_exportable_state(cb)]
