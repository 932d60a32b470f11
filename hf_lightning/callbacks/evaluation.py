"""Evaluation during a fit: HF's ``evaluate`` on Lightning's validation loop, its report, and what follows it.

HF evaluates at an optimizer-step boundary after logging and before saving. :class:`TrainingEvaluation` runs
Lightning's own validation loop at that moment (Lightning's trigger is switched off by ``build_lightning_trainer``)
and finishes each eval dataset's metrics as soon as its last batch is evaluated (``on_log`` / ``on_evaluate`` in
HF's order). It also reports a plain ``lightning.Trainer.validate``. After an in-training evaluation HF steps a
plateau scheduler on ``metric_for_best_model`` (:func:`step_metric_scheduler`) and updates the best metric
(:func:`update_best_metric`).

The metrics themselves are finished by :func:`hf_lightning.evaluation.finish_eval_metrics`, shared with the
facade's standalone ``evaluate()`` / ``predict()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import numpy as np

from hf_lightning import _compat
from hf_lightning._utils import enum_value, has_len
from hf_lightning.callbacks.events import HFEvents
from hf_lightning.evaluation import EvalAccumulator, EvalRequest, dataset_prefix, finish_eval_metrics, metric_key
from hf_lightning.optim import fit_optimizer_and_scheduler, is_metric_driven
from hf_lightning.state import TrainerState

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments


def update_best_metric(args: TrainingArguments, state: TrainerState, metrics: dict[str, float]) -> bool:
    """HF's ``_determine_best_metric``: record a new best ``metric_for_best_model`` in ``state``.

    Args:
        args: ``metric_for_best_model``, ``greater_is_better`` and ``save_strategy`` are read.
        state: its ``best_metric`` (and, with a saving strategy, ``best_global_step``) is updated.
        metrics: the evaluation's metrics.

    Returns:
        Whether the evaluation set a new best (always False without ``metric_for_best_model``).

    Raises:
        KeyError: ``metric_for_best_model`` is not among the metrics (the message lists them).
    """
    if args.metric_for_best_model is None:
        return False
    key = metric_key(args.metric_for_best_model)
    if key not in metrics:
        raise KeyError(
            f"The `metric_for_best_model` training argument is set to '{key}', which is not found in the "
            f"evaluation metrics. The available evaluation metrics are: {list(metrics.keys())}. Consider "
            "changing the `metric_for_best_model` via the TrainingArguments."
        )
    value = metrics[key]
    better = np.greater if args.greater_is_better else np.less
    if state.best_metric is None:
        state.best_metric = float("-inf") if args.greater_is_better else float("inf")
    if better(value, state.best_metric):
        state.best_metric = value
        if enum_value(args.save_strategy) in ("steps", "epoch", "best"):
            state.best_global_step = state.global_step
        return True
    return False


def step_metric_scheduler(trainer: pl.Trainer, metrics: dict[str, float], args: TrainingArguments) -> None:
    """Step a plateau-style scheduler (``ReduceLROnPlateau``, ``GreedyLR``) on ``metric_for_best_model``.

    Raises:
        KeyError: the scheduler needs a metric that the evaluation did not return.
    """
    _, scheduler = fit_optimizer_and_scheduler(trainer)
    if scheduler is None or not is_metric_driven(scheduler):
        return
    key = metric_key(args.metric_for_best_model)
    if key not in metrics:
        raise KeyError(
            f"The `metric_for_best_model` training argument is set to '{key}', which is not found in the "
            f"evaluation metrics. The available evaluation metrics are: {list(metrics.keys())}. Make "
            f"`compute_metrics` return '{key}' or change `metric_for_best_model`."
        )
    scheduler.step(metrics[key])


class TrainingEvaluation:
    """HF's ``evaluate()`` while a fit runs, and the report of a plain ``lightning.Trainer.validate``.

    Args:
        events: the run's state, control and callbacks (shared with the flow callback).
        log: HF's ``log`` to report metrics through (the facade's, so a subclass's override sees them).
        eval_loss_full_batch_weight: repeat every batch loss ``eval_batch_size`` times (HF's ``Seq2SeqTrainer``),
            see :class:`~hf_lightning.evaluation.EvalRequest`.

    Attributes:
        trainer / module: the fit's ``lightning.Trainer`` and ``HFLightningModule`` (set by the flow's ``setup``).
        model_preparation_time: set by the facade when its first evaluation ran before training; HF reports it
            with every evaluation from then on.
    """

    def __init__(self, events: HFEvents, log: Callable[..., None], eval_loss_full_batch_weight: bool = False) -> None:
        self.events = events
        self.log = log
        self.eval_loss_full_batch_weight = eval_loss_full_batch_weight
        self.model_preparation_time: float | None = None
        self.trainer: pl.Trainer | None = None
        self.module: Any = None
        self._validate_started = time.time()

    def report(self, metrics: dict[str, Any]) -> None:
        """Log one dataset's metrics and fire ``on_evaluate``, as HF's ``evaluate`` ends."""
        self.log(metrics)
        self.events.fire("on_evaluate", metrics=metrics)

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """HF's ``evaluate`` during training: Lightning's validation loop over the eval dataset(s).

        Each dataset is reported (``on_log``, ``on_evaluate``) as soon as its last batch has been evaluated,
        inside the loop, so a dict of datasets gives HF's event order: the first set's ``on_prediction_step``s,
        its ``on_log`` / ``on_evaluate``, then the next set's.

        Raises:
            ValueError: ``eval_dataset`` is given (only the fit's own eval datasets run inside it).
        """
        trainer, module = self.trainer, self.module
        # No gradients held while evaluating, as in HF (the module drops them lazily, see hf_training_step).
        module.release_gradients()
        if eval_dataset is not None:
            raise ValueError("Evaluating another dataset while training is not supported; pass it to "
                             "Trainer.evaluate() after train().")
        if ignore_keys is None:
            # train(ignore_keys_for_eval=...) leaves them on the module's request; HF passes them to every evaluate.
            ignore_keys = module.eval_request.ignore_keys
        wants_outputs = module.compute_metrics is not None or module.metrics is not None
        module.eval_request = EvalRequest(
            prediction_loss_only=None if wants_outputs else True, ignore_keys=ignore_keys, keep_predictions=False,
            full_batch_loss_weight=self.eval_loss_full_batch_weight,
        )
        datamodule = trainer.datamodule
        names, datasets = datamodule.eval_names, datamodule.eval_datasets()
        total_batch = self.events.args.eval_batch_size * trainer.world_size
        all_metrics: dict[str, float] = {}
        started = [time.time()]

        def finish(idx: int, acc: EvalAccumulator) -> None:
            size = len(datasets[idx]) if has_len(datasets[idx]) else None
            _, _, metrics = finish_eval_metrics(
                acc, dataset_prefix(metric_key_prefix, names[idx]), started=started[0], total_batch_size=total_batch,
                num_samples=size, model_preparation_time=self.model_preparation_time,
            )
            self.report(metrics)
            all_metrics.update(metrics)
            started[0] = time.time()

        module.eval_dataloader_end = finish
        try:
            _compat.run_validation_in_fit(trainer)
            # A last dataloader without a length is only known to be done once the loop returns.
            for idx in sorted(module.eval_accumulators):
                finish(idx, module.eval_accumulators[idx])
        finally:
            module.eval_dataloader_end = None
            module.eval_accumulators = {}
        return all_metrics

    # ------------------------------------------------------------------ plain lightning.Trainer.validate
    def start_validation(self) -> None:
        """Note when a validation loop starts (its runtime metrics count from here)."""
        self._validate_started = time.time()

    def finish_validation(self, trainer: pl.Trainer, module: Any) -> None:
        """Report a plain ``validate()`` as HF's ``evaluate()`` would, and log it through Lightning too.

        The metrics go to ``state.log_history`` / ``on_evaluate``, and through ``module.log_dict`` so that
        ``validate()`` returns them.
        """
        datamodule = getattr(trainer, "datamodule", None)
        names = datamodule.eval_names if datamodule is not None and hasattr(datamodule, "eval_names") else []
        total_batch = self.events.args.eval_batch_size * trainer.world_size
        reported: dict[str, float] = {}
        for idx, acc in sorted(module.eval_accumulators.items()):
            prefix = dataset_prefix("eval", names[idx] if idx < len(names) else None)
            _, _, metrics = finish_eval_metrics(acc, prefix, started=self._validate_started,
                                                total_batch_size=total_batch)
            self.report(metrics)
            reported.update({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})
        module.eval_accumulators = {}
        module.log_dict(reported, add_dataloader_idx=False)
