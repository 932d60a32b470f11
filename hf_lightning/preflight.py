"""Checks run once before the first training step, so a mistake fails in seconds and not after hours.

HF's Trainer finds many mistakes only when it trips over them: a negative learning rate when the optimizer is
built, a collator returning lists at the first forward, an unwritable ``output_dir`` at the first save, a
``metric_for_best_model`` that ``compute_metrics`` never returns at the first evaluation, and some never
(``label_smoothing_factor=1.5``, ``label_names`` absent from the batch, NaN in the data). :func:`run_preflight`
finds them before any step, names the argument / column / path the user wrote and says what to change.

It is called once per ``fit`` from ``HFLightningModule.setup("fit")``, so the HF-style facade and the
Lightning-native path get the same checks. It never changes what training computes: the one batch it collates
(and, for ``metric_for_best_model``, the one evaluation batch it runs) leave the global RNGs, the model's
train/eval mode and the collator's own state as they were, so the numbers stay identical to HF's.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import os
import random
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hf_lightning import _compat
from hf_lightning._utils import enum_value, has_len, unwrap_model
from hf_lightning.args.validation import check_trainable, evaluates_during_training
from hf_lightning.checkpointing.writer import is_saving_process
from hf_lightning.evaluation import metric_key
from hf_lightning.optim.packaged import check_optimizer_package

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments

__all__ = [
    "check_eval_datasets",
    "check_metric_for_best_model",
    "check_model",
    "check_output_dir",
    "check_train_batch",
    "run_preflight",
]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------------
# Output folder
# ---------------------------------------------------------------------------------------------------------------


def check_output_dir(output_dir: str | os.PathLike) -> None:
    """Make sure checkpoints can be written to ``output_dir``: it is (or can become) a writable folder.

    Nothing is created: a missing folder is checked through its nearest existing parent; an existing one gets a
    probe file that is removed again.

    Args:
        output_dir: ``TrainingArguments.output_dir``.

    Raises:
        NotADirectoryError: ``output_dir`` (or one of its parents) is a file.
        PermissionError: The folder (or the parent it would be created in) is not writable.
    """
    path = os.fspath(output_dir)
    existing = path
    while existing and not os.path.exists(existing):
        parent = os.path.dirname(existing.rstrip(os.sep))
        if parent == existing:
            break
        existing = parent or "."
    if not os.path.isdir(existing):
        where = "is a file" if existing == path else f"lies under {existing!r}, which is a file"
        raise NotADirectoryError(
            f"TrainingArguments.output_dir={path!r} {where}, not a folder: checkpoints are written into it. "
            "Pass the path of a folder (it is created when missing)."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(
            f"TrainingArguments.output_dir={path!r} is not writable ({existing!r} refuses new files): the first "
            "checkpoint would fail. Choose a writable output_dir or fix the folder's permissions."
        )
    if existing != path:
        return
    try:
        fd, probe = tempfile.mkstemp(prefix=".hfl-write-probe-", dir=path)
    except OSError as err:
        raise PermissionError(
            f"TrainingArguments.output_dir={path!r} is not writable ({err.strerror or err}): the first checkpoint "
            "would fail. Choose a writable output_dir or fix the folder's permissions."
        ) from None
    os.close(fd)
    os.remove(probe)


# ---------------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------------


def check_model(model: torch.nn.Module, optimizer_given: bool = False) -> None:
    """Refuse a model the optimizer would have nothing to update in.

    Args:
        model: The model to train.
        optimizer_given: The user passed an optimizer (its parameter list is theirs to choose).

    Raises:
        ValueError: No parameter has ``requires_grad=True`` and the optimizer is built from the arguments.
    """
    if optimizer_given:
        return
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            f"{type(model).__name__} has no trainable parameter (every parameter has requires_grad=False), so "
            "training would change nothing. Unfreeze the parameters to train (param.requires_grad_(True)) or "
            "attach trainable adapters."
        )


# ---------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------


def check_eval_datasets(args: TrainingArguments, eval_dataset: Any) -> None:
    """Refuse evaluation data that is missing or empty when training evaluates.

    Args:
        args: A ``TrainingArguments``.
        eval_dataset: A dataset or a dict ``name -> dataset`` (``None`` when there is none).

    Raises:
        ValueError: Evaluation runs during training but there is no eval dataset, the dict is empty, or a
            dataset (named by its key) has no rows.
    """
    if not evaluates_during_training(args):
        return
    if eval_dataset is None:
        raise ValueError(
            f"TrainingArguments.eval_strategy={enum_value(args.eval_strategy)!r} (or eval_on_start) evaluates during "
            "training, but no eval_dataset was given. Pass an eval_dataset or set eval_strategy='no'."
        )
    if isinstance(eval_dataset, Mapping):
        if not eval_dataset:
            raise ValueError(
                "eval_dataset is an empty dict: there is nothing to evaluate on. Give it at least one "
                "`name: dataset` entry, or set eval_strategy='no'."
            )
        named = [(f"eval_dataset[{name!r}]", dataset) for name, dataset in eval_dataset.items()]
    else:
        named = [("eval_dataset", eval_dataset)]
    for label, dataset in named:
        if dataset is None:
            raise ValueError(f"{label} is None. Pass a dataset there, or remove the entry.")
        if has_len(dataset) and len(dataset) == 0:
            raise ValueError(
                f"{label} is empty (0 rows): its evaluation metrics would be undefined. Pass a non-empty dataset, "
                "or remove it."
            )


@contextlib.contextmanager
def _rng_untouched() -> Iterator[None]:
    """Leave Python's, NumPy's and torch's generators exactly as they were, whatever runs inside."""
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def _collate_rows(dataset: Any, collate_fn: Callable, batch_size: int, spread: bool = False,
                  shared: Sequence[Any] = ()) -> Any:
    """Collate ``batch_size`` rows with a copy of the collator (its own state, e.g. a seeded generator, must not
    advance): the first rows, or rows spread evenly over the dataset. Objects in ``shared`` (the model, which
    ``DataCollatorForSeq2Seq(model=...)`` holds) are referenced by the copy, not copied. ``None`` when the dataset
    cannot be indexed or the collator not copied."""
    if dataset is None or isinstance(dataset, torch.utils.data.IterableDataset) or not has_len(dataset):
        # Iterating a stream could consume it; its first batch is checked by the first step instead.
        return None
    size = min(batch_size, len(dataset))
    if size == 0:
        return None
    try:
        collate = copy.deepcopy(collate_fn, memo={id(obj): obj for obj in shared})
    except Exception:  # noqa: BLE001 - an uncopyable collator only means this check is skipped
        logger.debug("Pre-training batch check skipped: the data collator cannot be copied.")
        return None
    if spread and size > 1:
        # Evenly spaced rows: an eval set sorted by label still shows several labels to compute_metrics.
        indices = sorted({round(i * (len(dataset) - 1) / (size - 1)) for i in range(size)})
    else:
        indices = list(range(size))
    return collate([dataset[i] for i in indices])


def _forward_parameters(model: torch.nn.Module) -> tuple[list[str], bool]:
    from hf_lightning.data.columns import unwrap_peft_model

    inner = unwrap_peft_model(unwrap_model(model))
    parameters = inspect.signature(inner.forward).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return list(parameters), takes_any


def _describe_non_tensor(value: Any) -> str | None:
    """Say what is wrong with a batch value the model cannot take, or ``None`` when it is fine."""
    if isinstance(value, np.ndarray):
        return "a numpy array"
    if isinstance(value, (list, tuple)):
        leaves = [v for v in value if not isinstance(v, torch.Tensor)]
        numeric = [v for v in leaves if isinstance(v, (int, float, list, tuple, np.ndarray, np.generic))]
        if numeric:
            return f"a {type(value).__name__} of {type(numeric[0]).__name__}"
    return None


def _non_finite(key: str, value: Any, label_names: Sequence[str]) -> str | None:
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return None
    if torch.isnan(value).any():
        return "NaN"
    # Float masks legitimately hold -inf; labels never do.
    if key in label_names and torch.isinf(value).any():
        return "inf"
    return None


def check_train_batch(
    batch: Any,
    model: torch.nn.Module,
    args: TrainingArguments,
    label_names: Sequence[str],
    dataset_columns: Sequence[str] | None = None,
) -> None:
    """Check one collated training batch against what the model's ``forward`` takes.

    Args:
        batch: The data collator's output for the first rows of ``train_dataset``.
        model: The model being trained.
        args: A ``TrainingArguments`` (``label_names``, ``remove_unused_columns``, ``logging_nan_inf_filter``).
        label_names: The label names in use (``args.label_names`` or the model's own).
        dataset_columns: The columns of the first row, for the messages.

    Raises:
        ValueError: The batch is not a dict; a value is a list / numpy array instead of a tensor; a key is no
            argument of ``forward`` (which takes no ``**kwargs``); the batch is empty; a name in
            ``args.label_names`` is missing; a float value holds NaN (or a label inf).
    """
    if not isinstance(batch, Mapping):
        raise ValueError(
            f"The data collator returned a {type(batch).__name__}; the model is called as model(**batch), so it "
            "must return a dict of tensors keyed by the model's forward argument names. Fix `data_collator`."
        )
    parameters, takes_any = _forward_parameters(model)
    model_name = type(unwrap_model(model)).__name__
    if not batch:
        columns = ", ".join(dataset_columns or []) or "none"
        raise ValueError(
            f"The batch received was empty: none of the train_dataset's columns ({columns}) is an argument of "
            f"{model_name}.forward ({', '.join(parameters)}), so remove_unused_columns dropped them all. Rename the "
            "columns to the model's argument names, or set remove_unused_columns=False with a data_collator that "
            "builds the model's inputs."
        )
    for key, value in batch.items():
        problem = _describe_non_tensor(value)
        if problem is not None:
            raise ValueError(
                f"The data collator returned column {key!r} as {problem}, not a torch.Tensor: the model cannot take "
                "it. Make `data_collator` return tensors (e.g. torch.tensor(...)), or use default_data_collator / "
                "DataCollatorWithPadding."
            )
    unexpected = [key for key in batch if key not in parameters]
    if unexpected and not takes_any:
        hint = (
            "set remove_unused_columns=True to drop them"
            if not args.remove_unused_columns
            else "make the data_collator stop adding them"
        )
        raise ValueError(
            f"Column(s) {unexpected} of the training batch are not arguments of {model_name}.forward "
            f"({', '.join(parameters)}), so the first step would fail. Rename or drop them, or {hint}."
        )
    explicit = list(args.label_names or [])
    missing = [name for name in explicit if name not in batch]
    if missing:
        raise ValueError(
            f"TrainingArguments.label_names={explicit} but the training batch has no {missing} (it has "
            f"{list(batch)}): the loss and the evaluation labels would silently be wrong. Set label_names to the "
            "batch's label keys, or rename the dataset's label column."
        )
    for key, value in batch.items():
        kind = _non_finite(key, value, label_names)
        if kind is not None:
            filtered = (
                "logging_nan_inf_filter=True would hide it from the logged loss while the weights turn NaN"
                if args.logging_nan_inf_filter
                else "every logged loss would be NaN"
            )
            raise ValueError(
                f"Column {key!r} of the first training batch holds {kind} values: the loss and the gradients "
                f"would be {kind} from the first step ({filtered}). Clean the data in train_dataset's {key!r} "
                "column (or the data_collator)."
            )


# ---------------------------------------------------------------------------------------------------------------
# metric_for_best_model
# ---------------------------------------------------------------------------------------------------------------


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def _one_batch_metrics(module: Any, dataset: Any, loader: Any, prefix: str) -> dict[str, Any]:
    from hf_lightning.evaluation import EvalAccumulator, find_batch_size

    args = module.args
    batch = _collate_rows(getattr(loader, "dataset", dataset), loader.collate_fn, int(args.eval_batch_size),
                          spread=True, shared=(module.model,))
    if not isinstance(batch, Mapping):
        return {}
    model = module.model
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    batch = _to_device(dict(batch), device)
    was_training = model.training
    model.eval()
    try:
        # The override a Trainer subclass gives (Seq2SeqTrainer generates), as evaluation will call it.
        loss, logits, labels = module.hooks.prediction_step(
            model, dict(batch), False, ignore_keys=module.eval_request.ignore_keys
        )
    except Exception as err:  # noqa: BLE001 - a failure here may be the check's own context; evaluation will tell
        logger.debug("metric_for_best_model check skipped: prediction_step failed before training (%s).", err)
        return {}
    finally:
        model.train(was_training)
    accumulator = EvalAccumulator(
        args,
        module.compute_metrics,
        module.preprocess_logits_for_metrics,
        keep_predictions=False,
        metrics=module.metrics.clone() if module.metrics is not None else None,
    )
    try:
        accumulator.add(loss, logits, labels, find_batch_size(batch) or 1, raw_inputs=batch, is_last=True)
        return accumulator.finalize(prefix)[2]
    except Exception as err:
        raise RuntimeError(
            f"compute_metrics raised {type(err).__name__}: {err} — called before training on "
            f"{find_batch_size(batch) or 1} rows spread over the evaluation data, to check that it returns "
            f"metric_for_best_model={args.metric_for_best_model!r}. Fix compute_metrics (it must work on any "
            "subset of the evaluation data)."
        ) from err


def check_metric_for_best_model(module: Any, datamodule: Any) -> None:
    """Make sure evaluation will report ``metric_for_best_model``, before the first step instead of at the first
    evaluation.

    With ``compute_metrics`` (or streaming ``metrics``) and a metric other than the loss, one batch of each eval
    dataset — ``eval_batch_size`` rows spread evenly over it — is evaluated through ``prediction_step`` (model in
    eval mode, no gradients, RNGs untouched) and the keys are checked; this calls ``compute_metrics`` once more
    than HF does. Without either, only ``eval_loss`` (``eval_<name>_loss``) exists. When the batch cannot be
    built or ``prediction_step`` fails here, the check is skipped (the first evaluation will tell).

    Args:
        module: The ``HFLightningModule``.
        datamodule: The ``HFDataModule``.

    Raises:
        KeyError: The metric is not among the keys evaluation reports (HF's exception type).
        RuntimeError: ``compute_metrics`` raised on the batch.
    """
    args = module.args
    metric = args.metric_for_best_model
    if metric is None or not evaluates_during_training(args):
        return
    key = metric_key(metric)
    names = list(getattr(datamodule, "eval_names", []) or [])
    datasets = list(datamodule.eval_datasets()) if hasattr(datamodule, "eval_datasets") else []
    prefixes = ["eval" if name is None else f"eval_{name}" for name in names]
    if key in {f"{prefix}_loss" for prefix in prefixes}:
        return
    if module.compute_metrics is None and module.metrics is None:
        available = [f"{prefix}_loss" for prefix in prefixes]
    else:
        available = []
        for prefix, dataset in zip(prefixes, datasets):
            metrics = _one_batch_metrics(module, dataset, datamodule.eval_loader(dataset), prefix)
            if not metrics:
                return  # an unindexable dataset: the first evaluation will tell
            available.extend(metrics)
    if key not in available:
        raise KeyError(
            f"TrainingArguments.metric_for_best_model={metric!r} looks for {key!r}, which evaluation does not "
            f"report: it reports {sorted(set(available))} (checked before training). Make compute_metrics return "
            f"{key.removeprefix('eval_')!r} or set metric_for_best_model to one of those."
        )


# ---------------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------------


def run_preflight(module: Any, datamodule: Any) -> None:
    """Run every check before training starts; called once per ``fit`` by ``HFLightningModule.setup("fit")``.

    Order: arguments, ``output_dir`` (on the processes that save, when checkpoints are saved), the model, the package
    ``optim`` needs (when the optimizer is built from the arguments), the eval
    datasets, one collated training batch, ``metric_for_best_model``. Global RNG states are preserved.

    Args:
        module: The ``HFLightningModule`` (its ``args``, ``model``, ``label_names``, ``trainer``).
        datamodule: The ``HFDataModule`` (already bound to the model).

    Raises:
        ValueError / KeyError / RuntimeError / OSError: see the ``check_*`` functions; each names the argument,
            column or path to change.
    """
    args = module.args
    check_trainable(args)
    trainer = _compat.attached_trainer(module)
    saves_here = trainer is None or is_saving_process(args, trainer.global_rank, trainer.local_rank)
    if enum_value(args.save_strategy) != "no" and saves_here:
        check_output_dir(args.output_dir)
    check_model(module.model, optimizer_given=module.given_optimizer is not None)
    if module.given_optimizer is None and module.optimizer_cls_and_kwargs is None:
        check_optimizer_package(args)
    check_eval_datasets(args, getattr(datamodule, "eval_dataset", None))
    loader = datamodule.train_loader()
    dataset = getattr(loader, "dataset", None)
    collate_fn = getattr(loader, "collate_fn", None)
    with _rng_untouched():
        if collate_fn is not None:
            batch = _collate_rows(dataset, collate_fn, int(args.train_batch_size), shared=(module.model,))
            if batch is not None:
                first = dataset[0] if has_len(dataset) and len(dataset) else None
                columns = list(first) if isinstance(first, Mapping) else None
                check_train_batch(batch, module.model, args, module.label_names, columns)
        check_metric_for_best_model(module, datamodule)
