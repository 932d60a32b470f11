"""A callback written against transformers' ``TrainerCallback`` that records HF's events (as the golden run)."""

from __future__ import annotations

from transformers import TrainerCallback

EVENTS = [
    "on_init_end", "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_step_begin",
    "on_pre_optimizer_step", "on_optimizer_step", "on_substep_end", "on_step_end", "on_evaluate", "on_predict",
    "on_save", "on_log", "on_prediction_step",
]
_FLAGS = [("should_log", "log"), ("should_evaluate", "eval"), ("should_save", "save"),
          ("should_epoch_stop", "epoch_stop"), ("should_training_stop", "stop")]


class EventRecorder(TrainerCallback):
    def __init__(self):
        self.events = []
        for name in EVENTS:
            setattr(self, name, self._make(name))

    def _make(self, name):
        def handler(args, state, control, **kwargs):
            entry = f"{name} gs={state.global_step} ep={round(float(state.epoch or 0), 4)}"
            if name in ("on_step_end", "on_epoch_end"):
                entry += f" flags={[s for a, s in _FLAGS if getattr(control, a)]}"
            if name == "on_log":
                entry += f" keys={sorted(kwargs['logs'].keys())}"
            self.events.append(entry)

        return handler
