"""What ``train()``, ``evaluate()`` and ``predict()`` return, and the helpers that build their metrics.

Same names, fields and behaviour as ``transformers.trainer_utils`` (5.23): ``EvalPrediction``,
``EvalLoopOutput``, ``PredictionOutput``, ``TrainOutput``, ``speed_metrics``, ``denumpify_detensorize``.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = [
    "EvalLoopOutput",
    "EvalPrediction",
    "PredictionOutput",
    "TrainOutput",
    "denumpify_detensorize",
    "speed_metrics",
]


class EvalPrediction:
    """What ``compute_metrics`` receives: predictions and labels, plus inputs and losses when requested.

    Behaves like a tuple of ``(predictions, label_ids[, inputs][, losses])``: the optional parts appear only
    when they are not None, so ``preds, labels = eval_pred`` works in the common case. Indexing takes
    non-negative integers only (a negative index raises ``IndexError``, as in HF).

    Args:
        predictions: Model predictions (an array or a tuple of arrays).
        label_ids: Targets (an array or a tuple of arrays).
        inputs: Model inputs, when ``include_for_metrics`` contains ``"inputs"``.
        losses: Per-sample losses, when ``include_for_metrics`` contains ``"loss"``.

    Example:
        >>> p = EvalPrediction(np.array([1, 0]), np.array([1, 1]))
        >>> preds, labels = p
        >>> float((preds == labels).mean())
        0.5
    """

    def __init__(self, predictions, label_ids, inputs=None, losses=None):
        self.predictions = predictions
        self.label_ids = label_ids
        self.inputs = inputs
        self.losses = losses
        self.elements = (predictions, label_ids) + tuple(x for x in (inputs, losses) if x is not None)

    def __iter__(self):
        return iter(self.elements)

    def __getitem__(self, idx: int):
        if idx < 0 or idx >= len(self.elements):
            raise IndexError("tuple index out of range")
        return self.elements[idx]


class EvalLoopOutput(NamedTuple):
    """Result of the evaluation loop.

    Attributes:
        predictions: Gathered predictions.
        label_ids: Gathered labels, or None.
        metrics: Metrics with their ``eval_`` (or custom) prefix, or None.
        num_samples: Number of evaluated samples, or None when unknown.
    """

    predictions: np.ndarray | tuple[np.ndarray, ...]
    label_ids: np.ndarray | tuple[np.ndarray, ...] | None
    metrics: dict[str, float] | None
    num_samples: int | None


class PredictionOutput(NamedTuple):
    """Result of ``predict()``.

    Attributes:
        predictions: Gathered predictions.
        label_ids: Gathered labels, or None when the dataset has none.
        metrics: Metrics with the ``test_`` (or custom) prefix, or None.
    """

    predictions: np.ndarray | tuple[np.ndarray, ...]
    label_ids: np.ndarray | tuple[np.ndarray, ...] | None
    metrics: dict[str, float] | None


class TrainOutput(NamedTuple):
    """Result of ``train()``.

    Attributes:
        global_step: Optimizer steps taken.
        training_loss: Mean training loss over the run.
        metrics: Final training metrics (``train_runtime``, ``train_loss``, ...).
    """

    global_step: int
    training_loss: float
    metrics: dict[str, float]


def speed_metrics(
    split: str,
    start_time: float,
    num_samples: int | None = None,
    num_steps: int | None = None,
    num_tokens: int | None = None,
) -> dict[str, float]:
    """Measure the runtime since ``start_time`` and the matching throughputs.

    Call it right after the measured work. The runtime is rounded to 4 decimals and the rates to 3; rates are
    left out when their count is None, or all of them when the runtime is exactly 0.

    Args:
        split: Key prefix, e.g. ``"train"``, ``"eval"``, ``"test"``.
        start_time: ``time.time()`` taken before the work started.
        num_samples: Samples processed, for ``{split}_samples_per_second``.
        num_steps: Steps processed, for ``{split}_steps_per_second``.
        num_tokens: Tokens processed, for ``{split}_tokens_per_second``.

    Returns:
        ``{split}_runtime`` and the available ``{split}_*_per_second`` values.
    """
    runtime = time.time() - start_time
    result = {f"{split}_runtime": round(runtime, 4)}
    if runtime == 0:
        return result
    for name, count in (("samples", num_samples), ("steps", num_steps), ("tokens", num_tokens)):
        if count is not None:
            result[f"{split}_{name}_per_second"] = round(count / runtime, 3)
    return result


def denumpify_detensorize(metrics: Any) -> Any:
    """Turn numpy scalars and one-element tensors into Python numbers, recursively through lists, tuples and dicts.

    Containers keep their type (named tuples included); other values are returned unchanged.

    Args:
        metrics: A value or a nested structure of values.

    Returns:
        The same structure with plain Python numbers.
    """
    if isinstance(metrics, dict):
        return type(metrics)({key: denumpify_detensorize(value) for key, value in metrics.items()})
    if isinstance(metrics, (list, tuple)):
        items = [denumpify_detensorize(item) for item in metrics]
        if isinstance(metrics, tuple) and hasattr(metrics, "_fields"):
            return type(metrics)(*items)
        return type(metrics)(items)
    if isinstance(metrics, np.generic):
        return metrics.item()
    if isinstance(metrics, torch.Tensor) and metrics.numel() == 1:
        return metrics.item()
    return metrics
