"""``CheckpointSaver``: HF's ``checkpoint-N`` saves during a fit, their rotation, and the end-of-training steps.

When the flow raises ``should_save`` HF's Trainer stores the stateful callbacks' state in ``TrainerState``, writes
the folder (model, optimizer, scheduler, scaler, RNG, ``trainer_state.json`` last) and rotates older folders
(``save_total_limit``, keeping the best one). Here the folder goes through the strategy's ``CheckpointIO``
(:class:`~hf_lightning.checkpointing.io.HFCheckpointIO`), its ``fsync`` and the rotation run on a background thread
on one process (:mod:`hf_lightning.checkpointing.durability`). Checkpoints an earlier run left in ``output_dir``
are never rotated away. When training ends this class loads the best model (``load_best_model_at_end``) and does
HF's extra cleanup for ``save_total_limit=1``.

Only the saving process(es) touch the file system (``save_on_each_node`` makes that one per node).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl

from hf_lightning._utils import enum_value
from hf_lightning.callbacks.events import HFEvents
from hf_lightning.checkpointing.durability import raise_failed_jobs, run_in_background, wait_for_flushes
from hf_lightning.checkpointing.io import HFCheckpointIO
from hf_lightning.checkpointing.layout import checkpoint_folder_name
from hf_lightning.checkpointing.model_state import ModelState, WrittenBy, model_state_for, prepare_model_saving
from hf_lightning.checkpointing.reader import load_model_weights
from hf_lightning.checkpointing.rotation import (
    clean_stale_temporary_folders,
    final_cleanup_for_limit_one,
    foreign_checkpoints,
    rotate_checkpoints,
)
from hf_lightning.checkpointing.writer import CheckpointContents, is_saving_process
from hf_lightning.optim import fit_optimizer_and_scheduler
from hf_lightning.state import TrainerState

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments

logger = logging.getLogger(__name__)


class CheckpointSaver:
    """Writes HF checkpoints during a fit and finishes them when it ends.

    Args:
        args: a ``TrainingArguments`` (``output_dir``, ``save_strategy``, ``save_total_limit``,
            ``save_only_model``, ``save_on_each_node``, ``load_best_model_at_end``).
        processing_class: saved with every checkpoint.
        data_collator: its tokenizer is saved when there is no processing class.
        write_model: ``write_model(folder)`` writes the model's files of each checkpoint instead of the model's
            own kind (a ``Trainer`` subclass's ``save_model`` / ``_save``, as HF's ``_save_checkpoint`` calls them:
            on every process, so that an FSDP2 model's gather meets everywhere).
    """

    def __init__(self, args: TrainingArguments, processing_class: Any = None, data_collator: Any = None,
                 write_model: Callable[[str], None] | None = None) -> None:
        self.args = args
        self.write_model = write_model
        self.processing_class = processing_class
        self.data_collator = data_collator
        # Checkpoints an earlier run left in output_dir (not the lineage being resumed): never rotated away.
        self.foreign_checkpoints: set[str] = set()
        #: The step of this fit's last ``checkpoint-N``, or ``None``.
        self.saved_step: int | None = None

    def is_saving_process(self, trainer: pl.Trainer) -> bool:
        """Whether this process writes checkpoints: global rank 0, or local rank 0 with ``save_on_each_node``."""
        return is_saving_process(self.args, trainer.global_rank, trainer.local_rank)

    def start(self, trainer: pl.Trainer, module: Any, state: TrainerState, resume_dir: str | None,
              started: float) -> None:
        """Look at ``output_dir`` before training: stale temporary folders, foreign checkpoints, a cut rotation.

        Args:
            trainer: the fit's trainer.
            module: the ``HFLightningModule`` (its model is warmed up for saving).
            state: the state training starts from.
            resume_dir: the checkpoint being resumed, if any (its lineage is this run's, not foreign).
            started: when training started; temporary folders older than that are removed.
        """
        args = self.args
        self.foreign_checkpoints = set()
        self.saved_step = None
        if args.load_best_model_at_end and enum_value(args.save_strategy) != "no":
            # On every process, before the first step: a best model that cannot be loaded fails now, not at the end.
            model_state_for(module.model).check_loadable(module.model)
        if not self.is_saving_process(trainer):
            return
        # Folders a killed save or deletion left behind are never picked up, but they take disk space.
        clean_stale_temporary_folders(args.output_dir, older_than=started)
        if enum_value(args.save_strategy) != "no":
            prepare_model_saving(module.model)
        foreign = foreign_checkpoints(args.output_dir, resume_dir)
        self.foreign_checkpoints = set(foreign)
        if resume_dir is not None:
            # Finish a rotation a kill interrupted (between a save and its rotation): with no save left to
            # train, the resumed lineage would otherwise keep one folder more than save_total_limit.
            rotate_checkpoints(args.output_dir, save_total_limit=args.save_total_limit,
                               best_model_checkpoint=state.best_model_checkpoint, use_mtime=True, keep=foreign,
                               protect=[resume_dir])
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

    def save(self, trainer: pl.Trainer, module: Any, events: HFEvents,
             extra_callback_states: dict[str, Any] | None = None) -> None:
        """Write ``checkpoint-{global_step}`` (every process takes part; the saving ones write) and rotate.

        ``extra_callback_states`` (``{name: state}``) go into ``trainer_state.json``'s ``stateful_callbacks``."""
        args, state = self.args, events.state
        # The previous save's flush and rotation finish first, so this one starts from the folders HF would see.
        self.wait_until_written()
        run_dir = args.output_dir
        should_save = self.is_saving_process(trainer)
        if should_save:
            for cb in events.exportable_callbacks():
                name = type(cb).__name__
                if isinstance(state.stateful_callbacks.get(name), list):
                    state.stateful_callbacks[name].append(cb.state())
                else:
                    state.stateful_callbacks[name] = cb.state()
        optimizer, scheduler = fit_optimizer_and_scheduler(trainer)
        foreign = self.foreign_checkpoints
        folder = str(Path(run_dir) / checkpoint_folder_name(state.global_step))
        # One process: the fsync, then the rotation, run on a background thread (checkpointing/durability.py).
        in_background = trainer.world_size == 1
        payload = CheckpointContents(
            state.global_step,
            model=module.model,
            optimizer=optimizer,
            scheduler=scheduler,
            state=state,
            args=args,
            processing_class=self.processing_class,
            data_collator=self.data_collator,
            save_only_model=args.save_only_model,
            process_index=trainer.global_rank,
            world_size=trainer.world_size,
            should_save=should_save,
            scaler=getattr(trainer.precision_plugin, "scaler", None),
            barrier=trainer.strategy.barrier if trainer.world_size > 1 else None,
            # A process whose part fails (a full disk) tells the others, so every process raises, none waits.
            all_succeeded=(functools.partial(trainer.strategy.reduce_boolean_decision, all=True)
                           if trainer.world_size > 1 else None),
            # An earlier run's folder of this name is kept aside, not deleted.
            keep_replaced=folder in foreign,
            flush_in_background=in_background,
            model_state=self._model_state(module.model, trainer),
            extra_callback_states=extra_callback_states,
        )
        # Through the strategy's CheckpointIO, so a user's CheckpointIO plugin sees HF checkpoints too.
        checkpoint_io = trainer.strategy.checkpoint_io
        if not isinstance(checkpoint_io, HFCheckpointIO):
            checkpoint_io = HFCheckpointIO()
        checkpoint_io.save_checkpoint(payload, run_dir)
        self.saved_step = state.global_step
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

    def _model_state(self, model: Any, trainer: pl.Trainer) -> ModelState:
        # Under FSDP2 the layout HF's FSDP run writes for fsdp_config["state_dict_type"] (the strategy's plan).
        plan = getattr(trainer.strategy, "plan", None)
        state = model_state_for(model, getattr(plan, "state_dict_type", "FULL_STATE_DICT"))
        return state if self.write_model is None else WrittenBy(state, self.write_model)

    @staticmethod
    def wait_until_written() -> None:
        """Wait until every checkpoint saved so far is on disk and rotated (raises a failed background flush)."""
        wait_for_flushes(raise_failures=True)

    @staticmethod
    def raise_failed_flush() -> None:
        """Raise, without waiting, a background flush or rotation that has failed (its checkpoint was withdrawn)."""
        raise_failed_jobs()

    def finish(self, trainer: pl.Trainer, module: Any, state: TrainerState, cleanup: bool = True) -> None:
        """HF's end of training: load the best model (``load_best_model_at_end``), then the ``save_total_limit=1``
        cleanup (call :meth:`wait_until_written` first; ``cleanup=False`` skips it)."""
        args = self.args
        if args.load_best_model_at_end and state.best_model_checkpoint is not None:
            load_model_weights(module.model, state.best_model_checkpoint, strict=False)
        if cleanup and self.is_saving_process(trainer) and state.best_model_checkpoint is not None \
                and args.save_total_limit == 1:
            # An earlier run's folders are not this run's to delete (see start).
            final_cleanup_for_limit_one(args.output_dir, state.best_model_checkpoint, keep=self.foreign_checkpoints)
