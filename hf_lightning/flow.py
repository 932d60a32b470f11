"""When to log, evaluate, save and stop: HF ``DefaultFlowCallback``'s rules as pure functions.

The rules read the arguments by attribute name (``logging_strategy``, ``logging_first_step``, ``eval_strategy``,
``eval_delay``, ``save_strategy``) and the resolved absolute step counts from the state (``global_step``,
``logging_steps``, ``eval_steps``, ``save_steps``, ``max_steps``, ``epoch``). Strategies may be plain strings or
str enums. Nothing here touches Lightning; the callbacks only carry out the flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FlowFlags", "epoch_end_flags", "step_end_flags"]


@dataclass(frozen=True)
class FlowFlags:
    """The decisions taken at one step end or epoch end; True means "do it now".

    Attributes:
        should_log: Log the training metrics.
        should_evaluate: Run an evaluation.
        should_save: Save a checkpoint.
        should_training_stop: Stop training.
    """

    should_log: bool = False
    should_evaluate: bool = False
    should_save: bool = False
    should_training_stop: bool = False

    def apply(self, control: Any) -> Any:
        """Raise the matching flags on a ``TrainerControl``; flags already raised stay raised.

        Args:
            control: A ``TrainerControl`` (ours or transformers').

        Returns:
            The same ``control`` object.
        """
        for name in ("should_log", "should_evaluate", "should_save", "should_training_stop"):
            if getattr(self, name):
                setattr(control, name, True)
        return control

    def names(self) -> list[str]:
        """Short names of the raised flags in HF's order (``log``, ``eval``, ``save``, ``stop``)."""
        pairs = (
            ("log", self.should_log),
            ("eval", self.should_evaluate),
            ("save", self.should_save),
            ("stop", self.should_training_stop),
        )
        return [name for name, raised in pairs if raised]


def step_end_flags(args: Any, state: Any) -> FlowFlags:
    """Decide what happens after an optimizer step (HF's ``DefaultFlowCallback.on_step_end``).

    ``state.global_step`` must already count the step just taken. The rules:

    * log at step 1 when ``logging_first_step``, and every ``logging_steps`` with the "steps" strategy;
    * evaluate every ``eval_steps`` with the "steps" strategy once ``eval_delay`` (in steps) is reached;
    * save every ``save_steps`` (when > 0) with the "steps" strategy;
    * at ``max_steps``: stop, evaluate the last step if the "steps" cadence skipped it (and the delay is
      reached), and save the last step with the "steps" strategy. There is no forced final log.

    Args:
        args: Training arguments.
        state: Training state with absolute step counts (see ``TrainerState.compute_steps``).

    Returns:
        The flags to raise.

    Raises:
        ValueError: A "steps" strategy has a zero step interval.
    """
    step = state.global_step
    log_by_steps = _strategy(args, "logging_strategy") == "steps"
    eval_by_steps = _strategy(args, "eval_strategy") == "steps"
    save_by_steps = _strategy(args, "save_strategy") == "steps"
    eval_delay_reached = _eval_delay(args) <= step

    should_log = step == 1 and bool(getattr(args, "logging_first_step", False))
    if log_by_steps and step % _interval(state, "logging_steps") == 0:
        should_log = True

    on_eval_cadence = eval_by_steps and step % _interval(state, "eval_steps") == 0
    should_evaluate = on_eval_cadence and eval_delay_reached
    should_save = save_by_steps and state.save_steps > 0 and step % state.save_steps == 0

    should_stop = step >= state.max_steps
    if should_stop:
        # HF always evaluates and saves the final step with "steps" strategies, even off-cadence.
        if eval_by_steps and not on_eval_cadence and eval_delay_reached:
            should_evaluate = True
        if save_by_steps:
            should_save = True

    return FlowFlags(
        should_log=should_log,
        should_evaluate=should_evaluate,
        should_save=should_save,
        should_training_stop=should_stop,
    )


def epoch_end_flags(args: Any, state: Any) -> FlowFlags:
    """Decide what happens at the end of an epoch (HF's ``DefaultFlowCallback.on_epoch_end``).

    Also applies to an epoch cut short by ``max_steps`` or a stop flag. Log with the "epoch" logging strategy,
    evaluate with the "epoch" eval strategy once ``eval_delay`` (in epochs) is reached by ``state.epoch``, save
    with the "epoch" save strategy. Never stops training.

    Args:
        args: Training arguments.
        state: Training state (``epoch`` is read).

    Returns:
        The flags to raise.
    """
    return FlowFlags(
        should_log=_strategy(args, "logging_strategy") == "epoch",
        should_evaluate=_strategy(args, "eval_strategy") == "epoch" and _eval_delay(args) <= state.epoch,
        should_save=_strategy(args, "save_strategy") == "epoch",
    )


def _strategy(args: Any, name: str) -> str:
    value = getattr(args, name, "no")
    # Str enums and plain strings compare the same way through their value.
    return getattr(value, "value", value)


def _eval_delay(args: Any) -> float:
    delay = getattr(args, "eval_delay", 0)
    return 0 if delay is None else delay


def _interval(state: Any, name: str) -> int:
    interval = getattr(state, name)
    if not interval:
        raise ValueError(
            f"state.{name} is {interval!r} but its strategy is 'steps'; set `{name}` to a positive number of "
            "steps (or a ratio in (0, 1)) in the training arguments."
        )
    return interval
