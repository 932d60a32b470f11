"""The HF-style ``Trainer`` facade: HF's constructor and methods over Lightning's loop.

It holds no training logic of its own: it assembles an :class:`~hf_lightning.module.HFLightningModule`, an
:class:`~hf_lightning.data.datamodule.HFDataModule` and the flow callback, and calls ``lightning.Trainer.fit``.
Its HF-named methods (``compute_loss``, ``training_step``, ``prediction_step``, ``create_optimizer``,
``create_scheduler``, ``log``, ``evaluate``, ``get_train_dataloader``) are what the module and the flow callback
call, so a subclass's override takes effect exactly where HF's would.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from hf_lightning._utils import has_len
from hf_lightning.args.validation import check_full_eval_precision, check_trainer_inputs
from hf_lightning.callbacks.training_flow import HFFlowCallback
from hf_lightning.checkpointing.model_state import FSDP2ModelState, is_fsdp2_model, model_state_for
from hf_lightning.checkpointing.paths import resolve_resume_checkpoint
from hf_lightning.data.collators import DataCollatorWithPadding, default_data_collator
from hf_lightning.data.datamodule import HFDataModule
from hf_lightning.data.label_smoothing import label_smoother_for
from hf_lightning.evaluation import EvalRequest, as_metric_collection, finish_eval_metrics
from hf_lightning.module import HFLightningModule
from hf_lightning.preflight import check_output_dir
from hf_lightning.seed import enable_full_determinism, set_seed, without_lightning_reseed
from hf_lightning.trainer.batch_size import EVAL_OUT_OF_MEMORY, search_batch_size, should_reduce_batch_size
from hf_lightning.trainer.build import build_lightning_trainer, quiet_lightning
from hf_lightning.trainer.memory import MemoryTracker
from hf_lightning.trainer.protected import ProtectedMembers
from hf_lightning.trainer.reporting import metrics_format, print_metrics, write_metrics
from hf_lightning.outputs import PredictionOutput, TrainOutput


class Trainer(ProtectedMembers):
    """Drop-in for ``transformers.Trainer``: same arguments, same outputs on disk, Lightning underneath.

    Args:
        model: the model to train (or use ``model_init``).
        args: ``TrainingArguments``; defaults to ``TrainingArguments(output_dir="tmp_trainer")``.
        data_collator: batches a list of features; HF's default when omitted.
        train_dataset / eval_dataset: datasets of feature dicts; ``eval_dataset`` may be a dict of datasets.
        processing_class: tokenizer / processor (default collator padding, saved with checkpoints).
        model_init: builds a fresh model for each ``train()`` call.
        compute_loss_func: ``fn(outputs, labels, num_items_in_batch=...)``.
        compute_metrics: ``fn(EvalPrediction) -> dict``.
        callbacks: HF-style ``TrainerCallback``s (classes or instances) and/or Lightning callbacks.
        optimizers: ``(optimizer, scheduler)``.
        optimizer_cls_and_kwargs: ``(cls, kwargs)`` replacing ``args.optim``.
        preprocess_logits_for_metrics: ``fn(logits, labels)`` applied per evaluation batch.
        metrics: hf_lightning only — streaming ``torchmetrics`` metrics (a ``Metric``, ``MetricCollection`` or dict
            ``name -> Metric``) updated per evaluation batch on the device, reported as ``eval_<name>`` next to
            ``compute_metrics``' keys (usable as ``metric_for_best_model``); see ``HFLightningModule``.

    Raises:
        ValueError / RuntimeError: for HF's invalid combinations, before any work.
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        args: Any = None,
        data_collator: Callable | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        model_init: Callable[[], nn.Module] | None = None,
        compute_loss_func: Callable | None = None,
        compute_metrics: Callable | None = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        optimizer_cls_and_kwargs: tuple[type, dict] | None = None,
        preprocess_logits_for_metrics: Callable | None = None,
        metrics: Any = None,
        **deprecated: Any,
    ) -> None:
        if "tokenizer" in deprecated:
            warnings.warn("`tokenizer` is deprecated; use `processing_class`.", FutureWarning, stacklevel=2)
            processing_class = processing_class or deprecated.pop("tokenizer")
        if deprecated:
            raise TypeError(f"Trainer.__init__() got unexpected keyword arguments: {sorted(deprecated)}")
        if args is None:
            from hf_lightning.args import TrainingArguments

            args = TrainingArguments(output_dir="tmp_trainer")
        self.args = args
        # HF's memory metrics (skip_memory_metrics=False) measure the construction too.
        self._memory_tracker = MemoryTracker(args.skip_memory_metrics)
        self._memory_tracker.start("init")
        if args.full_determinism:
            enable_full_determinism(args.seed)
        else:
            set_seed(args.seed)
        if model is None and model_init is None:
            raise RuntimeError("`Trainer` requires either a `model` or `model_init` argument.")
        if model is not None and model_init is not None:
            raise RuntimeError("`Trainer` requires either a `model` or `model_init` argument, but not both.")
        optimizers = optimizers if optimizers is not None else (None, None)
        if model_init is not None and (optimizers[0] is not None or optimizers[1] is not None):
            raise RuntimeError(
                "Passing `optimizers` is not allowed if `model_init` is provided: the optimizer would hold the "
                "parameters of a model that `train()` replaces. Override `create_optimizer_and_scheduler` instead."
            )
        if optimizer_cls_and_kwargs is not None and optimizers[0] is not None:
            raise RuntimeError("Passing both `optimizers` and `optimizer_cls_and_kwargs` arguments is incompatible.")
        self.model_init = model_init
        if model is None:
            model = self.call_model_init()
        self.model = model
        # HF decides once, at construction (warning there for a multi-label model); train() uses this attribute.
        self.label_smoother = label_smoother_for(args, model)
        if data_collator is None:
            # HF's default: pad through a processing class that can pad, else default_data_collator.
            can_pad = processing_class is not None and hasattr(processing_class, "pad")
            data_collator = DataCollatorWithPadding(processing_class) if can_pad else default_data_collator
        self.data_collator = data_collator
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.processing_class = processing_class
        self.compute_loss_func = compute_loss_func
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.metrics = as_metric_collection(metrics)
        self.optimizer, self.lr_scheduler = optimizers
        self._user_scheduler = optimizers[1] is not None
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        self._validate()

        hf_callbacks = [cb for cb in callbacks or [] if not _is_lightning_callback(cb)]
        self._pl_callbacks = [cb for cb in callbacks or [] if _is_lightning_callback(cb)]
        self.flow = HFFlowCallback(args, callbacks=hf_callbacks, processing_class=processing_class, hf_progress=True,
                                   data_collator=data_collator, hooks=self,
                                   eval_loss_full_batch_weight=self.eval_loss_full_batch_weight,
                                   step_end=self._call_maybe_log_save_evaluate
                                   if _overrides(self, "_maybe_log_save_evaluate") else None,
                                   write_model=self._write_checkpoint_model if _overrides(self, "_save")
                                   or _overrides(self, "save_model") else None,
                                   finish_train_metrics=functools.partial(
                                       self._memory_tracker.stop_and_update_metrics, "train"))
        self.callback_handler = self.flow.handler
        self.callback_handler.model = self.model
        self.is_in_train = False
        self._module: HFLightningModule | None = None
        self._datamodule: HFDataModule | None = None
        self._pl_trainer = None
        # HF's cache of the columns the data loaders keep (filled by _set_signature_columns_if_needed).
        self._signature_columns: list[str] | None = None
        if args.should_save and args.output_dir:
            # A clear error naming output_dir (a file, or under a file, or not writable) before anything is made.
            check_output_dir(args.output_dir)
            os.makedirs(args.output_dir, exist_ok=True)
        self.control = self.callback_handler.on_init_end(self.args, self.state, self.flow.control)
        self._memory_tracker.stop_and_update_metrics("init")

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        check_trainer_inputs(self.args, train_dataset=self.train_dataset, eval_dataset=self.eval_dataset,
                             compute_metrics=self.compute_metrics)

    # ------------------------------------------------------------------ state / callbacks
    @property
    def state(self):
        return self.flow.state

    @property
    def control(self):
        """HF's ``TrainerControl`` of the run (the flow callback's)."""
        return self.flow.control

    @control.setter
    def control(self, value) -> None:
        self.flow.control = value

    def add_callback(self, callback: Any) -> None:
        """Add an HF-style callback (class or instance) to the list."""
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback: Any) -> Any:
        """Remove a callback (class or instance) and return it."""
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback: Any) -> None:
        """Remove a callback (class or instance)."""
        self.callback_handler.remove_callback(callback)

    # ------------------------------------------------------------------ assembly
    def _build_module(self) -> HFLightningModule:
        return HFLightningModule(
            self.model,
            self.args,
            compute_loss_func=self.compute_loss_func,
            compute_metrics=self.compute_metrics,
            preprocess_logits_for_metrics=self.preprocess_logits_for_metrics,
            optimizers=(self.optimizer, self.lr_scheduler if self._user_scheduler else None),
            optimizer_cls_and_kwargs=self.optimizer_cls_and_kwargs,
            hooks=self,
            metrics=self.metrics,
            # The default training_step below goes through hf_training_step; a subclass's override may not.
            hooks_call_hf_training_step=not _overrides(self, "training_step"),
            loss_is_scaled_for_ga=self.loss_is_scaled_for_ga,
            label_smoother=self.label_smoother,
            seed=False,  # seeded in __init__, as HF's Trainer
        )

    def _build_datamodule(self, eval_dataset: Any = None, test_dataset: Any = None) -> HFDataModule:
        dm = HFDataModule(
            self.args,
            train_dataset=self.train_dataset,
            eval_dataset=eval_dataset if eval_dataset is not None else self.eval_dataset,
            test_dataset=test_dataset,
            data_collator=self.data_collator,
            processing_class=self.processing_class,
            model=self.model,
        )
        # A subclass's HF sampler hooks build the samplers (HF's get_*_dataloader call them).
        dm.set_sampler_factories(
            train=self._get_train_sampler if _overrides(self, "_get_train_sampler") else None,
            eval=self._get_eval_sampler if _overrides(self, "_get_eval_sampler") else None,
        )
        # ... and its column hooks (or columns it set itself) filter the data.
        chose_columns = _overrides(self, "_set_signature_columns_if_needed") \
            or getattr(self, "_signature_columns", None) is not None
        dm.set_column_rules(
            keep=self._columns_to_keep if chose_columns else None,
            filter_dataset=self._remove_unused_columns if _overrides(self, "_remove_unused_columns") else None,
            wrap_collator=self._get_collator_with_removed_columns
            if _overrides(self, "_get_collator_with_removed_columns") else None,
        )
        return dm

    @property
    def lightning_module(self) -> HFLightningModule:
        """The ``HFLightningModule`` this trainer uses (built on first use)."""
        if self._module is None:
            self._module = self._build_module()
        return self._module

    # ------------------------------------------------------------------ train
    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None, **kwargs: Any) -> TrainOutput:
        """Train with Lightning's loop and HF's semantics; returns HF's ``TrainOutput``."""
        if kwargs:
            raise TypeError(f"train() got unexpected keyword arguments: {sorted(kwargs)}")
        if trial is not None:
            raise ValueError("Hyper-parameter search trials are not supported by hf_lightning (`trial`).")
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        ckpt_path = resolve_resume_checkpoint(resume_from_checkpoint, self.args.output_dir)
        self._memory_tracker.start("train")
        try:
            return self._train(ckpt_path, trial, ignore_keys_for_eval)
        finally:
            # Reported with the end-of-training metrics; a failed train() stops measuring here.
            self._memory_tracker.stop("train")

    def _train(self, ckpt_path: str | None, trial: Any, ignore_keys_for_eval: list[str] | None) -> TrainOutput:
        if self.model_init is not None:
            set_seed(self.args.seed)
            self.model = self.call_model_init(trial)
            # A fresh model needs a fresh optimizer and scheduler (HF rebuilds both).
            self.optimizer, self.lr_scheduler = None, None
            self.callback_handler.model = self.model
            self._module = None
        if not self.args.auto_find_batch_size:
            return self._fit(ckpt_path, ignore_keys_for_eval)
        # HF's find_executable_batch_size: one Lightning fit per attempt; the model and optimizer are kept.
        return search_batch_size(self.args, ckpt_path, lambda: self._fit(ckpt_path, ignore_keys_for_eval),
                                 after_failure=self._undo_failed_fit)

    def _undo_failed_fit(self) -> None:
        # A failed fit never reaches the module's teardown: undo its changes to the model (hooks) here.
        if self._module is not None:
            self._module.teardown("fit")

    def _fit(self, ckpt_path: str | None, ignore_keys_for_eval: list[str] | None) -> TrainOutput:
        if not self._user_scheduler:
            self.lr_scheduler = None
        self._module = self._build_module()
        self._module.eval_request = EvalRequest(ignore_keys=ignore_keys_for_eval)
        self._datamodule = self._build_datamodule()
        if _overrides(self, "get_train_dataloader"):
            self._datamodule.set_train_loader(self.get_train_dataloader())
        self.is_in_train = True
        try:
            with quiet_lightning(), without_lightning_reseed():
                self._pl_trainer = build_lightning_trainer(self.args, self._pl_callbacks, flow=self.flow)
                self._pl_trainer.fit(self._module, datamodule=self._datamodule, ckpt_path=ckpt_path)
        finally:
            self.is_in_train = False
        return self.flow.train_output

    # ------------------------------------------------------------------ HF hooks (override points)
    def compute_loss(self, model: nn.Module, inputs: dict, return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | None = None):
        """HF's ``compute_loss``; override to change the loss."""
        return self.lightning_module.compute_loss(model, inputs, return_outputs=return_outputs,
                                                  num_items_in_batch=num_items_in_batch)

    def training_step(self, model: nn.Module, inputs: dict, num_items_in_batch: torch.Tensor | None = None):
        """HF's per-micro-batch ``training_step`` (loss, scaling, backward); returns the detached loss."""
        return self.lightning_module.hf_training_step(model, inputs, num_items_in_batch)

    def prediction_step(self, model: nn.Module, inputs: dict, prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None):
        """HF's ``prediction_step``: ``(loss, logits, labels)``."""
        return self.lightning_module.prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """Build (once) and return the optimizer, as HF's ``create_optimizer``."""
        if self.optimizer is None:
            self.optimizer = self.lightning_module.create_optimizer()
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        """Build (once per ``train()``) and return the LR scheduler, as HF's ``create_scheduler``."""
        if self.lr_scheduler is None:
            self.lr_scheduler = self.lightning_module.create_scheduler(
                num_training_steps, optimizer if optimizer is not None else self.optimizer
            )
        return self.lr_scheduler

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        """HF's combined helper."""
        self.create_optimizer()
        self.create_scheduler(num_training_steps=num_training_steps, optimizer=self.optimizer)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """HF's ``log``: adds ``epoch``, appends to ``state.log_history`` and fires ``on_log``."""
        self.flow.hf_log(logs, start_time)

    def get_train_dataloader(self):
        """The per-micro-batch train ``DataLoader`` (override to supply your own)."""
        return (self._datamodule or self._build_datamodule()).train_loader()

    def get_eval_dataloader(self, eval_dataset: Any = None):
        """The evaluation ``DataLoader``; with ``dataloader_persistent_workers`` kept per eval dataset (HF's
        ``_eval_dataloaders``) so its workers live across ``evaluate()`` calls."""
        key = self._eval_loader_key(eval_dataset)
        persistent = self.args.dataloader_persistent_workers and key is not None
        if persistent and key in getattr(self, "_eval_dataloaders", {}):
            return self._eval_dataloaders[key]
        dm = self._datamodule or self._build_datamodule()
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, str):
            dataset = self.eval_dataset[dataset]
        loader = dm.eval_loader(dataset)
        if persistent:
            self._eval_dataloaders = {**getattr(self, "_eval_dataloaders", {}), key: loader}
        return loader

    def _eval_loader_key(self, eval_dataset: Any) -> str | None:
        """HF's cache key: the name of one of the trainer's eval datasets, or "eval" for the trainer's own.

        HF keys every dataset object passed in as "eval" (so another dataset would get the cached loader); a
        dataset that is not the trainer's gets no key here, and so a fresh loader.
        """
        if eval_dataset is None or eval_dataset is self.eval_dataset:
            return "eval"
        if isinstance(eval_dataset, str):
            return eval_dataset
        if isinstance(self.eval_dataset, Mapping):
            return next((name for name, ds in self.eval_dataset.items() if ds is eval_dataset), None)
        return None

    def get_test_dataloader(self, test_dataset: Any):
        return (self._datamodule or self._build_datamodule()).eval_loader(test_dataset, "test")

    # ------------------------------------------------------------------ evaluate / predict
    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """Evaluate and return HF's metrics dict.

        Keys, in HF's order: ``{prefix}_loss``, ``{prefix}_model_preparation_time`` (when the first evaluation or
        prediction ran before any ``train()``), the ``compute_metrics`` and streaming ``metrics`` results,
        ``{prefix}_runtime``, ``{prefix}_samples_per_second``, ``{prefix}_steps_per_second``, ``epoch``. Fires
        ``on_prediction_step`` per batch, then ``on_log`` and ``on_evaluate``. A dict of datasets is evaluated one
        after another with the prefix ``{prefix}_{name}``.

        Raises:
            ValueError: without an eval dataset, or ``fp16_full_eval`` without a CUDA GPU.
        """
        if self.is_in_train:
            try:
                return self.flow.evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
            except RuntimeError as error:
                # As HF: a retry would only shrink the training batch, so an evaluation OOM is not retried.
                if self.args.auto_find_batch_size and should_reduce_batch_size(error):
                    raise RuntimeError(EVAL_OUT_OF_MEMORY) from error
                raise
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        if isinstance(dataset, Mapping):
            metrics: dict[str, float] = {}
            for name, ds in dataset.items():
                metrics.update(self.evaluate(ds, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        self._memory_tracker.start("eval")
        _, _, metrics = self._run_eval_loop(self.get_eval_dataloader(dataset), dataset, ignore_keys,
                                            metric_key_prefix, predict=False)
        self.flow.evaluation.report(metrics)
        self._memory_tracker.stop_and_update_metrics("eval", metrics)
        return metrics

    def predict(self, test_dataset: Any, ignore_keys: list[str] | None = None,
                metric_key_prefix: str = "test") -> PredictionOutput:
        """Predict on ``test_dataset``; returns HF's ``PredictionOutput``.

        Predictions and labels from batches of different sequence lengths are joined with ``-100`` padding;
        metrics are computed when the dataset has labels. Fires ``on_prediction_step`` per batch, then
        ``on_predict`` (nothing is logged).
        """
        self._memory_tracker.start("test")
        predictions, label_ids, metrics = self._run_eval_loop(self.get_test_dataloader(test_dataset), test_dataset,
                                                              ignore_keys, metric_key_prefix, predict=True)
        self.flow.events.fire("on_predict", metrics=metrics)
        self._memory_tracker.stop_and_update_metrics("test", metrics)
        return PredictionOutput(predictions=predictions, label_ids=label_ids, metrics=metrics)

    def _run_eval_loop(self, dataloader: Any, dataset: Any, ignore_keys: list[str] | None, prefix: str,
                       predict: bool):
        """HF's ``evaluation_loop`` outside training, on Lightning's test loop: ``(predictions, labels, metrics)``."""
        check_full_eval_precision(self.args)
        module = self.lightning_module
        wants_outputs = predict or self.compute_metrics is not None or self.metrics is not None
        module.eval_request = EvalRequest(
            prediction_loss_only=None if wants_outputs else True, ignore_keys=ignore_keys, keep_predictions=predict,
            full_batch_loss_weight=self.eval_loss_full_batch_weight,
        )
        prep_start = time.time()
        # HF casts the model itself for full-precision evaluation (and leaves it cast).
        if self.args.fp16_full_eval:
            self.model.to(dtype=torch.float16)
        elif self.args.bf16_full_eval:
            self.model.to(dtype=torch.bfloat16)
        # After a train() the evaluation goes to the same loggers (HF's TensorBoard keeps its writer's folder).
        loggers = list(self._pl_trainer.loggers) if self._pl_trainer is not None else []
        with quiet_lightning():
            pl_trainer = build_lightning_trainer(self.args, flow=self.flow, logger=loggers or False,
                                                 enable_progress_bar=False)
        evaluation = self.flow.evaluation
        if self._pl_trainer is None and evaluation.model_preparation_time is None:
            # HF times the model's preparation on the first evaluation before training and reports that same value
            # with every evaluation afterwards, during training too.
            evaluation.model_preparation_time = round(time.time() - prep_start, 4)
        start = time.time()
        module.eval_dataloader_end = None
        try:
            with quiet_lightning(), without_lightning_reseed():
                pl_trainer.test(module, dataloaders=dataloader, verbose=False)
            acc = module.eval_accumulators.get(0)
        finally:
            module.eval_accumulators = {}
        return finish_eval_metrics(acc, prefix, started=start,
                                   total_batch_size=self.args.eval_batch_size * pl_trainer.world_size,
                                   num_samples=len(dataset) if has_len(dataset) else None,
                                   model_preparation_time=evaluation.model_preparation_time)

    #: HF's Trainer weighs each eval batch loss by the batch's samples; HF's Seq2SeqTrainer gathers without dropping
    #: the last batch's surplus copies, so every batch weighs ``eval_batch_size`` (its subclass sets this True; read
    #: at construction for the evaluations during training).
    eval_loss_full_batch_weight: bool = False

    # ------------------------------------------------------------------ hyperparameter search
    def hyperparameter_search(self, hp_space: Callable | None = None, compute_objective: Callable | None = None,
                              n_trials: int = 20, direction: str | list[str] = "minimize", backend: Any = None,
                              hp_name: Callable | None = None, **kwargs: Any):
        """HF's ``hyperparameter_search`` with Optuna or Ray Tune: one ``train()`` per trial over ``model_init``.

        Args:
            hp_space: the search space: ``fn(trial) -> dict`` of ``TrainingArguments`` values (Optuna), or
                ``fn(None) -> dict`` of Ray Tune domains given to Ray as ``config`` (HF's default space when omitted).
            compute_objective: ``fn(metrics) -> float``; default: ``eval_loss``, or the sum of the other metrics.
            n_trials: number of trials (Ray: ``num_samples``; a ``tune.grid_search`` runs each point that often).
            direction: ``"minimize"`` / ``"maximize"``, or a list of them for several objectives (Optuna only).
            backend: ``"optuna"`` or ``"ray"`` (default: the first installed, in that order); ``"wandb"`` is refused.
            hp_name: ``fn(trial) -> str`` naming the trial's run folder (default ``run-<trial number or Ray id>``).
            **kwargs: ``optuna.create_study`` arguments, plus ``timeout``, ``n_jobs``, ``gc_after_trial``, ``catch``;
                or ``ray.tune.run`` arguments (``resources_per_trial`` defaults to one CPU, and a GPU when there is
                one, per trial).

        Returns:
            ``BestRun`` (a list of them for several directions).

        Raises:
            RuntimeError: without ``model_init``, when the backend is not installed (names the package), or a Ray
                scheduler that needs evaluation during training without it.
            ValueError: an unknown or unsupported backend; several directions with Ray.
        """
        from hf_lightning.trainer.hp_search import run_hyperparameter_search

        return run_hyperparameter_search(self, hp_space=hp_space, compute_objective=compute_objective,
                                         n_trials=n_trials, direction=direction, backend=backend, hp_name=hp_name,
                                         **kwargs)

    # ------------------------------------------------------------------ saving helpers
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Write the model (and processing class, ``training_args.bin``) to ``output_dir`` through ``_save``, as HF
        does. A subclass's ``save_model`` / ``_save`` also writes the model files of every ``checkpoint-N`` (into
        the folder being staged, called on every process as HF's ``_save_checkpoint`` calls them); otherwise the
        checkpoint writer does."""
        output_dir = output_dir or self.args.output_dir
        if is_fsdp2_model(self.model) or isinstance(model_state_for(self.model), FSDP2ModelState):
            # As HF under FSDP (and tensor parallelism): every process takes part in gathering the full weights;
            # the saving one writes.
            self._save(output_dir, state_dict=model_state_for(self.model).gather(self.model, output_dir)[1])
            return
        self._save(output_dir)

    def _write_checkpoint_model(self, folder: str) -> None:
        self.save_model(folder, _internal_call=True)

    def save_state(self) -> None:
        """Write ``trainer_state.json`` to ``output_dir``."""
        if self.args.should_save:
            self.state.save_to_json(os.path.join(self.args.output_dir, "trainer_state.json"))

    def log_metrics(self, split: str, metrics: dict[str, Any]) -> None:
        """Print ``metrics`` in HF's aligned format (world process zero only)."""
        if self.is_world_process_zero():
            print_metrics(split, metrics)

    def save_metrics(self, split: str, metrics: dict[str, Any], combined: bool = True) -> None:
        """Write ``{split}_results.json`` (and merge into ``all_results.json``) as HF does."""
        if self.is_world_process_zero():
            write_metrics(self.args.output_dir, split, metrics, combined=combined)

    def is_world_process_zero(self) -> bool:
        return int(os.environ.get("RANK", "0")) == 0

    def is_local_process_zero(self) -> bool:
        return int(os.environ.get("LOCAL_RANK", "0")) == 0

    # ------------------------------------------------------------------ smaller HF helpers
    #: HF's override point: None lets the loss decide; True/False forces whether it is already GA-scaled (read
    #: when ``train()`` builds the module).
    loss_is_scaled_for_ga: bool | None = None

    def call_model_init(self, trial: Any = None) -> nn.Module:
        """Build a model with ``model_init`` (passing ``trial`` when it takes one), as HF."""
        if self.model_init is None:
            raise RuntimeError("call_model_init needs `model_init` to be passed to the Trainer.")
        params = inspect.signature(self.model_init).parameters
        if len(params) > 1:
            raise RuntimeError("model_init should have 0 or 1 argument.")
        model = self.model_init(trial) if len(params) == 1 else self.model_init()
        if model is None:
            raise RuntimeError("model_init should not return None.")
        return model

    def compute_loss_context_manager(self):
        """A no-op context: autocast is the Lightning precision plugin's job here."""
        return contextlib.nullcontext()

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True):
        """A no-op context: autocast is the Lightning precision plugin's job here."""
        return contextlib.nullcontext()

    def floating_point_ops(self, inputs: dict) -> float:
        """HF's FLOPs estimate for one forward+backward over ``inputs``."""
        return self.lightning_module.floating_point_ops(inputs)

    def store_flos(self) -> None:
        """Move the FLOPs counted since the last store into ``state.total_flos``."""
        self.flow.store_flos()

    def get_batch_samples(self, epoch_iterator, num_batches: int, device: Any = None):
        """Fetch up to ``num_batches`` batches and count their ``num_items_in_batch``, as HF."""
        batches = []
        for _ in range(num_batches):
            try:
                batches.append(next(epoch_iterator))
            except StopIteration:
                break
        return batches, self.lightning_module.num_items_in_batch(batches)

    def get_tp_size(self) -> int:
        return 1

    def get_cp_size(self) -> int:
        return 1

    def get_sp_size(self) -> int:
        return 1

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        """Names of the parameters that get weight decay (HF's grouping rule)."""
        from hf_lightning.optim import get_decay_parameter_names

        return get_decay_parameter_names(model)

    @staticmethod
    def get_optimizer_cls_and_kwargs(args: Any, model: nn.Module | None = None) -> tuple[type, dict]:
        """The optimizer class and keyword arguments ``args.optim`` selects."""
        from hf_lightning.optim import get_optimizer_cls_and_kwargs

        return get_optimizer_cls_and_kwargs(args, model)

    def get_learning_rates(self) -> list[float]:
        """The current learning rate of every optimizer parameter group."""
        if self.optimizer is None:
            raise ValueError("Trainer optimizer is None, please make sure you have setup the optimizer before.")
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_optimizer_group(self, param: Any = None):
        """The parameter group holding ``param`` (or all groups)."""
        if self.optimizer is None:
            raise ValueError("Trainer optimizer is None, please make sure you have setup the optimizer before.")
        if param is not None:
            for group in self.optimizer.param_groups:
                if any(p is param for p in group["params"]):
                    return group
        return [group["params"] for group in self.optimizer.param_groups]

    def get_num_trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def get_total_train_batch_size(self, args: Any) -> int:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        return args.train_batch_size * args.gradient_accumulation_steps * world

    def num_examples(self, dataloader) -> int:
        """Number of samples behind ``dataloader`` (its dataset's length when known)."""
        try:
            return len(dataloader.dataset)
        except (TypeError, AttributeError):
            return len(dataloader) * self.args.per_device_train_batch_size

    def set_initial_training_values(self, args: Any, dataloader) -> tuple:
        """HF's step accounting: ``(num_train_epochs, num_update_steps_per_epoch, num_examples,
        num_train_samples, total_train_batch_size, steps_in_epoch, max_steps)``."""
        from hf_lightning.args.plan import resolve_plan

        try:
            micro = len(dataloader)
        except TypeError:
            micro = None
        examples = None
        if micro is not None:
            examples = self.num_examples(dataloader)
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        plan = resolve_plan(args, micro, num_examples=examples, world_size=world)
        return (plan.num_train_epochs, plan.update_steps_per_epoch, examples if examples is not None
                else plan.total_train_batch_size * plan.max_steps, plan.num_train_samples,
                plan.total_train_batch_size, plan.steps_in_epoch, plan.max_steps)

    def metrics_format(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """HF's human-readable metric values (runtime as h:mm:ss, memory in MB, FLOPs in GF)."""
        return metrics_format(metrics)

    def end(self) -> None:
        """Finish the run: destroy the process group Lightning created, if any (HF's ``end``)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    def push_to_hub(self, *args: Any, **kwargs: Any) -> None:
        raise ValueError("push_to_hub is not supported by hf_lightning (no hub access); save_model() writes the "
                         "files you can upload yourself.")

    def create_model_card(self, language: str | None = None, license: str | None = None,
                          tags: str | list[str] | None = None, model_name: str | None = None,
                          finetuned_from: str | None = None, tasks: str | list[str] | None = None,
                          dataset_tags: str | list[str] | None = None, dataset: str | list[str] | None = None,
                          dataset_args: str | list[str] | None = None) -> None:
        """Draft HF's model card as ``README.md`` in ``output_dir`` (offline; world process zero only).

        As in HF, ``save_model`` does not call it (only ``push_to_hub`` does, which hf_lightning refuses).
        """
        from hf_lightning.trainer.model_card import write_model_card

        write_model_card(self, language=language, license=license, tags=tags, model_name=model_name,
                         finetuned_from=finetuned_from, tasks=tasks, dataset_tags=dataset_tags, dataset=dataset,
                         dataset_args=dataset_args)

    def init_hf_repo(self, *args: Any, **kwargs: Any) -> None:
        raise ValueError("init_hf_repo is not supported by hf_lightning (no hub access).")

    def create_accelerator_and_postprocess(self) -> None:
        raise ValueError("hf_lightning has no accelerate Accelerator: devices, precision and strategy come from "
                         "build_lightning_trainer(args).")


def _is_lightning_callback(cb: Any) -> bool:
    import lightning.pytorch as pl

    return isinstance(cb, pl.Callback)


def _overrides(obj: Any, name: str) -> bool:
    return getattr(type(obj), name) is not getattr(Trainer, name)
