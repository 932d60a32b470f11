"""``HFFlowCallback``: HF's training flow carried out on Lightning's loop.

HF's ``Trainer`` keeps a ``TrainerState``/``TrainerControl`` pair, asks its callbacks (``DefaultFlowCallback``
first) what to do after every optimizer step and epoch, then *logs, evaluates, saves* in that order
(``_maybe_log_save_evaluate``). This callback owns that state and the HF ``CallbackHandler`` and does the same
from Lightning's hooks:

- ``on_train_start`` → ``on_train_begin`` (+ ``eval_on_start``); ``on_train_epoch_start`` → ``on_epoch_begin``;
- the module's window step reports ``on_step_begin`` / ``on_substep_end`` / ``on_pre_optimizer_step`` /
  ``on_optimizer_step`` through :meth:`on_hf_event`;
- ``on_train_batch_end`` (once per optimizer step) → ``on_step_end`` then log → evaluate → save;
- ``on_train_epoch_end`` → ``on_epoch_end`` then log → evaluate → save;
- ``on_train_end`` → HF's final summary log, best-model loading, ``on_train_end``.

Evaluation runs Lightning's own validation loop (Lightning's automatic trigger is disabled by
``build_lightning_trainer`` because it counts batches and runs after the save point).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from hf_lightning._utils import enum_value
from hf_lightning import _compat
from hf_lightning.callbacks.hf_api import (
    CallbackHandler,
    DefaultFlowCallback,
    PrinterCallback,
    ProgressCallback,
    TrainerCallback,
)
from hf_lightning.checkpointing.durability import run_in_background, wait_for_flushes
from hf_lightning.checkpointing.io import HF_CHECKPOINT_KEY, HFCheckpointIO
from hf_lightning.checkpointing.layout import TRAINER_STATE_NAME, checkpoint_folder_name
from hf_lightning.checkpointing.model_state import prepare_model_saving
from hf_lightning.checkpointing.reader import load_model_weights, load_optimizer_and_scheduler, load_scaler
from hf_lightning.checkpointing.rng import restore_rng_state
from hf_lightning.checkpointing.rotation import (
    clean_stale_temporary_folders,
    final_cleanup_for_limit_one,
    foreign_checkpoints,
    rotate_checkpoints,
)
from hf_lightning.checkpointing.safe_load import verify_checkpoint_files
from hf_lightning.checkpointing.writer import CheckpointContents
from hf_lightning.evaluation import EvalRequest
from hf_lightning.optim import is_metric_driven
from hf_lightning.state import TrainerControl, TrainerState, is_exportable_state
from hf_lightning.outputs import TrainOutput, speed_metrics


logger = logging.getLogger(__name__)


class HFFlowCallback(pl.Callback):
    """Drives HF's ``TrainerState``/``TrainerControl``/callbacks from Lightning's training hooks.

    Args:
        args: a ``TrainingArguments``.
        callbacks: HF-style ``TrainerCallback`` classes or instances, run after ``DefaultFlowCallback`` in order.
        processing_class: saved with checkpoints and passed to callbacks.
        data_collator: its tokenizer is saved with checkpoints when no processing class is given.
        hooks: the object whose ``log`` and ``evaluate`` are called (the HF-style facade passes itself so a
            subclass's overrides are used); defaults to this callback.
    """

    state_key_name = "HFFlowCallback"

    def __init__(self, args: Any, callbacks: list | None = None, processing_class: Any = None,
                 data_collator: Callable | None = None, hooks: Any = None, hf_progress: bool = False) -> None:
        self.args = args
        # HF appends PrinterCallback (disable_tqdm) or ProgressCallback after the user's callbacks. The facade asks
        # for HF's own bar (hf_progress=True, the output HF users know); the Lightning-native path keeps
        # Lightning's progress bar instead.
        if getattr(args, "disable_tqdm", False):
            progress = [PrinterCallback]
        else:
            progress = [ProgressCallback] if hf_progress else []
        self.uses_hf_progress = bool(progress) and progress[0] is ProgressCallback
        self.handler = CallbackHandler(
            [DefaultFlowCallback, *(callbacks or []), *progress], None, processing_class, None, None
        )
        self.processing_class = processing_class
        self.data_collator = data_collator
        self.hooks = hooks if hooks is not None else self
        self.state = TrainerState()
        self.control = TrainerControl()
        self.train_output: TrainOutput | None = None
        self.resume_state: TrainerState | None = None
        self.resume_dir: str | None = None
        self._resume_micro_offset = 0
        self._rng_restore: str | None = None
        self._trainer: pl.Trainer | None = None
        self._module = None
        self._validate_started = time.time()
        self._reset_run_counters()

    def _reset_run_counters(self) -> None:
        self.tr_loss: torch.Tensor | None = None
        self.total_loss_scalar = 0.0
        self.globalstep_last_logged = 0
        self.initial_global_step = 0
        self.initial_tokens_seen = 0
        self.current_flos = 0.0
        self.start_time = time.time()
        self.micro_in_epoch = 0
        self.last_grad_norm: Any = None
        self.last_learning_rate: float | None = None

    # ------------------------------------------------------------------ HF callback list
    def add_callback(self, callback: Any) -> None:
        self.handler.add_callback(callback)

    def pop_callback(self, callback: Any) -> Any:
        return self.handler.pop_callback(callback)

    def remove_callback(self, callback: Any) -> None:
        self.handler.remove_callback(callback)

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        pl_module.event_sink = self
        self._trainer, self._module = trainer, pl_module
        self.handler.model = pl_module.model
        # An earlier fit's checkpoints finish flushing and rotating before this one looks at output_dir.
        wait_for_flushes()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # The checkpoints saved so far reach the disk before the error surfaces (their failures are only logged:
        # the original error is the one to report).
        wait_for_flushes()

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        """Resume from an HF ``checkpoint-N`` folder (``fit(ckpt_path=folder)``, see ``HFCheckpointIO``)."""
        path = checkpoint.get(HF_CHECKPOINT_KEY)
        if path is None:
            return
        self.resume_dir = path
        state_file = os.path.join(path, TRAINER_STATE_NAME)
        if not os.path.isfile(state_file):
            return
        state = TrainerState.load_from_json(state_file)
        if state.best_model_checkpoint is not None and not os.path.isdir(state.best_model_checkpoint):
            logger.warning(
                "The best checkpoint %s recorded in the resumed state does not exist any more; best_model_checkpoint "
                "is reset to None.", state.best_model_checkpoint,
            )
            state.best_model_checkpoint = None
        self._warn_changed_args(state)
        self.resume_state = state
        plan = pl_module.plan
        windows_done = 0 if getattr(self.args, "ignore_data_skip", False) else state.global_step % plan.update_steps_per_epoch
        self._resume_micro_offset = windows_done * plan.gradient_accumulation_steps
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is not None and windows_done:
            datamodule.resume_windows = windows_done

    def _warn_changed_args(self, state: TrainerState) -> None:
        args = self.args
        changed = [
            name for name, saved in (("logging_steps", state.logging_steps), ("eval_steps", state.eval_steps),
                                     ("save_steps", state.save_steps))
            if getattr(args, name, None) is not None and getattr(args, name) != saved
        ]
        if state.train_batch_size is not None and args.per_device_train_batch_size != state.train_batch_size:
            changed.append("per_device_train_batch_size")
        if changed:
            logger.warning(
                "Resuming with %s different from the checkpoint; the checkpoint's logging/eval/save steps stay in "
                "force.", ", ".join(changed),
            )

    def _restore_callback_states(self, state: TrainerState) -> None:
        # HF (restore_callback_states_from_checkpoint=True): a new instance of each saved callback class, built
        # from its saved args, gets the saved attributes and replaces the attached one.
        saved = state.stateful_callbacks or {}
        for cb in list(self.handler.callbacks) + [self.control]:
            name = type(cb).__name__
            if name not in saved or not is_exportable_state(cb):
                continue
            entry = saved[name][0] if isinstance(saved[name], list) else saved[name]
            new = type(cb)(**entry.get("args", {}))
            for key, value in entry.get("attributes", {}).items():
                setattr(new, key, value)
            if cb is self.control:
                self.control = new
            else:
                self.handler.remove_callback(cb)
                self.handler.add_callback(new)

    def _resume_training_state(self, trainer: pl.Trainer) -> None:
        path = self.resume_dir
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        configs = trainer.lr_scheduler_configs
        load_optimizer_and_scheduler(optimizer, configs[0].scheduler if configs else None, path)
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            load_scaler(scaler, path)
        plan = self._module.plan
        _compat.fast_forward(trainer, self.state.global_step, self.state.global_step // plan.update_steps_per_epoch)
        # HF restores the RNG right before the first forward when resuming mid-epoch, and before the epoch's
        # data iterator exists at an epoch boundary (that iterator then draws its seed from the restored RNG).
        self._rng_restore = "mid_epoch" if self._resume_micro_offset else "epoch_start"

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        args, plan = self.args, pl_module.plan
        self._reset_run_counters()
        self.control = TrainerControl()
        stateful = [cb for cb in self.handler.callbacks + [self.control] if is_exportable_state(cb)]
        state = TrainerState(stateful_callbacks=stateful)
        state.train_batch_size = args.train_batch_size
        state.compute_steps(args, plan.max_steps)
        resuming = self.resume_dir is not None
        if self.resume_state is not None:
            # HF replaces the fresh state by the checkpoint's, then re-applies this run's limits.
            state = self.resume_state
            self.resume_state = None
            if getattr(args, "restore_callback_states_from_checkpoint", False):
                self._restore_callback_states(state)
        state.max_steps = plan.max_steps
        state.num_train_epochs = plan.num_train_epochs
        state.is_local_process_zero = trainer.local_rank == 0
        state.is_world_process_zero = trainer.global_rank == 0
        self.state = state
        self.tr_loss = torch.tensor(0.0, device=pl_module.device)
        self.globalstep_last_logged = state.global_step
        self.initial_global_step = state.global_step
        self.initial_tokens_seen = state.num_input_tokens_seen
        self.handler.optimizer = trainer.optimizers[0] if trainer.optimizers else None
        configs = trainer.lr_scheduler_configs
        self.handler.lr_scheduler = configs[0].scheduler if configs else None
        self.handler.train_dataloader = getattr(trainer.datamodule, "train_loader", lambda: None)()
        if resuming:
            # Every pickle-based file of the folder is judged (nothing untrusted unpickled) before any is applied.
            verify_checkpoint_files(self.resume_dir)
            self._resume_training_state(trainer)
            if state.global_step >= plan.max_steps:
                logger.warning(
                    "Resumed from %s at step %d, which already reaches max_steps=%d: no step is left to train. "
                    "Raise max_steps / num_train_epochs to train further.",
                    self.resume_dir, state.global_step, plan.max_steps,
                )
        self.start_time = time.time()
        # Checkpoints an earlier run left in output_dir (not the lineage being resumed): never rotated away.
        self._foreign_checkpoints: set[str] = set()
        if self._should_save():
            # Folders a killed save or deletion left behind are never picked up, but they take disk space.
            clean_stale_temporary_folders(args.output_dir, older_than=self.start_time)
            if enum_value(args.save_strategy) != "no":
                prepare_model_saving(pl_module.model)
            foreign = foreign_checkpoints(args.output_dir, self.resume_dir)
            self._foreign_checkpoints = set(foreign)
            if resuming:
                # Finish a rotation a kill interrupted (between a save and its rotation): with no save left to
                # train, the resumed lineage would otherwise keep one folder more than save_total_limit.
                rotate_checkpoints(args.output_dir, save_total_limit=args.save_total_limit,
                                   best_model_checkpoint=state.best_model_checkpoint, use_mtime=True, keep=foreign,
                                   protect=[self.resume_dir])
            if foreign:
                logger.warning(
                    "%s already holds checkpoints this run did not write: %s. They are left alone: "
                    "save_total_limit neither counts nor deletes them, and a checkpoint this run saves under one of "
                    "their names keeps the old folder as superseded-<name>-<time>. get_last_checkpoint() / "
                    "resume_from_checkpoint=True pick the highest step, which may be one of them; use one "
                    "output_dir per run to keep runs apart.",
                    args.output_dir,
                    ", ".join(os.path.basename(path) for path in foreign),
                )
        self.control = self.handler.on_train_begin(args, self.state, self.control)
        if getattr(args, "eval_on_start", False):
            self._evaluate(trainer, pl_module, skip_scheduler=True)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pl_module.stop_epoch_requested = False
        # A mid-epoch resume continues HF's epoch fraction from the skipped micro-batches.
        self.micro_in_epoch, self._resume_micro_offset = self._resume_micro_offset, 0
        self.last_grad_norm = None
        self.last_learning_rate = None
        self.control = self.handler.on_epoch_begin(self.args, self.state, self.control)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._rng_restore is None:
            return
        # The first window is fetched by now, as in HF's mid-epoch resume.
        restored = restore_rng_state(self.resume_dir, trainer.global_rank, trainer.world_size)
        if restored and self._rng_restore == "epoch_start":
            # At an epoch boundary HF restores before creating the epoch's DataLoader iterator, which then draws
            # its base seed from the restored generator; ours exists already, so make that one draw here.
            torch.empty((), dtype=torch.int64).random_()
        self._rng_restore = None

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._validate_started = time.time()
        # HF hands callbacks the eval dataloader (ProgressCallback sizes its bar from it).
        self.handler.eval_dataloader = _first(trainer.val_dataloaders)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A plain ``lightning.Trainer.validate(module, ...)``: finish HF's evaluation and report it.

        The metrics go to ``state.log_history`` / ``on_evaluate`` as HF's ``evaluate()`` would, and are also
        logged through Lightning so that ``validate()`` returns them. In-training evaluations and the facade's
        ``evaluate()`` finish their metrics themselves.
        """
        if trainer.state.fn != "validate" or not pl_module.eval_accumulators:
            return
        datamodule = getattr(trainer, "datamodule", None)
        names = datamodule.eval_names if datamodule is not None and hasattr(datamodule, "eval_names") else []
        total_batch = self.args.eval_batch_size * trainer.world_size
        reported: dict[str, float] = {}
        for idx, acc in sorted(pl_module.eval_accumulators.items()):
            name = names[idx] if idx < len(names) else None
            prefix = "eval" if name is None else f"eval_{name}"
            _, _, metrics, num_samples = acc.finalize(prefix)
            metrics.update(speed_metrics(prefix, self._validate_started, num_samples=num_samples,
                                         num_steps=math.ceil(num_samples / total_batch) if num_samples else 0))
            self._log(metrics)
            self.control = self.handler.on_evaluate(self.args, self.state, self.control, metrics)
            reported.update({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})
        pl_module.eval_accumulators = {}
        pl_module.log_dict(reported, add_dataloader_idx=False)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.handler.eval_dataloader = _first(trainer.test_dataloaders)

    def on_hf_event(self, event: str, **kwargs: Any) -> None:
        """An HF per-window event reported by the module while it runs a window."""
        if event == "on_micro_batch_end":
            self._track_micro_batch(kwargs["inputs"], kwargs["loss"])
        else:
            self.control = getattr(self.handler, event)(self.args, self.state, self.control)

    def _track_micro_batch(self, inputs: Any, loss: torch.Tensor) -> None:
        self.micro_in_epoch += 1
        tr_loss = self.tr_loss
        if not getattr(self.args, "logging_nan_inf_filter", True):
            self.tr_loss = tr_loss + loss
        elif loss.device.type == "cpu":
            # HF adds the running average instead of a non-finite loss. On the CPU, reading the flag costs no
            # device sync, so it is a plain branch as in HF.
            if bool(torch.isfinite(loss)):
                self.tr_loss = tr_loss + loss
            else:
                self.tr_loss = tr_loss + tr_loss / (1 + self.state.global_step - self.globalstep_last_logged)
        else:
            # On an accelerator torch.where keeps it sync-free.
            fallback = tr_loss / (1 + self.state.global_step - self.globalstep_last_logged)
            self.tr_loss = torch.where(torch.isfinite(loss), tr_loss + loss, tr_loss + fallback)
        module = self._module
        self.current_flos += module.floating_point_ops(inputs)
        mode = getattr(self.args, "include_num_input_tokens_seen", "no")
        if mode not in ("no", False, None):
            self.state.num_input_tokens_seen += _count_tokens(module, inputs, mode, self.processing_class,
                                                              self._trainer)

    def stop_requested(self) -> bool:
        return bool(self.control.should_epoch_stop or self.control.should_training_stop)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not outputs["stepped"]:
            # The window ended without an optimizer step (a stop raised mid-window, or HF's carried-over partial
            # window of an iterable dataset): no on_step_end, nothing logged or saved.
            if self.stop_requested():
                pl_module.stop_epoch_requested = True
            return
        plan = pl_module.plan
        self.state.global_step = trainer.global_step
        self.state.epoch = plan.epoch_progress(trainer.current_epoch, self.micro_in_epoch)
        self.last_grad_norm = outputs["grad_norm"]
        self.last_learning_rate = outputs["learning_rate"]
        self.control = self.handler.on_step_end(self.args, self.state, self.control)
        self._maybe_log_save_evaluate(trainer, pl_module)
        if self.control.should_epoch_stop or self.control.should_training_stop:
            pl_module.stop_epoch_requested = True

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.micro_in_epoch == 0:
            # HF: an epoch without a single batch (an exhausted iterable dataset) stops training.
            self.control.should_training_stop = True
        self.control = self.handler.on_epoch_end(self.args, self.state, self.control)
        self._maybe_log_save_evaluate(trainer, pl_module)
        if self.control.should_training_stop:
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # HF's last zero_grad (the module defers it to the next backward, and there is none).
        pl_module._release_stepped_gradients()
        # Every checkpoint on disk and rotated, as HF leaves them, before the best one is loaded or cleaned up.
        wait_for_flushes(raise_failures=True)
        self.resume_dir = None
        args, state = self.args, self.state
        self.total_loss_scalar += self.tr_loss.item()
        steps = state.global_step - self.initial_global_step
        train_loss = self.total_loss_scalar / max(steps, 0.001)
        plan = pl_module.plan
        metrics = speed_metrics(
            "train",
            self.start_time,
            num_samples=plan.num_train_samples * steps / max(state.max_steps, 1),
            num_steps=steps,
        )
        self.store_flos()
        metrics["total_flos"] = state.total_flos
        metrics["train_loss"] = train_loss
        self._log(metrics)
        if getattr(args, "load_best_model_at_end", False) and state.best_model_checkpoint is not None:
            self._load_best_model(pl_module)
        if self._should_save() and state.best_model_checkpoint is not None and args.save_total_limit == 1:
            # An earlier run's folders are not this run's to delete (see on_train_start).
            final_cleanup_for_limit_one(args.output_dir, state.best_model_checkpoint,
                                        keep=getattr(self, "_foreign_checkpoints", ()))
        self.control = self.handler.on_train_end(args, state, self.control)
        self.train_output = TrainOutput(state.global_step, train_loss, metrics)

    # ------------------------------------------------------------------ HF's log / evaluate / save
    def _maybe_log_save_evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        state, control = self.state, self.control
        if control.should_log and state.global_step > self.globalstep_last_logged:
            tr_loss_scalar = self._mean_across_processes(self.tr_loss).item()
            self.tr_loss = self.tr_loss - self.tr_loss
            logs: dict[str, Any] = {"loss": tr_loss_scalar / (state.global_step - self.globalstep_last_logged)}
            grad_norm = self.last_grad_norm
            if grad_norm is not None:
                logs["grad_norm"] = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm
            logs["learning_rate"] = (
                self.last_learning_rate if self.last_learning_rate is not None else _current_lr(trainer)
            )
            self.total_loss_scalar += tr_loss_scalar
            self.globalstep_last_logged = state.global_step
            self.store_flos()
            self._log(logs, self.start_time)
        if self.control.should_evaluate:
            metrics = self._evaluate(trainer, pl_module)
            is_new_best = self._determine_best_metric(metrics)
            if enum_value(self.args.save_strategy) == "best":
                self.control.should_save = is_new_best
        if self.control.should_save:
            self._save_checkpoint(trainer, pl_module)
            self.control = self.handler.on_save(self.args, self.state, self.control)

    def hf_log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
        """HF's ``Trainer.log``: add ``epoch`` (and token counts), append to ``log_history``, fire ``on_log``."""
        state = self.state
        if state.epoch is not None:
            logs["epoch"] = state.epoch
        if getattr(self.args, "include_num_input_tokens_seen", "no") not in ("no", False, None):
            logs["num_input_tokens_seen"] = state.num_input_tokens_seen
            if start_time is not None:
                logs.update(speed_metrics("train", start_time,
                                          num_tokens=state.num_input_tokens_seen - self.initial_tokens_seen))
        state.log_history.append({**logs, "step": state.global_step})
        # Before the HF callbacks: HF's TensorBoardCallback runs before PrinterCallback, which pops total_flos.
        self._forward_to_loggers(logs)
        self.control = self.handler.on_log(self.args, state, self.control, logs)

    def _log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
        # Lightning overwrites a callback's ``log`` attribute with the module's, so our HF ``log`` is named
        # ``hf_log``; the facade's (overridable) ``log`` is reached through ``hooks``.
        if self.hooks is self:
            self.hf_log(logs, start_time)
        else:
            self.hooks.log(logs, start_time)

    def _forward_to_loggers(self, logs: dict[str, Any]) -> None:
        trainer = self._trainer
        if trainer is None or not trainer.loggers or trainer.global_rank != 0:
            return
        scalars = {}
        for key, value in logs.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            # HF's TensorBoard naming: eval_x -> eval/x, test_x -> test/x, everything else train/x.
            for prefix in ("eval_", "test_"):
                if key.startswith(prefix):
                    scalars[f"{prefix[:-1]}/{key[len(prefix):]}"] = value
                    break
            else:
                scalars[f"train/{key}"] = value
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=self.state.global_step)

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """HF's ``evaluate`` during training: Lightning's validation loop over the eval dataset(s).

        Each dataset is logged and announced (``on_log``, ``on_evaluate``) as soon as its last batch has been
        evaluated, inside the loop, so a dict of datasets gives HF's event order: the first set's
        ``on_prediction_step``s, its ``on_log`` / ``on_evaluate``, then the next set's.
        """
        trainer, module = self._trainer, self._module
        # No gradients held while evaluating, as in HF (the module drops them lazily, see hf_training_step).
        module._release_stepped_gradients()
        if eval_dataset is not None:
            raise ValueError("Evaluating another dataset while training is not supported; pass it to "
                             "Trainer.evaluate() after train().")
        if ignore_keys is None:
            # train(ignore_keys_for_eval=...) leaves them on the module's request; HF passes them to every evaluate.
            ignore_keys = module.eval_request.ignore_keys
        wants_outputs = module.compute_metrics is not None or module.metrics is not None
        module.eval_request = EvalRequest(
            prediction_loss_only=None if wants_outputs else True, ignore_keys=ignore_keys, keep_predictions=False,
            full_batch_loss_weight=bool(getattr(self.hooks, "eval_loss_full_batch_weight", False)),
        )
        datamodule = trainer.datamodule
        names, datasets = datamodule.eval_names, datamodule.eval_datasets()
        # Set on the HF-style facade when its first evaluation ran before training; HF reports it from then on.
        preparation = getattr(self.hooks, "model_preparation_time", None)
        total_batch = self.args.eval_batch_size * trainer.world_size
        all_metrics: dict[str, float] = {}
        started = [time.time()]

        def finish(idx: int, acc: Any) -> None:
            prefix = metric_key_prefix if names[idx] is None else f"{metric_key_prefix}_{names[idx]}"
            size = len(datasets[idx]) if hasattr(datasets[idx], "__len__") else None
            _, _, metrics, num_samples = acc.finalize(prefix, num_samples=size, model_preparation_time=preparation)
            metrics.update(speed_metrics(prefix, started[0], num_samples=num_samples,
                                         num_steps=math.ceil(num_samples / total_batch)))
            self._log(metrics)
            self.control = self.handler.on_evaluate(self.args, self.state, self.control, metrics)
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

    def _evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                  skip_scheduler: bool = False) -> dict[str, float]:
        metrics = self.hooks.evaluate()
        scheduler = trainer.lr_scheduler_configs[0].scheduler if trainer.lr_scheduler_configs else None
        if scheduler is not None and not skip_scheduler and is_metric_driven(scheduler):
            key = self._metric_key()
            if key not in metrics:
                raise KeyError(
                    f"The `metric_for_best_model` training argument is set to '{key}', which is not found in the "
                    f"evaluation metrics. The available evaluation metrics are: {list(metrics.keys())}. Make "
                    f"`compute_metrics` return '{key}' or change `metric_for_best_model`."
                )
            scheduler.step(metrics[key])
        return metrics

    def _metric_key(self) -> str:
        metric = self.args.metric_for_best_model
        return metric if metric.startswith("eval_") else f"eval_{metric}"

    def _determine_best_metric(self, metrics: dict[str, float]) -> bool:
        args, state = self.args, self.state
        if args.metric_for_best_model is None:
            return False
        key = self._metric_key()
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

    def _should_save(self) -> bool:
        trainer = self._trainer
        if getattr(self.args, "save_on_each_node", False):
            return trainer.local_rank == 0
        return trainer.global_rank == 0

    def _save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        args, state = self.args, self.state
        # The previous save's flush and rotation finish first, so this one starts from the folders HF would see.
        wait_for_flushes(raise_failures=True)
        self.store_flos()
        run_dir = args.output_dir
        should_save = self._should_save()
        if should_save:
            for cb in [cb for cb in self.handler.callbacks + [self.control] if is_exportable_state(cb)]:
                name = type(cb).__name__
                if isinstance(state.stateful_callbacks.get(name), list):
                    state.stateful_callbacks[name].append(cb.state())
                else:
                    state.stateful_callbacks[name] = cb.state()
        scheduler = trainer.lr_scheduler_configs[0].scheduler if trainer.lr_scheduler_configs else None
        foreign = getattr(self, "_foreign_checkpoints", set())
        folder = str(Path(run_dir) / checkpoint_folder_name(state.global_step))
        # One process: the fsync, then the rotation, run on a background thread (checkpointing/durability.py).
        in_background = trainer.world_size == 1
        payload = CheckpointContents(
            global_step=state.global_step,
            model=pl_module.model,
            optimizer=trainer.optimizers[0] if trainer.optimizers else None,
            scheduler=scheduler,
            state=state,
            args=args,
            processing_class=self.processing_class,
            data_collator=self.data_collator,
            save_only_model=getattr(args, "save_only_model", False),
            process_index=trainer.global_rank,
            world_size=trainer.world_size,
            should_save=should_save,
            scaler=getattr(trainer.precision_plugin, "scaler", None),
            barrier=trainer.strategy.barrier if trainer.world_size > 1 else None,
            # An earlier run's folder of this name is kept aside, not deleted.
            keep_replaced=folder in foreign,
            flush_in_background=in_background,
        )
        # Through the strategy's CheckpointIO, so a user's CheckpointIO plugin sees HF checkpoints too.
        checkpoint_io = trainer.strategy.checkpoint_io
        if not isinstance(checkpoint_io, HFCheckpointIO):
            checkpoint_io = HFCheckpointIO()
        checkpoint_io.save_checkpoint(payload, run_dir)
        foreign.discard(folder)
        if not should_save:
            return
        rotate = functools.partial(rotate_checkpoints, run_dir, save_total_limit=args.save_total_limit,
                                   best_model_checkpoint=state.best_model_checkpoint, use_mtime=True,
                                   keep=set(foreign))
        if in_background:
            # Behind the new folder's flush: an older checkpoint is deleted only once a newer one is on disk.
            run_in_background(f"rotating checkpoints in {run_dir}", rotate)
        else:
            rotate()

    def _load_best_model(self, pl_module: pl.LightningModule) -> None:
        load_model_weights(pl_module.model, self.state.best_model_checkpoint, strict=False)

    def store_flos(self) -> None:
        trainer = self._trainer
        flos = self.current_flos
        if trainer is not None and trainer.world_size > 1:
            flos = float(trainer.strategy.reduce(torch.tensor(flos, dtype=torch.float64), reduce_op="sum"))
        self.state.total_flos += flos
        self.current_flos = 0.0

    def _mean_across_processes(self, value: torch.Tensor) -> torch.Tensor:
        trainer = self._trainer
        if trainer is None or trainer.world_size == 1:
            return value
        return trainer.strategy.all_gather(value).float().mean()

    # ------------------------------------------------------------------ Lightning checkpoint state
    def state_dict(self) -> dict[str, Any]:
        return {"trainer_state": self.state.__dict__.copy()}


def _first(loaders: Any) -> Any:
    return loaders[0] if isinstance(loaders, (list, tuple)) and loaders else loaders


def _current_lr(trainer: pl.Trainer) -> float:
    configs = trainer.lr_scheduler_configs
    if configs and hasattr(configs[0].scheduler, "get_last_lr"):
        return configs[0].scheduler.get_last_lr()[0]
    return trainer.optimizers[0].param_groups[0]["lr"]


def _count_tokens(module: Any, inputs: Any, mode: str, processing_class: Any, trainer: Any) -> int:
    model = getattr(module.model, "module", module.model)
    main_input = getattr(model, "main_input_name", "input_ids")
    if main_input not in inputs:
        return 0
    if mode == "non_padding":
        if "attention_mask" in inputs:
            tokens = inputs["attention_mask"].sum()
        elif processing_class is not None and getattr(processing_class, "pad_token_id", None) is not None:
            tokens = (inputs[main_input] != processing_class.pad_token_id).sum()
        else:
            tokens = torch.tensor(inputs[main_input].numel())
    else:
        tokens = torch.tensor(inputs[main_input].numel())
    tokens = torch.as_tensor(tokens, dtype=torch.int64)
    if trainer is not None and trainer.world_size > 1:
        tokens = trainer.strategy.reduce(tokens.to(module.device), reduce_op="sum")
    return int(tokens)


__all__ = ["HFFlowCallback", "TrainerCallback"]
