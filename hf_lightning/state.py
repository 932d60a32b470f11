"""Training state shared with callbacks: ``TrainerState``, ``TrainerControl`` and ``ExportableState``.

These mirror ``transformers.trainer_callback`` (5.23) field for field, so that ``trainer_state.json`` files are
byte-identical to the ones HF's Trainer writes and a callback written for transformers reads the same attributes.
Pure module: no Lightning, no transformers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from typing import Any

__all__ = ["ExportableState", "TrainerControl", "TrainerState", "is_exportable_state"]

_STEP_KINDS = ("logging", "eval", "save")


class ExportableState:
    """Mixin for objects whose state is stored in ``trainer_state.json`` under ``stateful_callbacks``.

    Subclasses implement :meth:`state`, returning plain JSON data in two parts: ``"args"`` (constructor keyword
    arguments) and ``"attributes"`` (values to set on the new instance afterwards). Keeping the state as JSON
    rather than pickles means a checkpoint can be restored without unpickling arbitrary objects.
    """

    def state(self) -> dict:
        """Return ``{"args": {...}, "attributes": {...}}`` describing this object.

        Raises:
            NotImplementedError: The subclass did not implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement `state()` to be stored in checkpoints.")

    @classmethod
    def from_state(cls, state: dict):
        """Rebuild an instance from the output of :meth:`state`.

        Args:
            state: A dict with ``"args"`` (passed to the constructor) and ``"attributes"`` (set afterwards).

        Returns:
            The new instance.
        """
        instance = cls(**state["args"])
        for name, value in state["attributes"].items():
            setattr(instance, name, value)
        return instance


def is_exportable_state(obj: Any) -> bool:
    """Tell whether ``obj`` is an :class:`ExportableState`, ours or transformers' own.

    A callback written for transformers inherits ``transformers.trainer_callback.ExportableState``, which is not
    our class; we accept it by name so such callbacks keep their state in our checkpoints too.

    Args:
        obj: Any object, typically a callback.

    Returns:
        True when the object can export its state.
    """
    if isinstance(obj, ExportableState):
        return True
    has_base = any(base.__name__ == "ExportableState" for base in type(obj).__mro__)
    return has_base and callable(getattr(obj, "state", None))


@dataclass
class TrainerState:
    """The training state saved in checkpoints as ``trainer_state.json`` and passed to every callback event.

    A step is one optimizer update (one gradient-accumulation window), never a micro-batch.

    Attributes:
        epoch: Fractional epoch reached (``epoch_index + batches_done / batches_per_epoch``); 0 before training.
        global_step: Number of optimizer updates completed.
        max_steps: Number of optimizer updates planned for this training.
        logging_steps: Absolute logging interval in steps (resolved by :meth:`compute_steps`).
        eval_steps: Absolute evaluation interval in steps.
        save_steps: Absolute checkpoint interval in steps.
        train_batch_size: Per-device batch size times the number of GPUs, recorded at ``train()`` start.
        num_train_epochs: Number of epochs the loop runs (an integer).
        num_input_tokens_seen: Input tokens counted so far (when ``include_num_input_tokens_seen`` is on).
        total_flos: Estimated floating point operations so far (float to avoid overflow).
        log_history: Every logged dict, in order, each carrying its ``step``.
        best_metric: Best value of ``metric_for_best_model`` seen so far.
        best_global_step: Step at which ``best_metric`` was reached.
        best_model_checkpoint: Folder of the checkpoint holding the best model.
        is_local_process_zero: Whether this process is the main one on its machine.
        is_world_process_zero: Whether this process is the main one overall.
        is_hyper_param_search: Whether the run is part of a hyper-parameter search.
        trial_name: Name of the hyper-parameter search trial, if any.
        trial_params: Parameters of the hyper-parameter search trial, if any.
        stateful_callbacks: ``{class name: state}`` (or a list of states for repeated classes) of the callbacks
            implementing :class:`ExportableState`. A list of such callbacks is accepted and converted.
    """

    epoch: float = 0
    global_step: int = 0
    max_steps: int = 0
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: int | None = None
    num_train_epochs: int = 0
    num_input_tokens_seen: int = 0
    total_flos: float = 0
    log_history: list[dict[str, float]] = None
    best_metric: float | None = None
    best_global_step: int | None = None
    best_model_checkpoint: str | None = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: str | None = None
    trial_params: dict[str, str | float | int | bool] | None = None
    stateful_callbacks: dict[str, Any] | None = None

    def __post_init__(self):
        # None defaults rather than default_factory keep the dataclass signature identical to HF's.
        if self.log_history is None:
            self.log_history = []
        if self.stateful_callbacks is None:
            self.stateful_callbacks = {}
        elif not isinstance(self.stateful_callbacks, dict):
            self.stateful_callbacks = _export_callback_states(self.stateful_callbacks)

    def save_to_json(self, json_path: str | os.PathLike) -> None:
        """Write the state as JSON, byte-for-byte as HF's Trainer writes ``trainer_state.json``.

        Args:
            json_path: Destination file.
        """
        # The fields as they are (json.dumps copies nothing): dataclasses.asdict would deep-copy the whole
        # log_history on every save first. A dataclass value inside is written as asdict would write it.
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        text = json.dumps(fields, indent=2, sort_keys=True, default=_nested_dataclass_as_dict) + "\n"
        with open(json_path, "w", encoding="utf-8") as f:
            f.write(text)

    @classmethod
    def load_from_json(cls, json_path: str | os.PathLike) -> TrainerState:
        """Read a state written by :meth:`save_to_json` or by HF's Trainer.

        Args:
            json_path: A ``trainer_state.json`` file.

        Returns:
            The loaded state.

        Raises:
            ValueError: The file is not valid JSON or does not hold a JSON object.
            TypeError: The file has keys that are not ``TrainerState`` fields.
        """
        with open(json_path, encoding="utf-8") as f:
            text = f.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{json_path} is not valid JSON ({err}); it is not a trainer_state.json file.") from err
        if not isinstance(data, dict):
            raise ValueError(f"{json_path} must hold a JSON object of TrainerState fields, got {type(data).__name__}.")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TypeError(
                f"{json_path} has keys that are not TrainerState fields: {unknown}. It was written by another "
                "version or edited by hand; remove these keys to load it."
            )
        return cls(**data)

    def compute_steps(self, args: Any, max_steps: int) -> None:
        """Resolve ``logging_steps``, ``eval_steps`` and ``save_steps`` from the arguments into absolute steps.

        A value below 1 is a fraction of ``max_steps`` (rounded up); other values are used as given. A value of
        None leaves the field at its current value.

        Args:
            args: Training arguments (read by attribute: ``logging_steps``, ``eval_steps``, ``save_steps``).
            max_steps: Total optimizer steps of the run.
        """
        for kind in _STEP_KINDS:
            value = getattr(args, f"{kind}_steps", None)
            if value is None:
                continue
            if value < 1:
                value = math.ceil(max_steps * value)
            setattr(self, f"{kind}_steps", value)

    def init_training_references(
        self,
        trainer: Any = None,
        max_steps: int = 0,
        num_train_epochs: int = 0,
        trial: Any = None,
        *,
        is_local_process_zero: bool | None = None,
        is_world_process_zero: bool | None = None,
        trial_name: str | None = None,
    ) -> None:
        """Record the run's totals and process flags at the start of training.

        Same name and positional order as HF's method, which reads them from the Trainer. Here ``trainer`` is
        optional: any object with ``is_local_process_zero()`` / ``is_world_process_zero()`` methods (and
        optionally ``hp_name`` / ``_trial`` as HF's Trainer has) is read when given; the keyword arguments
        override it.

        Args:
            trainer: Optional trainer-like object to read process flags and the trial name from.
            max_steps: Total optimizer steps of the run.
            num_train_epochs: Number of loop epochs.
            trial: Hyper-parameter search trial: a dict of parameters or an object with a ``params`` dict
                (Optuna). None outside a search.
            is_local_process_zero: Whether this process is the main one on its machine.
            is_world_process_zero: Whether this process is the main one overall.
            trial_name: Name of the trial, when known.
        """
        hp_name = getattr(trainer, "hp_name", None)
        current_trial = getattr(trainer, "_trial", None)
        if trial_name is None and hp_name is not None and current_trial is not None:
            trial_name = hp_name(current_trial)
        if trial_name is not None:
            self.trial_name = trial_name
        self.trial_params = _trial_params(trial)
        self.max_steps = max_steps
        self.num_train_epochs = num_train_epochs
        if is_local_process_zero is None and trainer is not None:
            is_local_process_zero = trainer.is_local_process_zero()
        if is_world_process_zero is None and trainer is not None:
            is_world_process_zero = trainer.is_world_process_zero()
        if is_local_process_zero is not None:
            self.is_local_process_zero = is_local_process_zero
        if is_world_process_zero is not None:
            self.is_world_process_zero = is_world_process_zero


@dataclass
class TrainerControl(ExportableState):
    """Flags callbacks raise to tell the training loop what to do next.

    The callback handler clears them before the events that consume them: ``should_training_stop`` at
    ``on_train_begin``, ``should_epoch_stop`` at ``on_epoch_begin``, the three step flags at ``on_step_begin``,
    and ``should_log`` / ``should_evaluate`` / ``should_save`` again at ``on_log`` / ``on_evaluate`` / ``on_save``.

    Attributes:
        should_training_stop: Stop training after the current micro-batch.
        should_epoch_stop: End the current epoch after the current micro-batch.
        should_save: Save a checkpoint at this step.
        should_evaluate: Evaluate at this step.
        should_log: Log the training metrics at this step.
    """

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def _new_training(self) -> None:
        self.should_training_stop = False

    def _new_epoch(self) -> None:
        self.should_epoch_stop = False

    def _new_step(self) -> None:
        self.should_save = False
        self.should_evaluate = False
        self.should_log = False

    def state(self) -> dict:
        """Return the five flags as ``{"args": {...}, "attributes": {}}``."""
        return {"args": dataclasses.asdict(self), "attributes": {}}


def _export_callback_states(callbacks) -> dict[str, Any]:
    states: dict[str, Any] = {}
    for callback in callbacks:
        if not is_exportable_state(callback):
            raise TypeError(
                "TrainerState(stateful_callbacks=...) takes callbacks that inherit `ExportableState`; got "
                f"{type(callback).__name__}. Pass only such callbacks, or a dict of already exported states."
            )
        name = type(callback).__name__
        if name not in states:
            states[name] = callback.state()
            continue
        # Several instances of one class are stored as a list, in callback order.
        if not isinstance(states[name], list):
            states[name] = [states[name]]
        states[name].append(callback.state())
    return states


def _trial_params(trial: Any) -> dict | None:
    if trial is None:
        return None
    if isinstance(trial, dict):
        return trial
    params = getattr(trial, "params", None)
    if isinstance(params, dict):
        return params
    raise TypeError(
        f"Unknown type for trial {type(trial).__name__}: pass a dict of parameters or an Optuna-style trial with "
        "a `params` dict."
    )


def _nested_dataclass_as_dict(value: Any) -> Any:
    """``json.dumps``'s fallback in :meth:`TrainerState.save_to_json`: a dataclass instance as ``asdict`` gives it."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
