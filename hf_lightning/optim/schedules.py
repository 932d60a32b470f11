"""Learning-rate schedule constructors under HF's public names, with HF's exact float arithmetic (5.23).

Every step-driven schedule is a ``torch.optim.lr_scheduler.LambdaLR`` whose factor is a
``functools.partial`` of a module-level function, as in HF, so ``scheduler.pt`` files have the same
contents and the scheduler pickles. The factor functions keep HF's operation order on purpose: learning
rates are compared bit for bit against HF's, and a reordered float expression can change the last bit.
Picking one by ``lr_scheduler_type`` lives in :mod:`hf_lightning.optim.schedulers`.
"""

from __future__ import annotations

import math
import warnings
from functools import partial
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau

from hf_lightning.optim.greedy import GreedyLR

__all__ = [
    "get_constant_schedule",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup_lr_rate",
    "get_greedy_schedule",
    "get_inverse_sqrt_schedule",
    "get_linear_schedule_with_warmup",
    "get_polynomial_decay_schedule_with_warmup",
    "get_reduce_on_plateau_schedule",
    "get_wsd_schedule",
]

_SHAPES = ("linear", "cosine", "1-sqrt")


# --- factor functions: step -> multiplier of the initial lr (module level so partials pickle) ---------------


def _constant_factor(_step: int = 0) -> int:
    return 1


def _linear_warmup(step: int, warmup: int) -> float:
    return float(step) / float(max(1, warmup))


def _constant_with_warmup_factor(step: int, *, num_warmup_steps: int) -> float:
    if step < num_warmup_steps:
        return float(step) / float(max(1.0, num_warmup_steps))
    return 1.0


def _linear_factor(step: int, *, num_warmup_steps: int, num_training_steps: int) -> float:
    if step < num_warmup_steps:
        return _linear_warmup(step, num_warmup_steps)
    remaining = float(num_training_steps - step) / float(max(1, num_training_steps - num_warmup_steps))
    return max(0.0, remaining)


def _decay_progress(step: int, warmup: int, total: int) -> float:
    return float(step - warmup) / float(max(1, total - warmup))


def _cosine_factor(step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float) -> float:
    if step < num_warmup_steps:
        return _linear_warmup(step, num_warmup_steps)
    progress = _decay_progress(step, num_warmup_steps, num_training_steps)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))


def _cosine_hard_restarts_factor(
    step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: int
) -> float:
    if step < num_warmup_steps:
        return _linear_warmup(step, num_warmup_steps)
    progress = _decay_progress(step, num_warmup_steps, num_training_steps)
    if progress >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(num_cycles) * progress) % 1.0))))


def _polynomial_factor(
    step: int, *, num_warmup_steps: int, num_training_steps: int, lr_end: float, power: float, lr_init: float
) -> float:
    # LambdaLR multiplies by the initial lr, so absolute learning rates are divided by lr_init here.
    if step < num_warmup_steps:
        return _linear_warmup(step, num_warmup_steps)
    if step > num_training_steps:
        return lr_end / lr_init
    remaining = 1 - (step - num_warmup_steps) / (num_training_steps - num_warmup_steps)
    return ((lr_init - lr_end) * remaining**power + lr_end) / lr_init


def _inverse_sqrt_factor(step: int, *, num_warmup_steps: int, timescale: int) -> float:
    if step < num_warmup_steps:
        return _linear_warmup(step, num_warmup_steps)
    shift = timescale - num_warmup_steps
    return 1.0 / math.sqrt((step + shift) / timescale)


def _cosine_min_lr_factor(
    step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float, min_lr_rate: float = 0.0
) -> float:
    if step < num_warmup_steps:
        return _linear_warmup(step, num_warmup_steps)
    progress = _decay_progress(step, num_warmup_steps, num_training_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    return max(0, cosine * (1 - min_lr_rate) + min_lr_rate)


def _cosine_warmup_min_lr_factor(
    step: int,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float,
    min_lr_rate: float = 0.0,
    warmup_lr_rate: float | None = None,
) -> float:
    # Unlike the other schedules, warmup starts one step in ((s + 1) / W) and decay is shifted by one too.
    step, warmup, total = float(step), float(num_warmup_steps), float(num_training_steps)
    if step < warmup:
        if warmup_lr_rate is None:
            return (step + 1.0) / max(1.0, warmup)
        start = float(warmup_lr_rate)
        return start + (1.0 - start) * step / max(1, warmup - 1)
    progress = (step - warmup + 1.0) / max(1.0, total - warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress))
    return max(0, cosine * (1 - min_lr_rate) + min_lr_rate)


def _shaped_rise(kind: str, q: float) -> float:
    if kind == "linear":
        return q
    if kind == "cosine":
        return 0.5 * (1.0 - math.cos(math.pi * q))
    return 1.0 - math.sqrt(1.0 - q)


def _shaped_fall(kind: str, q: float, num_cycles: float) -> float:
    if kind == "linear":
        return 1.0 - q
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * q))
    return 1.0 - math.sqrt(q)


def _wsd_factor(
    step: int,
    *,
    num_warmup_steps: int,
    num_stable_steps: int,
    num_decay_steps: int,
    warmup_type: str,
    decay_type: str,
    min_lr_ratio: float,
    num_cycles: float,
) -> float:
    if step < num_warmup_steps:
        rise = _shaped_rise(warmup_type, float(step) / float(max(1, num_warmup_steps)))
        return max(0.0, rise * (1.0 - min_lr_ratio) + min_lr_ratio)
    if step < num_warmup_steps + num_stable_steps:
        return 1.0
    if step < num_warmup_steps + num_stable_steps + num_decay_steps:
        q = float(step - num_warmup_steps - num_stable_steps) / float(max(1, num_decay_steps))
        fall = _shaped_fall(decay_type, q, num_cycles)
        return max(0.0, fall * (1.0 - min_lr_ratio) + min_lr_ratio)
    return min_lr_ratio


# --- schedule constructors, under HF's public names ----------------------------------------------------------


def get_constant_schedule(optimizer: Optimizer, last_epoch: int = -1) -> LambdaLR:
    """Keep the optimizer's learning rate unchanged.

    Args:
        optimizer: The optimizer to schedule.
        last_epoch: Index of the last step when resuming (``-1`` for a fresh start).

    Returns:
        A ``LambdaLR`` with factor 1.
    """
    return LambdaLR(optimizer, _constant_factor, last_epoch=last_epoch)


def get_reduce_on_plateau_schedule(optimizer: Optimizer, **kwargs: Any) -> ReduceLROnPlateau:
    """Lower the learning rate when an evaluation metric stops improving.

    Args:
        optimizer: The optimizer to schedule.
        **kwargs: Passed to ``torch.optim.lr_scheduler.ReduceLROnPlateau``.

    Returns:
        The ``ReduceLROnPlateau`` scheduler (stepped with a metric after each evaluation).
    """
    return ReduceLROnPlateau(optimizer, **kwargs)


def get_constant_schedule_with_warmup(optimizer: Optimizer, num_warmup_steps: int, last_epoch: int = -1) -> LambdaLR:
    """Rise linearly from 0 over ``num_warmup_steps``, then stay at the optimizer's learning rate.

    Args:
        optimizer: The optimizer to schedule.
        num_warmup_steps: Length of the warmup.
        last_epoch: Index of the last step when resuming.

    Returns:
        The ``LambdaLR``.
    """
    factor = partial(_constant_with_warmup_factor, num_warmup_steps=num_warmup_steps)
    return LambdaLR(optimizer, factor, last_epoch=last_epoch)


def get_linear_schedule_with_warmup(
    optimizer: Optimizer, num_warmup_steps: int, num_training_steps: int, last_epoch: int = -1
) -> LambdaLR:
    """Rise linearly from 0 over the warmup, then fall linearly to 0 at ``num_training_steps``.

    Args:
        optimizer: The optimizer to schedule.
        num_warmup_steps: Length of the warmup.
        num_training_steps: Total number of optimizer steps.
        last_epoch: Index of the last step when resuming.

    Returns:
        The ``LambdaLR``.
    """
    factor = partial(_linear_factor, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps)
    return LambdaLR(optimizer, factor, last_epoch)


def get_cosine_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
) -> LambdaLR:
    """Rise linearly over the warmup, then follow a cosine down to 0.

    Args:
        optimizer: The optimizer to schedule.
        num_warmup_steps: Length of the warmup.
        num_training_steps: Total number of optimizer steps.
        num_cycles: Number of cosine periods after the warmup (0.5: one half-wave from max to 0).
        last_epoch: Index of the last step when resuming.

    Returns:
        The ``LambdaLR``.
    """
    factor = partial(
        _cosine_factor,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
    )
    return LambdaLR(optimizer, factor, last_epoch)


def get_cosine_with_hard_restarts_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: int = 1,
    last_epoch: int = -1,
) -> LambdaLR:
    """Rise linearly over the warmup, then ``num_cycles`` cosine half-waves, each restarting at the max.

    Args:
        optimizer: The optimizer to schedule.
        num_warmup_steps: Length of the warmup.
        num_training_steps: Total number of optimizer steps.
        num_cycles: Number of half-waves (hard restarts) after the warmup.
        last_epoch: Index of the last step when resuming.

    Returns:
        The ``LambdaLR``.
    """
    factor = partial(
        _cosine_hard_restarts_factor,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
    )
    return LambdaLR(optimizer, factor, last_epoch)


def get_polynomial_decay_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    lr_end: float = 1e-7,
    power: float = 1.0,
    last_epoch: int = -1,
) -> LambdaLR:
    """Rise linearly over the warmup, then decay polynomially to ``lr_end`` (and stay there).

    Args:
        optimizer: The optimizer to schedule; its ``defaults["lr"]`` is the starting learning rate.
        num_warmup_steps: Length of the warmup.
        num_training_steps: Total number of optimizer steps; must exceed ``num_warmup_steps``.
        lr_end: Final learning rate (absolute, not a ratio).
        power: Exponent of the decay (1.0 is linear).
        last_epoch: Index of the last step when resuming.

    Returns:
        The ``LambdaLR``.

    Raises:
        ValueError: ``lr_end`` is not below the optimizer's learning rate, or ``num_training_steps`` equals
            ``num_warmup_steps`` (HF divides by zero at that step).
    """
    lr_init = optimizer.defaults["lr"]
    if not (lr_init > lr_end):
        raise ValueError(
            f"polynomial schedule: lr_end ({lr_end}) must be smaller than the initial lr ({lr_init}); "
            "lower `lr_end` in lr_scheduler_kwargs or raise learning_rate."
        )
    if num_training_steps == num_warmup_steps:
        raise ValueError(
            f"polynomial schedule: num_training_steps ({num_training_steps}) must differ from "
            f"num_warmup_steps ({num_warmup_steps}); the decay phase would have zero length."
        )
    factor = partial(
        _polynomial_factor,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        lr_end=lr_end,
        power=power,
        lr_init=lr_init,
    )
    return LambdaLR(optimizer, factor, last_epoch)


def get_inverse_sqrt_schedule(
    optimizer: Optimizer, num_warmup_steps: int, timescale: int | None = None, last_epoch: int = -1
) -> LambdaLR:
    """Rise linearly over the warmup, then decay as ``1/sqrt((step + timescale - warmup) / timescale)``.

    Args:
        optimizer: The optimizer to schedule.
        num_warmup_steps: Length of the warmup.
        timescale: Decay time scale; defaults to ``num_warmup_steps``, or 10000 when that is 0.
        last_epoch: Index of the last step when resuming.

    Returns:
        The ``LambdaLR``.
    """
    if timescale is None:
        timescale = num_warmup_steps or 10_000
    factor = partial(_inverse_sqrt_factor, num_warmup_steps=num_warmup_steps, timescale=timescale)
    return LambdaLR(optimizer, factor, last_epoch=last_epoch)


def _min_lr_rate(name: str, optimizer: Optimizer, min_lr: float | None, min_lr_rate: float | None) -> float:
    if min_lr is not None and min_lr_rate is not None:
        raise ValueError(
            f"{name}: set only one of `min_lr` or `min_lr_rate` in lr_scheduler_kwargs, not both "
            f"(got min_lr={min_lr}, min_lr_rate={min_lr_rate})."
        )
    if min_lr is not None:
        return min_lr / optimizer.defaults["lr"]
    if min_lr_rate is None:
        raise ValueError(
            f"{name}: one of `min_lr` or `min_lr_rate` should be set through the `lr_scheduler_kwargs`, "
            'e.g. lr_scheduler_kwargs={"min_lr_rate": 0.1}.'
        )
    return min_lr_rate


def get_cosine_with_min_lr_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
) -> LambdaLR:
    """Like :func:`get_cosine_schedule_with_warmup`, but the cosine ends at a floor instead of 0.

    Args:
        optimizer: The optimizer to schedule.
        num_warmup_steps: Length of the warmup.
        num_training_steps: Total number of optimizer steps.
        num_cycles: Number of cosine periods after the warmup.
        last_epoch: Index of the last step when resuming.
        min_lr: The floor as an absolute learning rate.
        min_lr_rate: The floor as a fraction of the initial learning rate.

    Returns:
        The ``LambdaLR``.

    Raises:
        ValueError: Neither or both of ``min_lr`` / ``min_lr_rate`` given.
    """
    rate = _min_lr_rate("cosine_with_min_lr", optimizer, min_lr, min_lr_rate)
    factor = partial(
        _cosine_min_lr_factor,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
        min_lr_rate=rate,
    )
    return LambdaLR(optimizer, factor, last_epoch)


def get_cosine_with_min_lr_schedule_with_warmup_lr_rate(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
    warmup_lr_rate: float | None = None,
) -> LambdaLR:
    """Cosine to a floor, with a warmup that starts above 0 (HF's ``cosine_warmup_with_min_lr``).

    The warmup factor is ``(step + 1) / W``, or ``w + (1 - w) * step / (W - 1)`` with ``warmup_lr_rate=w``;
    the cosine phase is shifted one step later than in :func:`get_cosine_with_min_lr_schedule_with_warmup`.

    Args:
        optimizer: The optimizer to schedule.
        num_warmup_steps: Length of the warmup.
        num_training_steps: Total number of optimizer steps.
        num_cycles: Number of cosine periods after the warmup.
        last_epoch: Index of the last step when resuming.
        min_lr: The floor as an absolute learning rate.
        min_lr_rate: The floor as a fraction of the initial learning rate.
        warmup_lr_rate: Starting factor of the warmup.

    Returns:
        The ``LambdaLR``.

    Raises:
        ValueError: Neither or both of ``min_lr`` / ``min_lr_rate`` given.
    """
    rate = _min_lr_rate("cosine_warmup_with_min_lr", optimizer, min_lr, min_lr_rate)
    factor = partial(
        _cosine_warmup_min_lr_factor,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
        min_lr_rate=rate,
        warmup_lr_rate=warmup_lr_rate,
    )
    return LambdaLR(optimizer, factor, last_epoch)


def get_wsd_schedule(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_decay_steps: int,
    num_training_steps: int | None = None,
    num_stable_steps: int | None = None,
    warmup_type: str = "linear",
    decay_type: str = "cosine",
    min_lr_ratio: float = 0,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
) -> LambdaLR:
    """Warmup, stable, decay ("WSD"): rise to the max, hold it, then fall to ``min_lr_ratio``.

    Args:
        optimizer: The optimizer to schedule.
        num_warmup_steps: Length of the warmup.
        num_decay_steps: Length of the decay.
        num_training_steps: Total steps; the stable phase is what is left after warmup and decay.
        num_stable_steps: Length of the stable phase; wins over ``num_training_steps`` when both are given.
        warmup_type: ``"linear"``, ``"cosine"`` or ``"1-sqrt"``.
        decay_type: ``"linear"``, ``"cosine"`` or ``"1-sqrt"``.
        min_lr_ratio: Floor (and warmup start) as a fraction of the initial learning rate.
        num_cycles: Cosine periods of a cosine decay.
        last_epoch: Index of the last step when resuming.

    Returns:
        The ``LambdaLR``.

    Raises:
        ValueError: Neither ``num_training_steps`` nor ``num_stable_steps`` given, or an unknown shape.
    """
    if num_training_steps is None and num_stable_steps is None:
        raise ValueError(
            "warmup_stable_decay: either num_training_steps or num_stable_steps must be specified "
            "(put num_stable_steps in lr_scheduler_kwargs, or set max_steps)."
        )
    if num_training_steps is not None and num_stable_steps is not None:
        warnings.warn(
            "warmup_stable_decay got both num_training_steps and num_stable_steps; num_stable_steps is used.",
            stacklevel=2,
        )
    for field, kind in (("warmup_type", warmup_type), ("decay_type", decay_type)):
        if kind not in _SHAPES:
            raise ValueError(f"warmup_stable_decay: unknown {field} {kind!r}; expected 'linear', 'cosine' or '1-sqrt'.")
    if num_stable_steps is None:
        num_stable_steps = num_training_steps - num_warmup_steps - num_decay_steps
    factor = partial(
        _wsd_factor,
        num_warmup_steps=num_warmup_steps,
        num_stable_steps=num_stable_steps,
        num_decay_steps=num_decay_steps,
        warmup_type=warmup_type,
        decay_type=decay_type,
        min_lr_ratio=min_lr_ratio,
        num_cycles=num_cycles,
    )
    return LambdaLR(optimizer, factor, last_epoch)


def get_greedy_schedule(optimizer: Optimizer, **kwargs: Any) -> GreedyLR:
    """Metric-driven scheduler that raises the lr while a metric improves and lowers it on plateaus.

    Args:
        optimizer: The optimizer to schedule.
        **kwargs: Passed to :class:`~hf_lightning.optim.greedy.GreedyLR`.

    Returns:
        The ``GreedyLR`` scheduler (stepped with a metric after each evaluation).
    """
    return GreedyLR(optimizer, **kwargs)
