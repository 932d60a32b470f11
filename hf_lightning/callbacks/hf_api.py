"""The transformers callback API: ``TrainerCallback``, ``CallbackHandler`` and HF's stock callbacks.

Names, event signatures and dispatch rules match transformers 5.23's ``trainer_callback.py``, so a callback
written for transformers (even one subclassing ``transformers.TrainerCallback``) runs unchanged here. The
Lightning side drives a :class:`CallbackHandler` exactly as HF's Trainer does, e.g.
``control = handler.on_step_end(args, state, control)``.

No Lightning imports: these classes only read and flip ``TrainerState`` / ``TrainerControl``.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

from hf_lightning._utils import has_len
from hf_lightning.flow import epoch_end_flags, step_end_flags
from hf_lightning.state import ExportableState, TrainerControl, TrainerState

__all__ = [
    "CallbackHandler",
    "DefaultFlowCallback",
    "EarlyStoppingCallback",
    "EarlyStoppingConfigError",
    "PrinterCallback",
    "ProgressCallback",
    "TrainerCallback",
]

logger = logging.getLogger(__name__)


class TrainerCallback:
    """Base class for objects that watch the training loop and steer it through ``TrainerControl``.

    Every event receives ``args`` (the training arguments), ``state`` (:class:`TrainerState`) and ``control``
    (:class:`TrainerControl`) positionally, and as keywords: ``model``, ``processing_class``, ``optimizer``,
    ``lr_scheduler``, ``train_dataloader``, ``eval_dataloader``, plus ``metrics`` for ``on_evaluate`` /
    ``on_predict`` and ``logs`` for ``on_log``. Take the keywords you need by name and swallow the rest in
    ``**kwargs``.

    ``control`` is the only object a callback should change. Mutate it in place, or return a ``TrainerControl``
    to replace it for the callbacks that follow and for the loop; returning None keeps it.

    Example:
        >>> class PrintLoss(TrainerCallback):
        ...     def on_log(self, args, state, control, logs=None, **kwargs):
        ...         if "loss" in logs:
        ...             print(state.global_step, logs["loss"])
    """

    def on_init_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs):
        """Fires once the trainer has been constructed."""

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs):
        """Fires when training starts, after the state is initialised (or restored from a checkpoint)."""

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs):
        """Fires when training ends, after the final summary log."""

    def on_epoch_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs):
        """Fires at the start of each epoch; ``should_epoch_stop`` was just cleared."""

    def on_epoch_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs):
        """Fires at the end of each epoch (also a cut-short one); may raise log / evaluate / save flags."""

    def on_step_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs):
        """Fires before the first micro-batch of an optimizer step; the step flags were just cleared.

        ``state.global_step`` still counts the previous steps.
        """

    def on_pre_optimizer_step(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs):
        """Fires after gradient clipping, right before ``optimizer.step()``; gradients are readable."""

    def on_optimizer_step(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs):
        """Fires right after ``optimizer.step()``, before gradients are zeroed."""

    def on_substep_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs):
        """Fires after each micro-batch of an accumulation window except the last one."""

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs):
        """Fires after each optimizer step, ``state.global_step`` already incremented; may raise any flag."""

    def on_evaluate(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs):
        """Fires after an evaluation, with its ``metrics``; ``should_evaluate`` was just cleared."""

    def on_predict(self, args: Any, state: TrainerState, control: TrainerControl, metrics, **kwargs):
        """Fires after a successful ``predict()``, with its ``metrics``."""

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs):
        """Fires after a checkpoint was written; ``should_save`` was just cleared."""

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs):
        """Fires after ``logs`` were appended to ``state.log_history``; ``should_log`` was just cleared."""

    def on_prediction_step(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs):
        """Fires after each evaluation or prediction batch."""

    def on_push_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs):
        """Fires before the model is pushed to the Hugging Face Hub."""


def _is_default_flow(callback: Any) -> bool:
    # transformers' own DefaultFlowCallback is accepted too, without importing transformers.
    return any(cls.__name__ == "DefaultFlowCallback" for cls in type(callback).__mro__)


class CallbackHandler(TrainerCallback):
    """Calls a list of callbacks in order for each event, as HF's Trainer does.

    Each ``on_*`` method first clears the control flags the event consumes, then calls every callback with the
    shared keyword arguments and returns the (possibly replaced) ``control``, which the caller must keep.

    Args:
        callbacks: Callback instances or classes (classes are instantiated without arguments).
        model: The model, passed to callbacks as ``model``.
        processing_class: Tokenizer or processor, passed as ``processing_class``.
        optimizer: The optimizer, passed as ``optimizer``.
        lr_scheduler: The scheduler, passed as ``lr_scheduler``.

    Attributes:
        train_dataloader: Passed as ``train_dataloader``; set by the trainer before training.
        eval_dataloader: Passed as ``eval_dataloader``; set by the trainer before evaluating.
    """

    def __init__(self, callbacks, model, processing_class, optimizer, lr_scheduler):
        self.callbacks: list = []
        for callback in callbacks:
            self.add_callback(callback)
        self.model = model
        self.processing_class = processing_class
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.train_dataloader = None
        self.eval_dataloader = None
        if not any(_is_default_flow(cb) for cb in self.callbacks):
            logger.warning(
                "No DefaultFlowCallback among the callbacks, so nothing will decide when to log, evaluate, save or "
                "stop; add one with `add_callback(DefaultFlowCallback)`. Current callbacks:\n%s",
                self.callback_list,
            )

    def add_callback(self, callback) -> None:
        """Append a callback (an instance, or a class instantiated without arguments).

        A second callback of a class already present is added anyway, with a warning.
        """
        cls = callback if isinstance(callback, type) else type(callback)
        instance = callback() if isinstance(callback, type) else callback
        if any(type(cb) is cls for cb in self.callbacks):
            logger.warning(
                "Adding a second %s to the callbacks; both will run. Current callbacks:\n%s",
                cls.__name__,
                self.callback_list,
            )
        self.callbacks.append(instance)

    def pop_callback(self, callback):
        """Remove and return a callback: the first instance of a class, or the given instance.

        Returns:
            The removed callback, or None when nothing matched.
        """
        found = self._find(callback)
        if found is not None:
            self.callbacks.remove(found)
        return found

    def remove_callback(self, callback) -> None:
        """Remove a callback: the first instance of a class, or the given instance.

        Raises:
            ValueError: An instance was given that is not in the list (a class that matches nothing is ignored,
                as in HF).
        """
        if isinstance(callback, type):
            found = self._find(callback)
            if found is not None:
                self.callbacks.remove(found)
            return
        if callback not in self.callbacks:
            raise ValueError(f"Cannot remove {callback!r}: it is not among the callbacks ({self.callback_list}).")
        self.callbacks.remove(callback)

    def _find(self, callback):
        if isinstance(callback, type):
            return next((cb for cb in self.callbacks if isinstance(cb, callback)), None)
        return next((cb for cb in self.callbacks if cb == callback), None)

    @property
    def callback_list(self) -> str:
        """Class names of the callbacks, one per line."""
        return "\n".join(type(cb).__name__ for cb in self.callbacks)

    def on_init_end(self, args, state, control, **kwargs):
        return self.call_event("on_init_end", args, state, control, **kwargs)

    def on_train_begin(self, args, state, control, **kwargs):
        control.should_training_stop = False
        return self.call_event("on_train_begin", args, state, control, **kwargs)

    def on_train_end(self, args, state, control, **kwargs):
        return self.call_event("on_train_end", args, state, control, **kwargs)

    def on_epoch_begin(self, args, state, control, **kwargs):
        control.should_epoch_stop = False
        return self.call_event("on_epoch_begin", args, state, control, **kwargs)

    def on_epoch_end(self, args, state, control, **kwargs):
        return self.call_event("on_epoch_end", args, state, control, **kwargs)

    def on_step_begin(self, args, state, control, **kwargs):
        control.should_log = False
        control.should_evaluate = False
        control.should_save = False
        return self.call_event("on_step_begin", args, state, control, **kwargs)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        return self.call_event("on_pre_optimizer_step", args, state, control, **kwargs)

    def on_optimizer_step(self, args, state, control, **kwargs):
        return self.call_event("on_optimizer_step", args, state, control, **kwargs)

    def on_substep_end(self, args, state, control, **kwargs):
        return self.call_event("on_substep_end", args, state, control, **kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        return self.call_event("on_step_end", args, state, control, **kwargs)

    def on_evaluate(self, args, state, control, metrics, **kwargs):
        control.should_evaluate = False
        return self.call_event("on_evaluate", args, state, control, metrics=metrics, **kwargs)

    def on_predict(self, args, state, control, metrics, **kwargs):
        return self.call_event("on_predict", args, state, control, metrics=metrics, **kwargs)

    def on_save(self, args, state, control, **kwargs):
        control.should_save = False
        return self.call_event("on_save", args, state, control, **kwargs)

    def on_log(self, args, state, control, logs, **kwargs):
        control.should_log = False
        return self.call_event("on_log", args, state, control, logs=logs, **kwargs)

    def on_prediction_step(self, args, state, control, **kwargs):
        return self.call_event("on_prediction_step", args, state, control, **kwargs)

    def on_push_begin(self, args, state, control, **kwargs):
        return self.call_event("on_push_begin", args, state, control, **kwargs)

    def call_event(self, event: str, args, state, control, **kwargs):
        """Call ``event`` on every callback in order and return the resulting ``control``.

        A callback returning something other than None replaces ``control`` for the callbacks after it and for
        the caller.

        Args:
            event: Event method name, e.g. ``"on_step_end"``.
            args: Training arguments.
            state: The training state.
            control: The control flags.
            **kwargs: Event extras (``metrics``, ``logs``, ...), passed after the shared keywords.

        Returns:
            The control object to use from now on.
        """
        for callback in self._listeners(event):
            result = getattr(callback, event)(
                args,
                state,
                control,
                model=self.model,
                processing_class=self.processing_class,
                optimizer=self.optimizer,
                lr_scheduler=self.lr_scheduler,
                train_dataloader=self.train_dataloader,
                eval_dataloader=self.eval_dataloader,
                **kwargs,
            )
            if result is not None:
                control = result
        return control

    def _listeners(self, event: str) -> list:
        """The callbacks whose ``event`` does something: those that override :class:`TrainerCallback`'s no-op.

        Calling the others changes nothing (they return None), so leaving them out keeps HF's results while
        sparing the per-step events (``on_step_begin``, ``on_optimizer_step``, ...) a call per callback. The
        answer is cached for the current list of callbacks and recomputed when the list changes.
        """
        callbacks = self.callbacks
        cache = self.__dict__.get("_listener_cache")
        if cache is None or cache[0] != callbacks:
            cache = self._listener_cache = (list(callbacks), {})
        listeners = cache[1].get(event)
        if listeners is None:
            listeners = cache[1][event] = [cb for cb in callbacks if _handles(cb, event)]
        return listeners


def _handles(callback: Any, event: str) -> bool:
    """Whether ``callback.event`` is anything but :class:`TrainerCallback`'s own no-op method."""
    if event in getattr(callback, "__dict__", {}):
        return True
    base = getattr(TrainerCallback, event, None)
    method = getattr(type(callback), event, None)
    return base is None or method is not base


class DefaultFlowCallback(TrainerCallback):
    """Raises the log / evaluate / save / stop flags from the arguments' strategies (see ``hf_lightning.flow``)."""

    def on_step_end(self, args, state, control, **kwargs):
        return step_end_flags(args, state).apply(control)

    def on_epoch_end(self, args, state, control, **kwargs):
        return epoch_end_flags(args, state).apply(control)


def _format_log_value(value: Any, max_str_len: int | None = None) -> Any:
    if max_str_len is not None and isinstance(value, str) and len(value) > max_str_len:
        return (
            f"[String too long to display, length: {len(value)} > {max_str_len}. "
            "Consider increasing `max_str_len` if needed.]"
        )
    if isinstance(value, float):
        return f"{value:.4g}"
    return value


class ProgressCallback(TrainerCallback):
    """Shows tqdm bars for training (``max_steps`` long) and evaluation, and prints logs under the training bar.

    Only the world-process-zero draws. Logs are printed as a dict with floats as ``.4g`` strings and without
    ``total_flos``; they are printed only while a training bar exists.

    Args:
        max_str_len: Longer string values are replaced by a short notice when printed.
    """

    def __init__(self, max_str_len: int = 100):
        self.training_bar = None
        self.prediction_bar = None
        self.max_str_len = max_str_len

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar = _tqdm()(total=state.max_steps, dynamic_ncols=True)
        self.current_step = 0

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            # Advance by the step delta: a resumed run starts the bar at the restored step.
            self.training_bar.update(state.global_step - self.current_step)
            self.current_step = state.global_step

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if state.is_world_process_zero and has_len(eval_dataloader):
            if self.prediction_bar is None:
                # Inside training the eval bar disappears when done; a standalone evaluate() leaves it on screen.
                self.prediction_bar = _tqdm()(
                    total=len(eval_dataloader), leave=self.training_bar is None, dynamic_ncols=True
                )
            self.prediction_bar.update(1)

    def on_evaluate(self, args, state, control, **kwargs):
        self._close_prediction_bar(state)

    def on_predict(self, args, state, control, **kwargs):
        self._close_prediction_bar(state)

    def _close_prediction_bar(self, state) -> None:
        if state.is_world_process_zero:
            if self.prediction_bar is not None:
                self.prediction_bar.close()
            self.prediction_bar = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            # A copy: other callbacks receive the same logs dict and must still see total_flos.
            shown = {key: _format_log_value(value, self.max_str_len) for key, value in logs.items()}
            shown.pop("total_flos", None)
            self.training_bar.write(str(shown))

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar.close()
            self.training_bar = None


def _tqdm():
    # Imported lazily so importing the callbacks costs nothing when no bar is drawn.
    from tqdm.auto import tqdm

    return tqdm


class PrinterCallback(TrainerCallback):
    """Prints each log dict (floats as ``.4g``) on the local main process; used when tqdm is disabled.

    As in HF, ``total_flos`` is popped from the shared ``logs`` dict, so callbacks after this one do not see it.
    """

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None:
            logs.pop("total_flos", None)
        if state.is_local_process_zero:
            if logs is not None:
                logs = {key: _format_log_value(value) for key, value in logs.items()}
            print(logs)


class EarlyStoppingConfigError(ValueError, AssertionError):
    """The arguments cannot drive early stopping.

    Also an ``AssertionError`` because HF raises that, so code catching HF's error keeps working.
    """


class EarlyStoppingCallback(TrainerCallback, ExportableState):
    """Stops training when ``metric_for_best_model`` has not improved for ``early_stopping_patience`` evaluations.

    Each evaluation is compared with ``state.best_metric`` as it was before that evaluation (the trainer updates
    the best metric after ``on_evaluate``). An evaluation improves when there is no best yet, or when it is
    strictly better in the direction given by ``greater_is_better`` and differs from the best by more than
    ``early_stopping_threshold``. Otherwise a counter grows; reaching the patience raises
    ``should_training_stop``. The counter is saved in checkpoints (``stateful_callbacks``).

    Args:
        early_stopping_patience: Number of evaluations in a row without improvement that stops training.
        early_stopping_threshold: Minimum absolute improvement that counts (None means 0).

    Raises:
        TypeError: ``early_stopping_patience`` is not an int.
        ValueError: ``early_stopping_patience`` is below 1.
        EarlyStoppingConfigError: At ``on_train_begin``, when ``metric_for_best_model`` is not set or
            ``eval_strategy`` is "no".
    """

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float | None = 0.0):
        if isinstance(early_stopping_patience, bool) or not isinstance(early_stopping_patience, int):
            raise TypeError(
                f"early_stopping_patience must be an int, got {early_stopping_patience!r}; pass the number of "
                "evaluations without improvement that stops training."
            )
        if early_stopping_patience < 1:
            raise ValueError(
                f"early_stopping_patience must be >= 1, got {early_stopping_patience}; with fewer, training would "
                "stop at the first evaluation."
            )
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = early_stopping_threshold
        self.early_stopping_patience_counter = 0

    def check_metric_value(self, args, state, control, metric_value) -> None:
        """Reset the counter if ``metric_value`` improves on ``state.best_metric``, else increment it."""
        better = operator.gt if args.greater_is_better else operator.lt
        best = state.best_metric
        threshold = self.early_stopping_threshold or 0.0
        if best is None or (better(metric_value, best) and abs(metric_value - best) > threshold):
            self.early_stopping_patience_counter = 0
        else:
            self.early_stopping_patience_counter += 1

    def on_train_begin(self, args, state, control, **kwargs):
        if not args.load_best_model_at_end:
            logger.warning(
                "EarlyStoppingCallback is used without load_best_model_at_end=True: when training stops, the "
                "model of the last step is kept, not the best one."
            )
        if args.metric_for_best_model is None:
            raise EarlyStoppingConfigError(
                "EarlyStoppingCallback requires metric_for_best_model to be defined: set "
                "`metric_for_best_model` (e.g. 'loss') in the training arguments."
            )
        if getattr(args.eval_strategy, "value", args.eval_strategy) == "no":
            raise EarlyStoppingConfigError(
                "EarlyStoppingCallback requires IntervalStrategy of steps or epoch: set `eval_strategy` to "
                "'steps' or 'epoch' so that evaluations happen."
            )

    def on_evaluate(self, args, state, control, metrics, **kwargs):
        key = args.metric_for_best_model
        if not key.startswith("eval_"):
            key = f"eval_{key}"
        value = metrics.get(key)
        if value is None:
            logger.warning(
                "early stopping required metric_for_best_model, but did not find %s so early stopping is disabled",
                key,
            )
            return
        self.check_metric_value(args, state, control, value)
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            control.should_training_stop = True

    def state(self) -> dict:
        """Return the patience and threshold as ``args`` and the counter as ``attributes``."""
        return {
            "args": {
                "early_stopping_patience": self.early_stopping_patience,
                "early_stopping_threshold": self.early_stopping_threshold,
            },
            "attributes": {"early_stopping_patience_counter": self.early_stopping_patience_counter},
        }
