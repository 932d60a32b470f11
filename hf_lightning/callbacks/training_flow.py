"""``HFFlowCallback``: HF's training flow carried out on Lightning's loop.

HF's ``Trainer`` keeps a ``TrainerState``/``TrainerControl`` pair, asks its callbacks (``DefaultFlowCallback``
first) what to do after every optimizer step and epoch, then *logs, evaluates, saves* in that order
(``_maybe_log_save_evaluate``). This callback owns that state and the HF ``CallbackHandler`` (:class:`HFEvents`)
and maps Lightning's hooks to HF's events:

- ``setup`` → routes ``ckpt_path`` to :class:`~hf_lightning.resume.CheckpointResume` when it is an HF folder;
- ``on_train_start`` → the fresh or resumed state, ``on_train_begin`` (+ ``eval_on_start``);
- ``on_train_epoch_start`` → ``on_epoch_begin``;
- the module's window step reports ``on_step_begin`` / ``on_substep_end`` / ``on_pre_optimizer_step`` /
  ``on_optimizer_step`` through :meth:`on_hf_event`;
- ``on_train_batch_end`` (once per optimizer step) → ``on_step_end`` then log → evaluate → save;
- ``on_train_epoch_end`` → ``on_epoch_end`` then log → evaluate → save;
- ``on_train_end`` → HF's final summary log, best-model loading, ``on_train_end``.

Every HF log also reaches Lightning's metric system (``trainer.callback_metrics`` and the loggers, see
:mod:`hf_lightning.callbacks.lightning_metrics`), so Lightning's ``ModelCheckpoint`` / ``EarlyStopping`` work in the
evaluations this callback runs; a stop they request (``trainer.should_stop``) becomes HF's
``should_training_stop``. From ``setup`` to ``teardown`` Lightning's banners are quiet (:mod:`hf_lightning.console`).

With ``enable_jit_checkpoint`` a SIGTERM (:class:`~hf_lightning.callbacks.jit_checkpoint.JITCheckpoint`) ends
training at the next safe point — after a step's (or an epoch end's) log → evaluate → save — with a checkpoint.

The work behind each step lives in one helper each: :class:`~hf_lightning.callbacks.log_history.TrainingLog`
(loss, FLOs, tokens, HF's ``log``), :class:`~hf_lightning.callbacks.evaluation.TrainingEvaluation` (evaluation on
Lightning's validation loop, best metric), :class:`~hf_lightning.callbacks.checkpoint_saver.CheckpointSaver`
(checkpoints and rotation) and :class:`~hf_lightning.resume.CheckpointResume` (restoring a checkpoint folder).
*When* to log, evaluate, save or stop is decided by :mod:`hf_lightning.flow` through ``DefaultFlowCallback``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl

from hf_lightning import _compat
from hf_lightning._utils import enum_value
from hf_lightning.callbacks.checkpoint_saver import CheckpointSaver
from hf_lightning.callbacks.evaluation import TrainingEvaluation, step_metric_scheduler, update_best_metric
from hf_lightning.callbacks.events import HFEvents
from hf_lightning.callbacks.hf_api import (
    CallbackHandler,
    DefaultFlowCallback,
    PrinterCallback,
    ProgressCallback,
    TrainerCallback,
)
from hf_lightning.callbacks.jit_checkpoint import JITCheckpoint
from hf_lightning.callbacks.log_history import TrainingLog
from hf_lightning.callbacks.progress_bar import set_train_bar_total, steps_this_epoch
from hf_lightning.checkpointing.durability import wait_for_flushes
from hf_lightning.checkpointing.layout import JIT_LOGGING_WINDOW_KEY
from hf_lightning.console import QuietSpan
from hf_lightning.hooks import TrainerHooks
from hf_lightning.loggers import reporting_callbacks
from hf_lightning.optim import fit_optimizer_and_scheduler
from hf_lightning.outputs import TrainOutput
from hf_lightning.resume import CheckpointResume
from hf_lightning.state import TrainerControl, TrainerState

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments


class HFFlowCallback(pl.Callback):
    """Drives HF's ``TrainerState``/``TrainerControl``/callbacks from Lightning's training hooks.

    Args:
        args: a ``TrainingArguments``.
        callbacks: HF-style ``TrainerCallback`` classes or instances, run after ``DefaultFlowCallback`` in order.
        processing_class: saved with checkpoints and passed to callbacks.
        data_collator: its tokenizer is saved with checkpoints when no processing class is given.
        hooks: the object whose ``log`` and ``evaluate`` are called (:class:`~hf_lightning.hooks.TrainerHooks`;
            the HF-style facade passes itself so a subclass's overrides are used); ``None`` uses this callback's
            :meth:`hf_log` and :meth:`evaluate`.
        hf_progress: show HF's progress bar (``ProgressCallback``) instead of leaving progress to Lightning's bar.
        eval_loss_full_batch_weight: weigh every evaluation batch loss as a full batch (HF's ``Seq2SeqTrainer``,
            see :class:`~hf_lightning.evaluation.EvalRequest`).
        write_model: writes each checkpoint's model files (see :class:`CheckpointSaver`); the facade passes a
            subclass's ``save_model`` / ``_save`` override.
        finish_train_metrics: called with the end-of-training metrics before they are logged (the facade adds
            HF's memory metrics there).
        step_end: called instead of :meth:`log_evaluate_save` after each step and epoch (the facade passes a
            subclass's ``_maybe_log_save_evaluate`` override here; HF's default body is :meth:`log_evaluate_save`).

    ``build_lightning_trainer(args, callbacks)`` creates one (the facade passes its own as ``flow=``); on a
    ``lightning.Trainer`` the user built, ``HFLightningModule.configure_callbacks`` brings one. It needs Lightning's
    own validation trigger and checkpointing off (:mod:`hf_lightning.lightning_settings`).
    """

    def __init__(self, args: TrainingArguments, callbacks: list | None = None, processing_class: Any = None,
                 data_collator: Callable | None = None, hooks: TrainerHooks | None = None, hf_progress: bool = False,
                 eval_loss_full_batch_weight: bool = False, step_end: Callable[[], None] | None = None,
                 write_model: Callable[[str], None] | None = None,
                 finish_train_metrics: Callable[[dict], None] | None = None) -> None:
        self.args = args
        self._finish_train_metrics = finish_train_metrics
        self._step_end = step_end
        # HF appends PrinterCallback (disable_tqdm) or ProgressCallback after the user's callbacks. The facade asks
        # for HF's own bar (hf_progress=True, the output HF users know); the Lightning-native path keeps
        # Lightning's progress bar instead.
        if args.disable_tqdm:
            progress = [PrinterCallback]
        else:
            progress = [ProgressCallback] if hf_progress else []
        self.uses_hf_progress = bool(progress) and progress[0] is ProgressCallback
        # report_to's names without a Lightning logger run HF's own integration callbacks, where HF puts them.
        handler = CallbackHandler([DefaultFlowCallback, *reporting_callbacks(args), *(callbacks or []), *progress],
                                  None, processing_class, None, None)
        self.events = HFEvents(args, handler)
        self.hooks = hooks
        self.logbook = TrainingLog(self.events, processing_class)
        # HF's log and evaluate, through the override points when there are some.
        self._log = hooks.log if hooks is not None else self.logbook.log
        self.evaluation = TrainingEvaluation(self.events, self._log, eval_loss_full_batch_weight)
        self.saver = CheckpointSaver(args, processing_class, data_collator, write_model=write_model)
        self.resume = CheckpointResume(args, load_weights=None if hooks is None else hooks._load_from_checkpoint)
        # enable_jit_checkpoint: the SIGTERM handler and the stop at a safe point.
        self.jit = JITCheckpoint(bool(args.enable_jit_checkpoint))
        self.train_output: TrainOutput | None = None
        self.micro_in_epoch = 0
        self._module: Any = None
        self._quiet = QuietSpan()
        self._bar_total_pending = False

    # ------------------------------------------------------------------ HF's state and callback list
    @property
    def handler(self) -> CallbackHandler:
        """HF's ``CallbackHandler`` (the HF-style callbacks, in HF's order)."""
        return self.events.handler

    # The run's state and control live on the shared HFEvents, where the helpers read and replace them.
    state = property(lambda self: self.events.state, lambda self, value: setattr(self.events, "state", value),
                     doc="HF's ``TrainerState`` of the current (or last) run.")
    control = property(lambda self: self.events.control,
                       lambda self, value: setattr(self.events, "control", value), doc="HF's ``TrainerControl``.")

    def add_callback(self, callback: Any) -> None:
        self.handler.add_callback(callback)

    def pop_callback(self, callback: Any) -> Any:
        return self.handler.pop_callback(callback)

    def remove_callback(self, callback: Any) -> None:
        self.handler.remove_callback(callback)

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Lightning's banners and noise are hidden until teardown, as on the facade (hf_lightning.console).
        self._quiet.enter()
        pl_module.event_sink = self
        self._module = pl_module
        self.logbook.trainer = self.evaluation.trainer = trainer
        self.evaluation.module = pl_module
        self.handler.model = pl_module.model
        # Runs before Lightning reads ckpt_path: an HF checkpoint folder goes to the resume, whatever the strategy.
        if stage == "fit":
            self.resume.reset()
            self.jit.check_can_install()
        _compat.route_checkpoint_loading(trainer, functools.partial(self.resume.read, trainer))
        # An earlier fit's checkpoints finish flushing and rotating before this one looks at output_dir.
        wait_for_flushes()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # The checkpoints saved so far reach the disk before the error surfaces (their failures are only logged:
        # the original error is the one to report).
        self.jit.restore()
        wait_for_flushes()
        self._quiet.leave()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._quiet.leave()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        args, plan = self.args, pl_module.plan
        # First, after Lightning registered its own SIGTERM handler for the fit (which this one replaces).
        self.jit.install(trainer)
        self.control = TrainerControl()
        # HF replaces the fresh state by the checkpoint's, then re-applies this run's limits.
        state = self.resume.take_state()
        if state is None:
            state = TrainerState(stateful_callbacks=self.events.exportable_callbacks())
            state.train_batch_size = args.train_batch_size
            state.compute_steps(args, plan.max_steps)
        elif args.restore_callback_states_from_checkpoint:
            self.resume.restore_callback_states(state, self.events)
        state.max_steps = plan.max_steps
        state.num_train_epochs = plan.num_train_epochs
        state.is_local_process_zero = trainer.local_rank == 0
        state.is_world_process_zero = trainer.global_rank == 0
        self.state = state
        self.handler.optimizer, self.handler.lr_scheduler = fit_optimizer_and_scheduler(trainer)
        self.handler.train_dataloader = getattr(trainer.datamodule, "train_loader", lambda: None)()
        if self.resume.folder is not None:
            self.resume.restore_training(trainer, pl_module, state)
        self.logbook.start(pl_module.device)
        self.resume.restore_logging_window(self.logbook, trainer)
        self.saver.start(trainer, pl_module, state, self.resume.folder, started=self.logbook.start_time)
        self.events.fire("on_train_begin")
        if args.eval_on_start:
            self._evaluate(trainer, step_scheduler=False)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pl_module.stop_epoch_requested = False
        # A mid-epoch resume continues HF's epoch fraction from the skipped micro-batches.
        self.micro_in_epoch = self.resume.take_micro_batches_done()
        self._bar_total_pending = True
        self.logbook.record_step(None, None)
        self.events.fire("on_epoch_begin")
        self.resume.restore_rng(trainer, "epoch_start")

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self.resume.restore_rng(trainer, "mid_epoch")
        if self._bar_total_pending:
            # The bar set up its epoch in its own on_train_epoch_start; now it learns how many steps the epoch runs.
            self._bar_total_pending = False
            windows_done = -(-self.micro_in_epoch // pl_module.plan.gradient_accumulation_steps)
            set_train_bar_total(trainer, steps_this_epoch(trainer, windows_done))

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.evaluation.start_validation()
        # HF hands callbacks the eval dataloader (ProgressCallback sizes its bar from it).
        self.handler.eval_dataloader = _first(trainer.val_dataloaders)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A plain ``lightning.Trainer.validate(module, ...)``: report it as HF's ``evaluate()`` would.

        In-training evaluations and the facade's ``evaluate()`` report their metrics themselves.
        """
        if trainer.state.fn == "validate" and pl_module.eval_accumulators:
            self.evaluation.finish_validation(trainer, pl_module)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.handler.eval_dataloader = _first(trainer.test_dataloaders)

    def on_hf_event(self, event: str, **kwargs: Any) -> None:
        """An HF per-window event reported by the module while it runs a window."""
        if event == "on_micro_batch_end":
            self.micro_in_epoch += 1
            self.logbook.track_micro_batch(self._module, kwargs["inputs"], kwargs["loss"])
        else:
            self.events.fire(event)

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
        # A checkpoint whose background flush failed (a full disk) stops the run now, not at the next save.
        self.saver.raise_failed_flush()
        self.state.global_step = trainer.global_step
        self.state.epoch = pl_module.plan.epoch_progress(trainer.current_epoch, self.micro_in_epoch)
        self.logbook.record_step(outputs["grad_norm"], outputs["learning_rate"])
        self.events.fire("on_step_end")
        self._maybe_log_save_evaluate(trainer, pl_module)
        if trainer.global_step % pl_module.plan.update_steps_per_epoch:
            # A step that ends an epoch is a safe point only after the epoch's own log → evaluate → save.
            self._stop_on_sigterm(trainer, pl_module)
        if self.stop_requested():
            pl_module.stop_epoch_requested = True

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.should_stop:
            # A Lightning callback (EarlyStopping, Timer, the user's own) stopped the fit: HF's control says so too.
            self.control.should_training_stop = True
        if self.micro_in_epoch == 0:
            # HF: an epoch without a single batch (an exhausted iterable dataset) stops training.
            self.control.should_training_stop = True
        self.events.fire("on_epoch_end")
        if self.jit.stopped:
            # Stopped by a SIGTERM: nothing more is evaluated or saved (HF runs this epoch end's evaluation and
            # save after its JIT checkpoint, which the resumed run would then not see).
            trainer.should_stop = True
            return
        self._maybe_log_save_evaluate(trainer, pl_module)
        self._stop_on_sigterm(trainer, pl_module)
        if self.control.should_training_stop:
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # HF's last zero_grad (the module defers it to the next backward, and there is none).
        pl_module.release_gradients()
        # Every checkpoint on disk and rotated, as HF leaves them, before the best one is loaded or cleaned up.
        self.saver.wait_until_written()
        self.resume.reset()
        train_loss, metrics = self.logbook.summary(pl_module.plan.num_train_samples)
        if self._finish_train_metrics is not None:
            self._finish_train_metrics(metrics)
        self._log(metrics)
        # After a SIGTERM the checkpoint just written is kept, also with save_total_limit=1 (HF deletes it).
        self.saver.finish(trainer, pl_module, self.state, cleanup=not self.jit.stopped)
        self.events.fire("on_train_end")
        # Stopped on SLURM's requeue signal: the checkpoint is on disk, so the job may be requeued.
        self.jit.requeue(trainer)
        # HF puts the previous SIGTERM handler back at on_train_end.
        self.jit.restore()
        self.train_output = TrainOutput(self.state.global_step, train_loss, metrics)

    # ------------------------------------------------------------------ HF's log → evaluate → save
    def _maybe_log_save_evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._step_end is not None:
            self._step_end()
        else:
            self.log_evaluate_save()

    def log_evaluate_save(self) -> None:
        """HF's ``_maybe_log_save_evaluate``: log, then evaluate, then save, as the control flags ask.

        In this order so that the best-metric bookkeeping and the rotation see the fresh evaluation.
        """
        trainer = self.logbook.trainer
        if self.control.should_log and self.logbook.has_unlogged_steps():
            self._log(self.logbook.training_logs(), self.logbook.start_time)
        if self.control.should_evaluate:
            metrics = self._evaluate(trainer)
            if trainer.should_stop:
                # Lightning's EarlyStopping decided in on_validation_end: HF's control stops as after HF's
                # EarlyStoppingCallback (raised during the evaluation; this step's save still happens).
                self.control.should_training_stop = True
            is_new_best = update_best_metric(self.args, self.state, metrics)
            if enum_value(self.args.save_strategy) == "best":
                self.control.should_save = is_new_best
        if self.control.should_save:
            self.save_checkpoint()
            self.events.fire("on_save")

    def save_checkpoint(self) -> None:
        """Write ``checkpoint-{global_step}`` now (HF's ``_save_checkpoint``; ``on_save`` is the caller's)."""
        self.logbook.store_flos()
        self.saver.save(self.logbook.trainer, self._module, self.events)

    def evaluate_in_training(self, step_scheduler: bool = True) -> dict[str, float]:
        """HF's ``_evaluate``: the evaluation a step end runs, then a metric-driven scheduler's step."""
        return self._evaluate(self.logbook.trainer, step_scheduler)

    def _stop_on_sigterm(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """``enable_jit_checkpoint``: when any process got a SIGTERM, save ``checkpoint-{global_step}`` and stop.

        Called by every process at each safe point (an optimizer-step boundary after HF's log → evaluate → save).
        The save is skipped when this step's checkpoint was just written and no training loss awaits logging.
        """
        if not self.jit.should_stop_now(trainer):
            return
        if self.saver.saved_step != self.state.global_step or self.logbook.has_unlogged_steps():
            # HF's _save_checkpoint stores the FLOs; no on_save event (HF's JIT save fires none).
            self.logbook.store_flos()
            window = self.jit.logging_window(trainer, self.logbook)
            self.saver.save(trainer, pl_module, self.events, extra_callback_states={JIT_LOGGING_WINDOW_KEY: window})
            (self.state.stateful_callbacks or {}).pop(JIT_LOGGING_WINDOW_KEY, None)
        self.jit.stopped = True
        self.control.should_training_stop = True
        pl_module.stop_epoch_requested = True
        trainer.should_stop = True

    def _evaluate(self, trainer: pl.Trainer, step_scheduler: bool = True) -> dict[str, float]:
        metrics = self.hooks.evaluate() if self.hooks is not None else self.evaluate()
        if step_scheduler:
            step_metric_scheduler(trainer, metrics, self.args)
        return metrics

    # ------------------------------------------------------------------ HF-named methods (the facade's defaults)
    def hf_log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
        """HF's ``Trainer.log``: add ``epoch`` (and token counts), append to ``log_history``, fire ``on_log``.

        Named ``hf_log`` because Lightning overwrites a callback's ``log`` attribute with the module's.
        """
        self.logbook.log(logs, start_time)

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """HF's ``evaluate`` during training (see :meth:`TrainingEvaluation.evaluate`)."""
        return self.evaluation.evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def store_flos(self) -> None:
        """Move the FLOs counted since the last store into ``state.total_flos``."""
        self.logbook.store_flos()

    # ------------------------------------------------------------------ Lightning checkpoint state
    def state_dict(self) -> dict[str, Any]:
        return {"trainer_state": self.state.__dict__.copy()}


def _first(loaders: Any) -> Any:
    return loaders[0] if isinstance(loaders, (list, tuple)) and loaders else loaders


__all__ = ["HFFlowCallback", "TrainerCallback"]
