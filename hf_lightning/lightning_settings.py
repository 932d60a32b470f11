"""What HF's semantics need from the ``lightning.Trainer`` that fits an ``HFLightningModule``.

``build_lightning_trainer`` fills these settings from ``TrainingArguments``. A ``lightning.Trainer`` the user built
gets them from the module: ``HFLightningModule.configure_callbacks`` (Lightning's first module hook of a run, before
any logger, callback or ``setup`` touches the disk) calls :func:`check_fit_settings`, then
:func:`derive_fit_settings`.

- A setting that ``TrainingArguments`` decides, set otherwise on the trainer, is an error that names the Lightning
  setting and the fix: ``accumulate_grad_batches``, ``gradient_clip_val``, ``val_check_interval``,
  ``check_val_every_n_epoch``, a ``max_steps`` / ``max_epochs`` other than the arguments', mixed precision other
  than ``bf16`` / ``fp16`` in HF's autocast scope (:class:`~hf_lightning.precision.HFMixedPrecision`), and a
  ``ModelCheckpoint`` without ``monitor`` (Lightning's default one) while HF saves ``checkpoint-N`` folders.
- A Lightning default that would get in HF's way is derived: Lightning's validation trigger off (HF evaluates from
  the flow callback at optimizer steps), no sanity-check validation, no ``DistributedSampler`` (``HFDataModule``
  shards HF's way), and ``HFCheckpointIO`` as the strategy's ``CheckpointIO`` unless the user gave their own. The
  fit limits come from the training plan in the module's ``setup``.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.precision import MixedPrecision

from hf_lightning import _compat
from hf_lightning._utils import enum_value
from hf_lightning.args.validation import check_precision
from hf_lightning.checkpointing.io import HFCheckpointIO
from hf_lightning.precision import HFMixedPrecision

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments

#: ``check_val_every_n_epoch`` that never triggers Lightning's own validation (``build_lightning_trainer`` sets it).
VALIDATION_TRIGGER_OFF = sys.maxsize
# Lightning turns an unset max_epochs into 1000 when max_steps is unset too (with a PossibleUserWarning).
_LIGHTNING_DEFAULT_MAX_EPOCHS = 1000


class TrainerSettingsError(ValueError):
    """A ``lightning.Trainer`` setting conflicts with what ``TrainingArguments`` decide."""


def check_fit_settings(trainer: pl.Trainer, args: TrainingArguments,
                       applied_limits: tuple[int, int] | None = None) -> None:
    """Refuse trainer settings that would change HF's semantics, before the first step and before any disk write.

    Args:
        trainer: the ``lightning.Trainer`` about to fit.
        args: the module's ``TrainingArguments``.
        applied_limits: ``(max_steps, max_epochs)`` an earlier fit of this module set on this trainer from its plan
            (accepted as they are).

    Raises:
        TrainerSettingsError: every conflicting setting, each with its fix.
    """
    problems = []
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is None or not hasattr(datamodule, "train_micro_batches"):
        problems.append("HFLightningModule is trained through an HFDataModule: call "
                        "`trainer.fit(module, datamodule=HFDataModule(args, train_dataset=...))`.")
    if trainer.accumulate_grad_batches != 1:
        problems.append(
            f"lightning.Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}): gradient accumulation "
            f"comes from TrainingArguments(gradient_accumulation_steps=...) (now {args.gradient_accumulation_steps}),"
            " which also sets HF's loss scaling and step count. Remove accumulate_grad_batches from the "
            "lightning.Trainer and set gradient_accumulation_steps in TrainingArguments.")
    if trainer.gradient_clip_val is not None:
        problems.append(
            f"lightning.Trainer(gradient_clip_val={trainer.gradient_clip_val}): HF clips with "
            f"TrainingArguments(max_grad_norm=...) (now {args.max_grad_norm}) and logs the norm before clipping. "
            "Remove gradient_clip_val from the lightning.Trainer and set max_grad_norm in TrainingArguments.")
    interval = getattr(trainer, "val_check_interval", None)  # absent when the interval is a duration
    if not (isinstance(interval, float) and interval == 1.0):
        shown = "a duration" if interval is None else repr(interval)
        problems.append(
            f"lightning.Trainer(val_check_interval={shown}): HF evaluates when TrainingArguments(eval_strategy=..., "
            f"eval_steps=...) say (now eval_strategy={enum_value(args.eval_strategy)!r}), counted in optimizer "
            "steps. Remove val_check_interval from the lightning.Trainer and set eval_strategy / eval_steps.")
    if trainer.check_val_every_n_epoch not in (1, VALIDATION_TRIGGER_OFF):
        problems.append(
            f"lightning.Trainer(check_val_every_n_epoch={trainer.check_val_every_n_epoch!r}): HF evaluates when "
            f"TrainingArguments(eval_strategy=...) says (now {enum_value(args.eval_strategy)!r}). Remove "
            "check_val_every_n_epoch from the lightning.Trainer and set eval_strategy='epoch' (or 'steps').")
    problems += _limit_conflicts(trainer, args, applied_limits)
    problems += _precision_conflicts(trainer, args)
    if enum_value(args.save_strategy) != "no" and any(
            isinstance(cb, ModelCheckpoint) and cb.monitor is None for cb in trainer.callbacks):
        problems.append(
            "a ModelCheckpoint without `monitor` (Lightning adds one unless lightning.Trainer(enable_checkpointing="
            f"False)) would save Lightning .ckpt files beside HF's checkpoint-N folders (save_strategy="
            f"{enum_value(args.save_strategy)!r}). Pass lightning.Trainer(enable_checkpointing=False) to keep HF's "
            "saving only, give your own ModelCheckpoint(monitor=...) to keep Lightning's best-model files as well, "
            "or set save_strategy='no'.")
    if problems:
        raise TrainerSettingsError(
            "This lightning.Trainer conflicts with HF's TrainingArguments (nothing was run or written):\n- "
            + "\n- ".join(problems))


def _limit_conflicts(trainer: pl.Trainer, args: TrainingArguments,
                     applied_limits: tuple[int, int] | None) -> list[str]:
    applied_steps, applied_epochs = applied_limits if applied_limits is not None else (None, None)
    by_steps = args.max_steps is not None and args.max_steps > 0
    wanted = f"TrainingArguments(max_steps={args.max_steps}, num_train_epochs={args.num_train_epochs})"
    problems = []
    max_steps = trainer.max_steps
    if max_steps not in (-1, applied_steps) and not (by_steps and max_steps == args.max_steps):
        problems.append(
            f"lightning.Trainer(max_steps={max_steps}) differs from {wanted}, which decide the training length and "
            f"the learning-rate schedule. Remove max_steps from the lightning.Trainer and set "
            f"TrainingArguments(max_steps={max_steps}) (or give both the same value).")
    max_epochs = trainer.max_epochs
    unset = {None, -1, applied_epochs}
    if trainer.max_steps == -1:
        unset.add(_LIGHTNING_DEFAULT_MAX_EPOCHS)
    if max_epochs not in unset and not (not by_steps and max_epochs == math.ceil(args.num_train_epochs)):
        fix = (f"TrainingArguments(num_train_epochs={max_epochs})" if not by_steps
               else "num_train_epochs in TrainingArguments with max_steps=-1 (max_steps > 0 overrides epochs in HF)")
        problems.append(
            f"lightning.Trainer(max_epochs={max_epochs}) differs from {wanted}, which decide the training length and "
            f"the learning-rate schedule. Remove max_epochs from the lightning.Trainer and set {fix}.")
    return problems


def _precision_conflicts(trainer: pl.Trainer, args: TrainingArguments) -> list[str]:
    try:
        check_precision(args)
    except ValueError as error:
        return [str(error)]
    wanted = "bf16-mixed" if args.bf16 else "16-mixed" if args.fp16 else None
    plugin = trainer.precision_plugin
    hf_scope = isinstance(plugin, HFMixedPrecision)
    device = "cpu" if isinstance(trainer.accelerator, CPUAccelerator) else "cuda"
    fix = (f"pass lightning.Trainer(plugins=[HFMixedPrecision({wanted or 'bf16-mixed'!r}, {device!r})]) (from "
           "hf_lightning.precision) instead of precision=..., or build the trainer with build_lightning_trainer(args)")
    if wanted is not None and not (hf_scope and trainer.precision == wanted):
        flag = "bf16" if args.bf16 else "fp16"
        return [f"TrainingArguments({flag}=True) trains in {wanted!r} with HF's autocast scope (the model's forward "
                f"only), but this lightning.Trainer runs precision={trainer.precision!r}"
                f"{'' if hf_scope else ' with ' + type(plugin).__name__}: {fix}."]
    if wanted is None and isinstance(plugin, MixedPrecision):
        return [f"lightning.Trainer(precision={trainer.precision!r}) is mixed precision, which TrainingArguments "
                "decide (bf16=True / fp16=True; now neither), and Lightning's plugin autocasts the whole training "
                f"step where HF autocasts the model's forward only: set bf16=True (or fp16=True) and {fix}."]
    return []


def derive_fit_settings(trainer: pl.Trainer) -> None:
    """Turn off the Lightning defaults that would get in HF's way (see the module docstring); idempotent."""
    # Lightning's trigger counts micro-batches and runs after the save point; the flow callback evaluates instead.
    trainer.check_val_every_n_epoch = VALIDATION_TRIGGER_OFF
    # HF runs no validation before training (it would fire on_prediction_step and evaluate out of HF's order).
    trainer.num_sanity_val_steps = 0
    _compat.disable_distributed_sampler(trainer)
    strategy = trainer.strategy
    if type(strategy.checkpoint_io) is TorchCheckpointIO:
        # Lightning's default; a CheckpointIO the user chose stays (HF folders then go through a plain HFCheckpointIO).
        strategy.checkpoint_io = HFCheckpointIO()


__all__ = ["TrainerSettingsError", "VALIDATION_TRIGGER_OFF", "check_fit_settings", "derive_fit_settings"]
