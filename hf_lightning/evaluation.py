"""Evaluation bookkeeping: what HF's ``evaluation_loop`` gathers per batch and how it turns into metrics.

Pure torch/numpy; the Lightning module feeds it one ``prediction_step`` result per batch and reads the
metrics back. Rules follow HF 5.x (reference §8.2): the batch loss is repeated once per sample so ``eval_loss``
is the sample-weighted mean, tensors of different sequence lengths are concatenated with ``-100`` padding on
dim 1, ``compute_metrics`` receives numpy arrays in an ``EvalPrediction``, and every metric key is prefixed.

Beyond HF, streaming ``torchmetrics`` metrics are updated per batch on the model's device and computed once at
the end (torchmetrics syncs them across processes); without ``compute_metrics`` nothing else is kept, so
evaluation memory does not grow with the eval set. Under several processes each one evaluates its own share of the
set and the results are exchanged batch by batch (:mod:`hf_lightning.eval_gather`), so every process ends with the
one-process results in dataset order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torchmetrics import Metric, MetricCollection

from hf_lightning.outputs import EvalPrediction, denumpify_detensorize, speed_metrics

if TYPE_CHECKING:
    from hf_lightning.eval_gather import ShardGather

PAD_INDEX = -100


class EvalRequest:
    """What the caller of an evaluation asked for (HF's ``evaluate`` / ``predict`` arguments the step needs).

    Args:
        prediction_loss_only: ``None`` defers to the module (loss only when nothing consumes predictions).
        ignore_keys: output keys left out of the predictions.
        keep_predictions: gather predictions/labels even when no metric needs them (``predict()``); ``None``
            lets the loop decide (Lightning's test loop keeps them, the validation loop does not).
        full_batch_loss_weight: repeat every batch loss ``eval_batch_size`` times, the last partial batch's too
            (HF's ``Seq2SeqTrainer`` gathers losses without dropping the surplus copies), instead of once per sample.
    """

    def __init__(self, prediction_loss_only: bool | None = None, ignore_keys: list[str] | None = None,
                 keep_predictions: bool | None = None, full_batch_loss_weight: bool = False) -> None:
        self.prediction_loss_only = prediction_loss_only
        self.ignore_keys = ignore_keys
        self.keep_predictions = keep_predictions
        self.full_batch_loss_weight = full_batch_loss_weight


def as_metric_collection(metrics: Any) -> MetricCollection | None:
    """Normalise a ``metrics=`` argument into a ``MetricCollection`` (or ``None``).

    Args:
        metrics: a torchmetrics ``Metric`` (keyed by its class name, torchmetrics' own rule), a
            ``MetricCollection``, a dict ``name -> Metric``, or ``None``.

    Returns:
        The collection (the same object when one was given), or ``None``.

    Raises:
        TypeError: for anything else, pointing plain functions to ``compute_metrics``.

    Example:
        >>> from torchmetrics.classification import MulticlassAccuracy
        >>> list(as_metric_collection({"accuracy": MulticlassAccuracy(num_classes=3)}).keys())
        ['accuracy']
    """
    if metrics is None or isinstance(metrics, MetricCollection):
        return metrics
    if isinstance(metrics, Metric):
        return MetricCollection([metrics])
    if isinstance(metrics, Mapping) and all(isinstance(m, (Metric, MetricCollection)) for m in metrics.values()):
        return MetricCollection(dict(metrics))
    raise TypeError(
        f"`metrics` must be a torchmetrics Metric, a MetricCollection or a dict name -> Metric; got "
        f"{type(metrics).__name__}. Use compute_metrics= for a plain function."
    )


def streaming_update_args(logits: Any, labels: Any, preprocessed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(preds, target)`` for ``Metric.update`` from one batch's logits and labels.

    Float logits with a class dimension (2 dims or more) become class ids, the argmax over the last dim, unless
    ``preprocess_logits_for_metrics`` already produced the predictions; anything else (one value per sample,
    integer predictions) is passed as it is.

    Args:
        logits: the batch's logits, after ``preprocess_logits_for_metrics`` when one is given.
        labels: the batch's labels.
        preprocessed: whether ``preprocess_logits_for_metrics`` ran.

    Returns:
        ``(preds, target)`` on the device they came from.

    Raises:
        ValueError: when the model gives several outputs or label tensors (question answering, extra outputs):
            streaming metrics take one prediction tensor and one label tensor per batch.
    """
    if isinstance(logits, (tuple, list)) or isinstance(labels, (tuple, list)):
        raise ValueError(
            "Streaming `metrics` need one prediction tensor and one label tensor per batch, but this model gives "
            f"{len(logits) if isinstance(logits, (tuple, list)) else 1} output(s) and "
            f"{len(labels) if isinstance(labels, (tuple, list)) else 1} label tensor(s). Pass "
            "`preprocess_logits_for_metrics` returning one tensor, set `label_names` to one label, or use "
            "`compute_metrics`."
        )
    if not preprocessed and logits.is_floating_point() and logits.dim() >= 2:
        logits = logits.argmax(dim=-1)
    return logits, labels


def _metric_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.detach().cpu().tolist()
    return value


def _pad_and_cat(a: torch.Tensor, b: torch.Tensor, padding_index: int = PAD_INDEX) -> torch.Tensor:
    """Concatenate on dim 0, padding dim 1 with ``padding_index`` when the lengths differ."""
    # HF treats a 0-dim batch output (a scalar per batch) as one row.
    a, b = torch.atleast_1d(a), torch.atleast_1d(b)
    if a.dim() < 2 or a.shape[1] == b.shape[1]:
        return torch.cat((a, b), dim=0)
    new_shape = (a.shape[0] + b.shape[0], max(a.shape[1], b.shape[1])) + tuple(a.shape[2:])
    out = a.new_full(new_shape, padding_index)
    out[: a.shape[0], : a.shape[1]] = a
    out[a.shape[0]:, : b.shape[1]] = b
    return out


def nested_concat(a: Any, b: Any, padding_index: int = PAD_INDEX) -> Any:
    """Concatenate two (possibly nested tuple/list/dict) tensors along dim 0 with HF's padding rule."""
    if isinstance(a, (list, tuple)):
        return type(a)(nested_concat(x, y, padding_index) for x, y in zip(a, b))
    if isinstance(a, Mapping):
        return type(a)({k: nested_concat(v, b[k], padding_index) for k, v in a.items()})
    return _pad_and_cat(a, b, padding_index)


def nested_concat_all(values: list, padding_index: int = PAD_INDEX) -> Any:
    """Concatenate a list of (nested) batch tensors at once: the result of folding :func:`nested_concat` over
    the list (dim 1 padded with ``padding_index`` to the longest), with each batch copied only once."""
    first = values[0]
    if len(values) == 1:
        return first
    if isinstance(first, (list, tuple)):
        return type(first)(nested_concat_all([v[i] for v in values], padding_index) for i in range(len(first)))
    if isinstance(first, Mapping):
        return type(first)({k: nested_concat_all([v[k] for v in values], padding_index) for k in first})
    values = [torch.atleast_1d(v) for v in values]
    first = values[0]
    if first.dim() < 2 or all(v.shape[1] == first.shape[1] for v in values):
        return torch.cat(values, dim=0)
    longest = max(v.shape[1] for v in values)
    out = first.new_full((sum(v.shape[0] for v in values), longest) + tuple(first.shape[2:]), padding_index)
    row = 0
    for v in values:
        out[row: row + v.shape[0], : v.shape[1]] = v
        row += v.shape[0]
    return out


def nested_numpify(t: Any) -> Any:
    """Tensors (nested) → numpy arrays on CPU; bf16 goes through float32 as numpy has no bf16."""
    if isinstance(t, (list, tuple)):
        return type(t)(nested_numpify(x) for x in t)
    if isinstance(t, Mapping):
        return type(t)({k: nested_numpify(v) for k, v in t.items()})
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.to(torch.float32)
    return t.numpy()


def nested_detach(t: Any) -> Any:
    if isinstance(t, (list, tuple)):
        return type(t)(nested_detach(x) for x in t)
    if isinstance(t, Mapping):
        return type(t)({k: nested_detach(v) for k, v in t.items()})
    return t.detach() if isinstance(t, torch.Tensor) else t


# Batches joined into one chunk while gathering (see _Container).
_CHUNK_BATCHES = 32


class _Container:
    """Accumulates nested tensors across batches; moves them to numpy every ``eval_accumulation_steps``.

    Gives HF's concatenate-as-you-go result, but batches are joined in chunks of ``_CHUNK_BATCHES`` and the chunks
    once at the end, so each value is copied about twice in all instead of at every later batch (HF's pairwise
    concatenation is quadratic in the number of batches).
    """

    def __init__(self, do_concat: bool = True) -> None:
        self.do_concat = do_concat
        self.tensors: list | None = None
        self.arrays: Any = None
        self._pending = 0

    def add(self, value: Any) -> None:
        if value is None:
            return
        if self.tensors is None:
            self.tensors, self._pending = [], 0
        self.tensors.append(value)
        self._pending += 1
        if self.do_concat and self._pending == _CHUNK_BATCHES:
            # Joining soon frees each batch's own tensors while their memory is still warm for the next batches.
            self.tensors[-_CHUNK_BATCHES:] = [nested_concat_all(self.tensors[-_CHUNK_BATCHES:])]
            self._pending = 0

    def to_numpy(self) -> None:
        if self.tensors is None:
            return
        new = nested_numpify(nested_concat_all(self.tensors) if self.do_concat else self.tensors)
        if self.arrays is None:
            self.arrays = new
        elif self.do_concat:
            self.arrays = _np_nested_concat(self.arrays, new)
        else:
            self.arrays.extend(new)
        self.tensors = None

    def get(self) -> Any:
        self.to_numpy()
        return self.arrays


def _np_nested_concat(a: Any, b: Any) -> Any:
    if isinstance(a, (list, tuple)):
        return type(a)(_np_nested_concat(x, y) for x, y in zip(a, b))
    if isinstance(a, Mapping):
        return type(a)({k: _np_nested_concat(v, b[k]) for k, v in a.items()})
    a, b = np.atleast_1d(a), np.atleast_1d(b)
    if a.ndim < 2 or a.shape[1] == b.shape[1]:
        return np.concatenate((a, b), axis=0)
    shape = (a.shape[0] + b.shape[0], max(a.shape[1], b.shape[1])) + a.shape[2:]
    out = np.full(shape, PAD_INDEX, dtype=a.dtype)
    out[: a.shape[0], : a.shape[1]] = a
    out[a.shape[0]:, : b.shape[1]] = b
    return out


class _StepResult:
    """What one evaluation step keeps of one process's batch (``None`` for what is not kept)."""

    __slots__ = ("losses", "preds", "labels", "inputs", "raw_inputs")

    def __init__(self, losses: Any = None, preds: Any = None, labels: Any = None, inputs: Any = None,
                 raw_inputs: Any = None) -> None:
        self.losses, self.preds, self.labels, self.inputs = losses, preds, labels, inputs
        self.raw_inputs = raw_inputs

    def as_dict(self) -> dict[str, Any]:
        """The tensors to exchange between processes (of the raw batch, its tensors only)."""
        raw = self.raw_inputs
        if isinstance(raw, Mapping):
            raw = {k: v for k, v in raw.items() if isinstance(v, torch.Tensor)}
        return {"losses": self.losses, "preds": self.preds, "labels": self.labels, "inputs": self.inputs,
                "raw_inputs": raw}


class _Parts:
    """The containers of one process's results (or of the only process)."""

    def __init__(self, do_concat: bool) -> None:
        self.do_concat = do_concat
        self.losses = _Container(do_concat)
        self.preds = _Container(do_concat)
        self.labels = _Container(do_concat)
        self.inputs = _Container(do_concat)

    def to_numpy(self) -> None:
        for container in (self.losses, self.preds, self.labels, self.inputs):
            container.to_numpy()


class EvalAccumulator:
    """Everything one evaluation pass over one dataset gathers.

    Args:
        args: ``TrainingArguments``-like (``eval_do_concat_batches``, ``eval_accumulation_steps``,
            ``include_for_metrics``, ``batch_eval_metrics``, ``logging_nan_inf_filter``).
        compute_metrics: the user's ``compute_metrics`` or ``None``.
        preprocess_logits_for_metrics: applied to logits per batch before they are kept or streamed.
        keep_predictions: keep logits/labels even when no ``compute_metrics`` needs them (``predict()`` does).
        metrics: streaming ``torchmetrics`` metrics owned by this pass (see :func:`as_metric_collection`; updated
            in place, so pass a fresh clone).
        gather: when each process evaluates its own share of the set, the exchange that brings every process's
            results to all of them after each batch (see :mod:`hf_lightning.eval_gather`); ``None`` keeps this
            process's results only.
        batch_ids: with ``gather``, the one-process batch each process's batches belong to (from
            :meth:`~hf_lightning.data.samplers.EvalShardBatchSampler.batch_ids`); with
            ``eval_do_concat_batches=False`` the parts of a batch split between two processes are joined again.
    """

    def __init__(self, args, compute_metrics: Callable | None = None,
                 preprocess_logits_for_metrics: Callable | None = None, keep_predictions: bool = False,
                 metrics: Metric | MetricCollection | Mapping[str, Metric] | None = None,
                 gather: ShardGather | None = None, batch_ids: Sequence[Sequence[int]] | None = None) -> None:
        concat = getattr(args, "eval_do_concat_batches", True)
        self.args = args
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.batch_eval_metrics = bool(getattr(args, "batch_eval_metrics", False))
        # HF gathers for compute_metrics (unless it runs per batch) and for predict(); streaming metrics alone
        # keep nothing, which is what bounds their memory.
        self.keep_predictions = keep_predictions or (compute_metrics is not None and not self.batch_eval_metrics)
        self.metrics = as_metric_collection(metrics)
        self.metric_updates = 0
        self.gather = gather
        self.batch_ids = batch_ids
        # One set of containers per process whose results are kept: this one, or every one when sharded.
        self.parts = [_Parts(concat) for _ in range(gather.world_size if gather is not None else 1)]
        # Sharded: each batch's loss and size per process (a batch split between two processes has two parts).
        self._batch_losses: dict[int, list[tuple[torch.Tensor, int]]] = {}
        self._loss_repeats: int | None = None
        self.batch_metrics: dict | None = None
        self.observed = 0
        self.steps = 0

    # This process's containers (the first process's when sharded).
    losses = property(lambda self: self.parts[0].losses)
    preds = property(lambda self: self.parts[0].preds)
    labels = property(lambda self: self.parts[0].labels)
    inputs = property(lambda self: self.parts[0].inputs)

    def add(self, loss: torch.Tensor | None, logits: Any, labels: Any, batch_size: int,
            inputs_for_metrics: Any = None, raw_inputs: Any = None, is_last: bool = False,
            loss_repeats: int | None = None, before_empty_step: Callable[[], None] | None = None) -> None:
        """Record one ``prediction_step`` result (``batch_size`` = samples in this batch; the loss is repeated
        ``loss_repeats`` times, by default once per sample).

        When sharded, every process's result for this step is gathered first (and, after this process's last
        batch, those of the steps the others still run, each preceded by ``before_empty_step``), so each process
        keeps the whole set.
        """
        losses = None
        if loss is not None:
            losses = loss.detach().reshape(1)
            if self.gather is None:
                # HF repeats the batch loss once per sample, which makes eval_loss the sample-weighted mean.
                losses = losses.repeat(loss_repeats or batch_size)
        if logits is not None and self.preprocess_logits_for_metrics is not None:
            logits = self.preprocess_logits_for_metrics(logits, labels)
        if self.metrics is not None and logits is not None and labels is not None:
            # Each process updates with its own examples; torchmetrics syncs the states when computing.
            preds, target = streaming_update_args(logits, labels, self.preprocess_logits_for_metrics is not None)
            self.metrics.update(preds, target)
            self.metric_updates += 1
        include = getattr(self.args, "include_for_metrics", []) or []
        wants_batch = self.batch_eval_metrics and self.compute_metrics is not None
        result = _StepResult(
            losses=losses,
            preds=logits if self.keep_predictions or wants_batch else None,
            labels=labels if self.keep_predictions or wants_batch else None,
            inputs=inputs_for_metrics if self.keep_predictions else None,
            raw_inputs=raw_inputs if wants_batch and "inputs" in include else None,
        )
        if self.gather is None:
            self._record([result], [batch_size], is_last)
            return
        self._loss_repeats = loss_repeats
        for values, sizes in self.gather.gather(result.as_dict(), batch_size, before_empty_step):
            results: list[_StepResult | None] = []
            for rank, (value, size) in enumerate(zip(values, sizes)):
                result = None if value is None else _StepResult(**value)
                if result is not None and result.losses is not None:
                    # Kept per batch (see _sharded_losses); repeated here for a batch-wise compute_metrics only.
                    batch_id = self.batch_ids[rank][self.steps]
                    self._batch_losses.setdefault(batch_id, []).append((result.losses.cpu(), size))
                    result.losses = result.losses.repeat(loss_repeats or size)
                results.append(result)
            self._record(results, sizes, self.gather.done)

    def _record(self, results: list[_StepResult | None], sizes: list[int], is_last: bool) -> None:
        """Keep one step's results (one per process, rank order; ``None`` where a process had no batch)."""
        self.observed += sum(sizes)
        self.steps += 1
        for part, result in zip(self.parts, results):
            if result is None:
                continue
            if self.gather is None:
                part.losses.add(result.losses)
            if self.keep_predictions:
                part.inputs.add(result.inputs)
                part.preds.add(result.preds)
                part.labels.add(result.labels)
        include = getattr(self.args, "include_for_metrics", []) or []
        present = [r for r in results if r is not None]
        if self.batch_eval_metrics and self.compute_metrics is not None \
                and present and present[0].preds is not None and present[0].labels is not None:
            def joined(name: str) -> Any:
                values = [getattr(r, name) for r in present]
                return None if values[0] is None else nested_concat_all(values)

            self.batch_metrics = self.compute_metrics(
                EvalPrediction(
                    predictions=joined("preds"),
                    label_ids=joined("labels"),
                    losses=joined("losses") if "loss" in include else None,
                    inputs=(present[0].raw_inputs if len(present) == 1 else joined("raw_inputs"))
                    if "inputs" in include else None,
                ),
                compute_result=is_last,
            )
        steps = getattr(self.args, "eval_accumulation_steps", None)
        if steps is not None and not self.batch_eval_metrics and self.steps % steps == 0:
            for part in self.parts:
                part.to_numpy()

    def _joined(self, name: str) -> Any:
        """One kind of result over the whole set, in dataset order (the processes' shares one after another)."""
        arrays = [getattr(part, name).get() for part in self.parts]
        if len(arrays) == 1:
            return arrays[0]
        arrays = [a for a in arrays if a is not None]
        if not arrays:
            return None
        if self.parts[0].do_concat:
            joined = arrays[0]
            for more in arrays[1:]:
                joined = _np_nested_concat(joined, more)
            return joined
        # Lists of batches: a one-process batch split between two processes is put back together.
        ids = [i for rank, steps in enumerate(self.gather.steps_per_rank) for i in list(self.batch_ids[rank])[:steps]]
        batches = [batch for array in arrays for batch in array]
        merged: list = []
        for index, batch in enumerate(batches):
            if merged and index < len(ids) and ids[index] == ids[index - 1]:
                merged[-1] = _np_nested_concat(merged[-1], batch)
            else:
                merged.append(batch)
        return merged

    def _sharded_losses(self) -> Any:
        """The losses over the whole set as one process keeps them: each batch's loss repeated per sample.

        A batch split between two processes is evaluated in two parts; its loss is their sample-weighted mean (the
        one-process loss when the loss is a mean over samples of equal weight, e.g. equal token counts), repeated
        for the whole batch. ``eval_loss`` is the same either way.
        """
        if not self._batch_losses:
            return None
        batches = []
        for batch_id in sorted(self._batch_losses):
            parts = self._batch_losses[batch_id]
            loss, size = parts[0]
            if len(parts) > 1:
                size = sum(n for _, n in parts)
                loss = (sum(value.double() * n for value, n in parts) / size).to(loss.dtype)
            batches.append(nested_numpify(loss.repeat(self._loss_repeats or size)))
        return np.concatenate(batches) if self.parts[0].do_concat else batches

    def finalize(self, metric_key_prefix: str = "eval", num_samples: int | None = None, compute: bool = True,
                 model_preparation_time: float | None = None) -> tuple[Any, Any, dict[str, Any], int]:
        """Return ``(predictions, label_ids, metrics, num_samples)`` as HF's ``EvalLoopOutput`` holds them.

        Metric keys come in HF's order: ``compute_metrics``' keys (then the streaming metrics') are renamed with the
        prefix and moved after ``{prefix}_loss`` and ``{prefix}_model_preparation_time``.
        """
        all_losses = self._joined("losses") if self.gather is None else self._sharded_losses()
        all_preds = self._joined("preds")
        all_labels = self._joined("labels")
        all_inputs = self._joined("inputs")
        if not num_samples:
            num_samples = self.observed
        include = getattr(self.args, "include_for_metrics", []) or []
        metrics: Any = None
        if compute and self.compute_metrics is not None and all_preds is not None and all_labels is not None \
                and not self.batch_eval_metrics:
            metrics = self.compute_metrics(
                EvalPrediction(
                    predictions=all_preds,
                    label_ids=all_labels,
                    losses=all_losses if "loss" in include else None,
                    inputs=all_inputs if "inputs" in include else None,
                )
            )
        elif self.batch_metrics is not None:
            metrics = self.batch_metrics
        metrics = denumpify_detensorize(dict(metrics or {}))
        if compute and self.metrics is not None and self.metric_updates:
            for name, value in self.metrics.compute().items():
                metrics[name] = _metric_value(value)
            self.metrics.reset()
        losses = np.concatenate(all_losses) if isinstance(all_losses, list) and all_losses else all_losses
        if isinstance(losses, np.ndarray):
            finite = np.isfinite(losses)
            if getattr(self.args, "logging_nan_inf_filter", True) and finite.any():
                losses = losses[finite]
            metrics[f"{metric_key_prefix}_loss"] = losses.mean().item()
        if model_preparation_time is not None:
            metrics[f"{metric_key_prefix}_model_preparation_time"] = model_preparation_time
        for key in list(metrics.keys()):
            if not key.startswith(f"{metric_key_prefix}_"):
                metrics[f"{metric_key_prefix}_{key}"] = metrics.pop(key)
        return all_preds, all_labels, metrics, num_samples


def dataset_prefix(metric_key_prefix: str, name: str | None) -> str:
    """The key prefix of one eval dataset: ``eval`` for a single dataset, ``eval_<name>`` for one of a dict."""
    return metric_key_prefix if name is None else f"{metric_key_prefix}_{name}"


def finish_eval_metrics(acc: EvalAccumulator | None, prefix: str, *, started: float, total_batch_size: int,
                        num_samples: int | None = None,
                        model_preparation_time: float | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """HF's end of ``evaluation_loop`` for one dataset: predictions, labels and the finished metrics dict.

    Shared by every evaluation: during training, a plain ``lightning.Trainer.validate`` and the facade's
    ``evaluate()`` / ``predict()``, so their keys come out alike and in HF's order (``{prefix}_loss``,
    ``{prefix}_model_preparation_time``, the metrics, ``{prefix}_runtime``, ``{prefix}_samples_per_second``,
    ``{prefix}_steps_per_second``).

    Args:
        acc: the dataset's accumulator, or ``None`` when no batch was evaluated.
        prefix: the key prefix (see :func:`dataset_prefix`).
        started: ``time.time()`` when this dataset's evaluation started.
        total_batch_size: evaluation samples per step over all processes (for ``steps_per_second``).
        num_samples: the dataset's length when known (HF counts that, not the samples seen); ``None`` counts the
            samples evaluated.
        model_preparation_time: reported once a first evaluation before training measured it (HF's quirk).

    Returns:
        ``(predictions, label_ids, metrics)``.
    """
    if acc is None:
        preds, labels, metrics, num_samples = None, None, {}, num_samples or 0
        if model_preparation_time is not None:
            metrics[f"{prefix}_model_preparation_time"] = model_preparation_time
    else:
        preds, labels, metrics, num_samples = acc.finalize(prefix, num_samples=num_samples,
                                                           model_preparation_time=model_preparation_time)
    metrics.update(speed_metrics(prefix, started, num_samples=num_samples,
                                 num_steps=math.ceil(num_samples / total_batch_size) if num_samples else 0))
    return preds, labels, metrics


def find_batch_size(inputs: Any) -> int | None:
    """The first dimension of the first tensor found in ``inputs`` (HF's rule)."""
    if isinstance(inputs, (list, tuple)):
        for t in inputs:
            found = find_batch_size(t)
            if found is not None:
                return found
    elif isinstance(inputs, Mapping):
        for value in inputs.values():
            found = find_batch_size(value)
            if found is not None:
                return found
    elif isinstance(inputs, torch.Tensor):
        return inputs.shape[0] if inputs.dim() >= 1 else None
    elif isinstance(inputs, np.ndarray):
        return inputs.shape[0] if inputs.ndim >= 1 else None
    return None


def metric_key(metric_for_best_model: str) -> str:
    """The metrics key of ``metric_for_best_model`` (HF prefixes ``eval_`` unless it is there already)."""
    return metric_for_best_model if metric_for_best_model.startswith("eval_") else f"eval_{metric_for_best_model}"
