"""Pick a learning-rate scheduler by ``lr_scheduler_type``, as ``transformers.get_scheduler`` and
``Trainer.create_scheduler`` do (5.23), through one name -> constructor registry.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau

from hf_lightning.optim.greedy import GreedyLR
from hf_lightning.optim.schedules import (
    get_constant_schedule,
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_cosine_with_hard_restarts_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup_lr_rate,
    get_greedy_schedule,
    get_inverse_sqrt_schedule,
    get_linear_schedule_with_warmup,
    get_polynomial_decay_schedule_with_warmup,
    get_reduce_on_plateau_schedule,
    get_wsd_schedule,
)

__all__ = ["SCHEDULER_REGISTRY", "create_scheduler", "get_scheduler", "resolve_warmup_steps"]


# --- registry and dispatch ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Inputs:
    """Which of ``get_scheduler``'s inputs a schedule takes (HF 5.23's dispatch)."""

    warmup: bool = True  # requires num_warmup_steps
    total: str = "required"  # num_training_steps: "required", "optional" (passed, may be None) or "unused"
    extra: bool = True  # receives scheduler_specific_kwargs


#: ``lr_scheduler_type`` -> schedule constructor, in the order of HF's ``SchedulerType``.
SCHEDULER_REGISTRY: dict[str, Callable[..., Any]] = {
    "linear": get_linear_schedule_with_warmup,
    "cosine": get_cosine_schedule_with_warmup,
    "cosine_with_restarts": get_cosine_with_hard_restarts_schedule_with_warmup,
    "polynomial": get_polynomial_decay_schedule_with_warmup,
    "constant": get_constant_schedule,
    "constant_with_warmup": get_constant_schedule_with_warmup,
    "inverse_sqrt": get_inverse_sqrt_schedule,
    "reduce_lr_on_plateau": get_reduce_on_plateau_schedule,
    "cosine_with_min_lr": get_cosine_with_min_lr_schedule_with_warmup,
    "cosine_warmup_with_min_lr": get_cosine_with_min_lr_schedule_with_warmup_lr_rate,
    "warmup_stable_decay": get_wsd_schedule,
    "greedy": get_greedy_schedule,
}

# HF ignores warmup and kwargs for "constant", and kwargs for "constant_with_warmup"; reproduced as is.
_INPUTS: dict[str, _Inputs] = {
    "constant": _Inputs(warmup=False, total="unused", extra=False),
    "constant_with_warmup": _Inputs(total="unused", extra=False),
    "inverse_sqrt": _Inputs(total="unused"),
    "reduce_lr_on_plateau": _Inputs(warmup=False, total="unused"),
    "greedy": _Inputs(warmup=False, total="unused"),
    "warmup_stable_decay": _Inputs(total="optional"),
}

_KWARG_TARGETS: dict[str, Callable[..., Any]] = {
    "reduce_lr_on_plateau": ReduceLROnPlateau.__init__,
    "greedy": GreedyLR.__init__,
}


def _check_kwargs(name: str, kwargs: dict[str, Any], passed: set[str]) -> None:
    target = _KWARG_TARGETS.get(name, SCHEDULER_REGISTRY[name])
    params = inspect.signature(target).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [p for p in params if p not in ("self", "optimizer") and p not in passed]
    unknown = [key for key in kwargs if key not in accepted or key in passed]
    if unknown:
        raise TypeError(
            f"lr_scheduler_kwargs {unknown} are not accepted by the {name!r} scheduler; "
            f"it takes: {', '.join(accepted) or 'nothing'}."
        )
    if name == "warmup_stable_decay" and "num_decay_steps" not in kwargs:
        raise TypeError(
            'warmup_stable_decay requires `num_decay_steps` in lr_scheduler_kwargs, e.g. {"num_decay_steps": 100}.'
        )


def get_scheduler(
    name: Any,
    optimizer: Optimizer,
    num_warmup_steps: int | None = None,
    num_training_steps: int | None = None,
    scheduler_specific_kwargs: dict[str, Any] | None = None,
) -> Any:
    """Build the schedule called ``name``, as ``transformers.get_scheduler`` does.

    Args:
        name: A key of :data:`SCHEDULER_REGISTRY`, as a ``str`` or a str-valued enum (``SchedulerType``).
        optimizer: The optimizer to schedule.
        num_warmup_steps: Warmup length; required by every schedule except ``constant``,
            ``reduce_lr_on_plateau`` and ``greedy``.
        num_training_steps: Total optimizer steps; required by the decaying schedules (optional for
            ``warmup_stable_decay``, unused by ``constant*``, ``inverse_sqrt`` and the metric-driven ones).
        scheduler_specific_kwargs: Extra keyword arguments of the schedule (e.g. ``num_cycles``, ``min_lr_rate``).

    Returns:
        A ``LambdaLR``, or ``ReduceLROnPlateau`` / ``GreedyLR`` for the metric-driven names.

    Raises:
        ValueError: Unknown ``name``, or a required step count missing.
        TypeError: ``scheduler_specific_kwargs`` holds a key the schedule does not take.

    Example:
        >>> import torch
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        >>> sched = get_scheduler("linear", opt, num_warmup_steps=2, num_training_steps=10)
        >>> sched.get_last_lr()
        [0.0]
    """
    name = getattr(name, "value", name)
    if name not in SCHEDULER_REGISTRY:
        raise ValueError(
            f"lr_scheduler_type={name!r} is not a known scheduler; use one of: {', '.join(SCHEDULER_REGISTRY)}."
        )
    build = SCHEDULER_REGISTRY[name]
    inputs = _INPUTS.get(name, _Inputs())
    kwargs = dict(scheduler_specific_kwargs or {}) if inputs.extra else {}

    if inputs.warmup and num_warmup_steps is None:
        raise ValueError(f"{name} requires `num_warmup_steps`, please provide that argument.")
    if inputs.total == "required" and num_training_steps is None:
        raise ValueError(f"{name} requires `num_training_steps`, please provide that argument.")

    passed: dict[str, Any] = {}
    if inputs.warmup:
        passed["num_warmup_steps"] = num_warmup_steps
    if inputs.total != "unused":
        passed["num_training_steps"] = num_training_steps
    _check_kwargs(name, kwargs, set(passed))
    return build(optimizer, **passed, **kwargs)


# --- from TrainingArguments ----------------------------------------------------------------------------------


def resolve_warmup_steps(warmup_steps: float, num_training_steps: int) -> int:
    """HF 5.x's warmup rule: ``>= 1`` is a step count (floored), ``< 1`` a fraction of the total (ceiled).

    Args:
        warmup_steps: ``TrainingArguments.warmup_steps``.
        num_training_steps: Total optimizer steps.

    Returns:
        The number of warmup steps.

    Raises:
        ValueError: ``warmup_steps`` is negative.
    """
    if warmup_steps < 0:
        raise ValueError(
            f"warmup_steps must be >= 0 (a step count, or a fraction < 1 of the total); got {warmup_steps}."
        )
    if warmup_steps >= 1:
        return int(warmup_steps)
    return math.ceil(num_training_steps * warmup_steps)


def _coerce_strings(values: dict[str, Any]) -> dict[str, Any]:
    # HF's TrainingArguments turns "true"/"3"/"0.5" strings inside JSON dict fields into bool/int/float.
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            value = _coerce_strings(value)
        elif isinstance(value, str):
            if value.lower() in ("true", "false"):
                value = value.lower() == "true"
            elif value.isdigit():
                value = int(value)
            elif value.replace(".", "", 1).isdigit():
                value = float(value)
        out[key] = value
    return out


def _scheduler_kwargs(raw: Any) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return dict(raw)
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"TrainingArguments.lr_scheduler_kwargs={raw!r} is not valid JSON ({err.msg}); "
                'give a dict or a JSON object string such as \'{"num_cycles": 2}\'.'
            ) from None
        if isinstance(parsed, dict):
            return _coerce_strings(parsed)
    raise ValueError(
        f"TrainingArguments.lr_scheduler_kwargs must be a dict or a JSON object string; got {type(raw).__name__} "
        f"{raw!r}."
    )


def create_scheduler(args: Any, optimizer: Optimizer, num_training_steps: int) -> Any:
    """Build the scheduler HF's ``Trainer.create_scheduler`` would build for ``args``.

    Args:
        args: Training arguments (HF's or ours), read by attribute name: ``lr_scheduler_type``,
            ``lr_scheduler_kwargs`` (dict or JSON string), and ``get_warmup_steps(n)`` when present,
            else ``warmup_steps`` under HF 5.x's rule (:func:`resolve_warmup_steps`).
        optimizer: The optimizer to schedule.
        num_training_steps: Total optimizer steps (HF passes ``max_steps``).

    Returns:
        The scheduler (see :func:`get_scheduler`).

    Raises:
        ValueError: Unknown scheduler name, bad ``lr_scheduler_kwargs``, or a schedule's own checks.
    """
    get_warmup = getattr(args, "get_warmup_steps", None)
    if callable(get_warmup):
        warmup = get_warmup(num_training_steps)
    else:
        warmup = resolve_warmup_steps(args.warmup_steps, num_training_steps)
    return get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=warmup,
        num_training_steps=num_training_steps,
        scheduler_specific_kwargs=_scheduler_kwargs(getattr(args, "lr_scheduler_kwargs", None)),
    )


def is_metric_driven(scheduler: Any) -> bool:
    """Whether ``scheduler`` steps on an evaluation metric (ReduceLROnPlateau, GreedyLR) rather than per step.

    HF steps these after each in-training evaluation and never per optimizer step. A ``GreedyLR`` from
    transformers (passed through ``optimizers=``) is recognised by its class name.
    """
    return isinstance(scheduler, (ReduceLROnPlateau, GreedyLR)) or type(scheduler).__name__ == "GreedyLR"


def current_learning_rate(optimizer: Any, scheduler: Any = None) -> float:
    """The learning rate of the optimizer's first parameter group as HF logs it.

    Read after ``optimizer.step()`` and before ``scheduler.step()`` it is the rate this update used. A metric-driven
    scheduler (or none) changes the optimizer's rate in place, so that is read; otherwise the scheduler's last rate.
    """
    if scheduler is None or is_metric_driven(scheduler) or not hasattr(scheduler, "get_last_lr"):
        return optimizer.param_groups[0]["lr"]
    return scheduler.get_last_lr()[0]


def fit_optimizer_and_scheduler(trainer: Any) -> tuple[Any, Any]:
    """The optimizer and scheduler a ``lightning.Trainer`` fits with (HF has one of each), ``None`` for a missing one."""
    optimizer = trainer.optimizers[0] if trainer.optimizers else None
    configs = trainer.lr_scheduler_configs
    return optimizer, (configs[0].scheduler if configs else None)
