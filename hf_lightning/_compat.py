"""Every access to a Lightning or torch private in one place, so an upgrade breaks one module.

Each function here has a test in ``tests/unit/test_compat.py`` that exercises it against the installed
Lightning and torch. Lightning is imported for type hints only, so pure modules may use the torch helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from torch import nn


def set_fit_limits(trainer: pl.Trainer, max_steps: int, max_epochs: int) -> None:
    """Set the fit loop's step/epoch limits once the dataset length is known (inside ``setup('fit')``).

    ``build_lightning_trainer`` cannot know HF's ``max_steps`` before the datamodule exists, so the module sets
    it when ``fit`` starts. Lightning reads both limits from the loops on every check.
    """
    trainer.fit_loop.epoch_loop.max_steps = max_steps
    trainer.fit_loop.max_epochs = max_epochs


def run_validation_in_fit(trainer: pl.Trainer) -> None:
    """Run Lightning's validation loop now, from inside a training-batch hook.

    HF evaluates right after logging at a step and before saving; Lightning's own trigger
    (``val_check_interval``) counts batches and runs after every ``on_train_batch_end``, so we disable it
    (``check_val_every_n_epoch`` far beyond the run) and call the loop the way ``_TrainingEpochLoop.on_advance_end``
    does.
    """
    epoch_loop = trainer.fit_loop.epoch_loop
    trainer.validating = True
    first_loop_iter = trainer._logger_connector._first_loop_iter
    epoch_loop.val_loop.run()
    trainer.training = True
    trainer._logger_connector._first_loop_iter = first_loop_iter


def publish_metrics(trainer: pl.Trainer, callback: dict[str, Any], logged: dict[str, Any],
                    progress_bar: dict[str, Any]) -> None:
    """Add values to ``trainer.callback_metrics`` / ``logged_metrics`` / ``progress_bar_metrics`` now.

    HF logs at moments where ``LightningModule.log`` is refused (``on_train_end``) or would reach the loggers only
    every ``log_every_n_steps`` batches, so HF's logs are written into the dicts behind those three public
    properties, which return the logger connector's own dicts. Lightning keeps them until the next ``fit`` /
    ``validate`` / ``test`` resets them, and merges its own ``self.log`` values over them.
    """
    connector = trainer._logger_connector
    connector.callback_metrics.update(callback)
    connector.logged_metrics.update(logged)
    connector.progress_bar_metrics.update(progress_bar)


def grad_scale(trainer: pl.Trainer) -> float | None:
    """The fp16 GradScaler's current scale, or ``None`` without one.

    GradScaler lowers its scale exactly when it found inf/nan gradients and skipped ``optimizer.step``; HF then
    skips ``scheduler.step``, so the module compares the scale before and after a step.
    """
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    return None if scaler is None else float(scaler.get_scale())


def is_last_eval_batch(trainer: pl.Trainer) -> bool:
    """Whether the batch being evaluated is the last of its dataloader (HF's ``end_of_dataloader``)."""
    loop = trainer._active_loop
    progress = getattr(loop, "batch_progress", None)
    return bool(getattr(progress, "is_last_batch", False))


def fast_forward(trainer: pl.Trainer, global_step: int, epoch: int) -> None:
    """Start the fit loop at HF's ``global_step`` inside loop epoch ``epoch`` (resume from an HF checkpoint).

    Lightning restores these counters from its own ``.ckpt`` files; an HF folder has none, so we set the same
    progress trackers as a fresh start at that epoch: ``trainer.global_step`` (optimizer steps), the epoch that
    samplers' ``set_epoch`` receives and ``trainer.current_epoch``. Called from ``on_train_start``, before the
    first epoch begins.
    """
    fit_loop = trainer.fit_loop
    for tracker in (fit_loop.epoch_progress.total, fit_loop.epoch_progress.current):
        tracker.ready = tracker.started = tracker.processed = tracker.completed = epoch
    steps = fit_loop.epoch_loop.manual_optimization.optim_step_progress
    for tracker in (steps.total, steps.current):
        tracker.ready = tracker.completed = global_step
    fit_loop.epoch_loop._batches_that_stepped = global_step


def attached_trainer(module: Any) -> pl.Trainer | None:
    """The ``pl.Trainer`` a ``LightningModule`` is attached to, or ``None`` (``module.trainer`` raises instead)."""
    return getattr(module, "_trainer", None)


#: The attribute Lightning sets on the ``LightningModule`` around every hook call (the running hook's name, a
#: plain string or None); the module stores it without ``nn.Module.__setattr__``'s bookkeeping.
CURRENT_HOOK_NAME_ATTRIBUTE = "_current_fx_name"


def registered_parameter_names(module: nn.Module) -> list[str]:
    """The names of ``module``'s own parameters (not its children's), including those registered as ``None``.

    HF's weight-decay grouping lists ``module._parameters``; ``named_parameters(recurse=False)`` would skip the
    ``None`` entries and change nothing else.
    """
    return list(module._parameters)


class _RoutedCheckpointLoad:
    """``strategy.load_checkpoint`` with the paths ``read`` recognises answered by ``read`` first."""

    def __init__(self, original: Any, read: Callable[[Any], dict | None]) -> None:
        self.original = original
        self.read = read

    def __call__(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> dict:
        checkpoint = self.read(checkpoint_path)
        return self.original(checkpoint_path, *args, **kwargs) if checkpoint is None else checkpoint


def route_checkpoint_loading(trainer: pl.Trainer, read: Callable[[Any], dict | None]) -> None:
    """Let ``read`` answer this trainer's reads of ``ckpt_path`` before its strategy does, whatever the strategy.

    ``fit(ckpt_path=...)`` (and ``validate`` / ``test``) read the checkpoint with ``trainer.strategy.load_checkpoint``
    after the setup hooks. The default strategies ask their ``CheckpointIO``, but FSDP and ``ModelParallelStrategy``
    override ``load_checkpoint`` and never do, so an HF folder is routed here, on the strategy instance. Called
    again (a later fit), the route replaces the earlier one.

    Args:
        trainer: the trainer whose strategy reads the checkpoint.
        read: ``fn(path)`` returning the checkpoint dict for Lightning's restore, or ``None`` to leave ``path`` to
            the strategy.
    """
    strategy = trainer.strategy
    current = strategy.load_checkpoint
    original = current.original if isinstance(current, _RoutedCheckpointLoad) else current
    strategy.load_checkpoint = _RoutedCheckpointLoad(original, read)


def disable_distributed_sampler(trainer: pl.Trainer) -> None:
    """``lightning.Trainer(use_distributed_sampler=False)``, applied to a trainer that already exists.

    Lightning's default (``True``) swaps each ``DataLoader``'s sampler for a ``DistributedSampler`` when several
    processes run; ``HFDataModule`` already shards its loaders HF's way, so a user-built trainer gets it turned off
    before the loaders are built. The flag is read from the accelerator connector when each loader is prepared.
    """
    trainer._accelerator_connector.use_distributed_sampler = False


def checkpoint_wrapper(module: nn.Module) -> nn.Module:
    """``module`` wrapped for activation checkpointing as accelerate's FSDP2 preparation wraps a layer.

    torch's ``checkpoint_wrapper`` lives in the private ``torch.distributed.algorithms._checkpoint`` package;
    accelerate calls it with ``preserve_rng_state=False`` (dropout masks are not replayed from a saved RNG state).
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper as wrap

    return wrap(module, preserve_rng_state=False)


def checkpoint_wrapped_inner(module: nn.Module) -> nn.Module:
    """The layer inside a :func:`checkpoint_wrapper`, or ``module`` itself when it is not one."""
    return getattr(module, "_checkpoint_wrapped_module", module)


def take_lightning_sigterm(trainer: pl.Trainer) -> bool:
    """Whether Lightning's own SIGTERM handler caught a signal during this fit; clears it.

    ``enable_jit_checkpoint`` replaces Lightning's handler when training starts, and a SIGTERM Lightning caught
    before that becomes its request. Left set, the flag would make Lightning's loops raise ``SIGTERMException``
    (a ``SystemExit``) after the next batch, before the checkpoint.
    """
    connector = trainer._signal_connector
    received = bool(connector.received_sigterm)
    connector.received_sigterm = False
    return received


def slurm_requeue_signal(trainer: pl.Trainer) -> int | None:
    """The signal Lightning's ``SLURMEnvironment`` requeues the job on, when this fit runs under one with
    ``auto_requeue`` (Lightning installs its handler for it during the fit); ``None`` otherwise."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    environment = trainer._accelerator_connector.cluster_environment
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue and environment.requeue_signal:
        return environment.requeue_signal
    return None
