"""``GreedyLR``: the metric-driven scheduler behind HF 5.x's ``lr_scheduler_type="greedy"``.

Same decisions, defaults and ``state_dict`` keys as ``transformers.optimization.GreedyLR`` (5.23): the learning
rate is divided by ``factor`` after more than ``patience`` improving evaluations in a row and multiplied by it
after more than ``patience`` non-improving ones, within ``[min_lr, max_lr]``; after ``reset_start`` reductions
spent at the floor it starts over from the initial learning rates. Like ``ReduceLROnPlateau`` it is stepped
with a metric after each evaluation, not after each optimizer step.
"""

from __future__ import annotations

from typing import Any

from torch.optim import Optimizer

__all__ = ["GreedyLR", "StreamingAverage"]


class StreamingAverage:
    """Mean of the last ``window_size`` values seen.

    Args:
        window_size: How many recent values the mean covers.
    """

    def __init__(self, window_size: int) -> None:
        self.window_size = window_size
        self.values: list[float] = []
        self.sum = 0.0

    def streamavg(self, value: float) -> float:
        """Add ``value`` and return the mean of the window (HF's method name)."""
        self.values.append(value)
        self.sum += value
        if len(self.values) > self.window_size:
            self.sum -= self.values.pop(0)
        return self.sum / len(self.values)

    def state_dict(self) -> dict[str, Any]:
        """The window and running sum."""
        return {"window_size": self.window_size, "values": list(self.values), "sum": self.sum}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; missing keys keep or reset to empty."""
        self.window_size = state_dict.get("window_size", self.window_size)
        self.values = list(state_dict.get("values", []))
        self.sum = state_dict.get("sum", 0.0)


def _per_group(value: float | list[float] | tuple[float, ...], n_groups: int, name: str) -> list[float]:
    if isinstance(value, (list, tuple)):
        if len(value) != n_groups:
            raise ValueError(f"GreedyLR: expected {n_groups} {name}s (one per param group), got {len(value)}.")
        return list(value)
    return [value] * n_groups


# Attributes saved by `state_dict`, in HF's order, so a scheduler.pt from either side loads in the other.
_STATE_KEYS = (
    "factor",
    "min_lrs",
    "max_lrs",
    "patience",
    "verbose",
    "cooldown",
    "warmup",
    "cooldown_counter",
    "warmup_counter",
    "mode",
    "threshold",
    "threshold_mode",
    "best",
    "num_bad_epochs",
    "num_good_epochs",
    "eps",
    "last_epoch",
    "smooth",
    "window_size",
    "reset_start",
    "reset_start_original",
    "_last_lr",
    "_init_lrs",
)


class GreedyLR:
    """Raise the learning rate while a metric keeps improving, lower it while it does not.

    Args:
        optimizer: The wrapped optimizer.
        mode: ``"min"`` (lower metric is better) or ``"max"``.
        factor: Multiplier on a plateau, divisor on improvement; must be < 1.
        patience: Evaluations of improvement / no improvement tolerated before acting.
        threshold: Margin a value must beat the best by to count as better.
        threshold_mode: ``"abs"`` (``best - threshold``) or ``"rel"`` (``best * (1 - threshold)``).
        cooldown: Evaluations ignored after a reduction.
        warmup: Evaluations ignored after an increase.
        min_lr: Floor, one value or one per param group.
        max_lr: Ceiling, one value or one per param group.
        eps: Changes smaller than this are not applied.
        verbose: Print each change.
        smooth: Judge the rolling mean of the metric instead of the raw value.
        window_size: Window of that rolling mean.
        reset_start: Reductions at the floor after which everything restarts from the initial rates.

    Raises:
        ValueError: ``factor >= 1``, an unknown ``mode`` / ``threshold_mode``, or per-group lists of the wrong length.
        TypeError: ``optimizer`` is not a ``torch.optim.Optimizer``.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        mode: str = "min",
        factor: float = 0.95,
        patience: int = 10,
        threshold: float = 1e-6,
        threshold_mode: str = "abs",
        cooldown: int = 0,
        warmup: int = 0,
        min_lr: float | list[float] = 1e-3,
        max_lr: float | list[float] = 1.0,
        eps: float = 1e-8,
        verbose: bool = False,
        smooth: bool = False,
        window_size: int = 50,
        reset_start: int = 500,
    ) -> None:
        if factor >= 1.0:
            raise ValueError(f"GreedyLR: factor must be < 1.0, got {factor}.")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"GreedyLR needs a torch.optim.Optimizer, got {type(optimizer).__name__}.")
        if mode not in ("min", "max"):
            raise ValueError(f"GreedyLR: mode must be 'min' or 'max', got {mode!r}.")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"GreedyLR: threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}.")
        self.optimizer = optimizer
        self.factor = factor
        self.patience = patience
        self.verbose = verbose
        self.cooldown = cooldown
        self.warmup = warmup
        self.cooldown_counter = 0
        self.warmup_counter = 0
        self.mode = mode
        self.threshold = threshold
        self.threshold_mode = threshold_mode
        self.eps = eps
        self.smooth = smooth
        self.window_size = window_size
        self.reset_start = reset_start
        self.reset_start_original = reset_start
        self.last_epoch = 0
        n_groups = len(optimizer.param_groups)
        self.min_lrs = _per_group(min_lr, n_groups, "min_lr")
        self.max_lrs = _per_group(max_lr, n_groups, "max_lr")
        self._init_lrs = [group["lr"] for group in optimizer.param_groups]
        self._last_lr = list(self._init_lrs)
        self.best = self._worst()
        self.num_bad_epochs = 0
        self.num_good_epochs = 0
        self._streaming_avg: StreamingAverage | None = StreamingAverage(window_size) if smooth else None

    def _worst(self) -> float:
        return float("inf") if self.mode == "min" else float("-inf")

    def step(self, metrics: float, epoch: int | None = None) -> None:
        """Take one evaluation's metric into account and adjust the learning rates.

        Args:
            metrics: The monitored value (e.g. ``eval_loss``).
            epoch: Explicit counter value; defaults to the previous one plus one.
        """
        current = float(metrics)
        if self.smooth and self._streaming_avg is not None:
            current = self._streaming_avg.streamavg(current)
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch

        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = self.num_good_epochs = 0
        elif self.warmup_counter > 0:
            self.warmup_counter -= 1
            self.num_bad_epochs = self.num_good_epochs = 0
        else:
            if self.is_better(current, self.best):
                self.best = current
                self.num_bad_epochs = 0
                self.num_good_epochs += 1
            else:
                self.num_bad_epochs += 1
                self.num_good_epochs = 0
            if self.num_good_epochs > self.patience:
                self._increase_lr(self.last_epoch)
                self.warmup_counter = self.warmup
                self.num_good_epochs = 0
            elif self.num_bad_epochs > self.patience:
                self._reduce_lr(self.last_epoch)
                self.cooldown_counter = self.cooldown
                self.num_bad_epochs = 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def is_better(self, current: float, best: float) -> bool:
        """Whether ``current`` beats ``best`` by the configured threshold."""
        if self.mode == "min":
            bound = best * (1.0 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold
            return current < bound
        bound = best * (1.0 + self.threshold) if self.threshold_mode == "rel" else best + self.threshold
        return current > bound

    def _reduce_lr(self, epoch: int) -> None:
        all_at_floor = True
        for i, group in enumerate(self.optimizer.param_groups):
            old = float(group["lr"])
            new = max(old * self.factor, self.min_lrs[i])
            if old - new > self.eps:
                group["lr"] = new
                if self.verbose:
                    print(f"Epoch {epoch}: reducing learning rate of group {i} to {new:.4e}.")
            if group["lr"] > self.min_lrs[i]:
                all_at_floor = False
        if all_at_floor:
            self.reset_start -= 1
            if self.reset_start <= 0:
                self._reset()

    def _increase_lr(self, epoch: int) -> None:
        for i, group in enumerate(self.optimizer.param_groups):
            old = float(group["lr"])
            new = min(old / self.factor, self.max_lrs[i])
            if new - old > self.eps:
                group["lr"] = new
                if self.verbose:
                    print(f"Epoch {epoch}: increasing learning rate of group {i} to {new:.4e}.")
        self.reset_start = self.reset_start_original

    def _reset(self) -> None:
        for group, lr in zip(self.optimizer.param_groups, self._init_lrs):
            group["lr"] = lr
        self.best = self._worst()
        self.num_bad_epochs = self.num_good_epochs = 0
        self.cooldown_counter = self.warmup_counter = 0
        self.reset_start = self.reset_start_original
        if self.smooth and self._streaming_avg is not None:
            self._streaming_avg = StreamingAverage(self.window_size)
        if self.verbose:
            print("Scheduler reset to initial state.")

    def get_last_lr(self) -> list[float]:
        """Learning rates after the latest :meth:`step` (the initial ones before any)."""
        return self._last_lr

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume, with HF's keys."""
        state = {key: getattr(self, key) for key in _STATE_KEYS}
        if self.smooth and self._streaming_avg is not None:
            state["_streaming_avg"] = self._streaming_avg.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (ours or HF's) and put its last learning rates back on the optimizer."""
        for key in _STATE_KEYS:
            if key in state_dict:
                setattr(self, key, state_dict[key])
        if "_streaming_avg" in state_dict:
            if self._streaming_avg is None:
                self._streaming_avg = StreamingAverage(self.window_size)
            self._streaming_avg.load_state_dict(state_dict["_streaming_avg"])
        if "_last_lr" in state_dict:
            for group, lr in zip(self.optimizer.param_groups, self._last_lr):
                group["lr"] = lr
