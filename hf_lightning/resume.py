"""``CheckpointResume``: the one place that applies an HF ``checkpoint-N`` folder to a running fit.

``Trainer.train(resume_from_checkpoint=...)`` and ``lightning.Trainer.fit(ckpt_path=<folder>)`` both end here. HF
restores a checkpoint in three moments, and so does this class:

1. **When Lightning reads ``ckpt_path``** — after the setup hooks, before the optimizers exist. The flow callback
   routes the strategy's ``load_checkpoint`` to :meth:`CheckpointResume.read` (``_compat.route_checkpoint_loading``),
   so this works whatever the strategy, also one that never asks its ``CheckpointIO`` (FSDP,
   ``ModelParallelStrategy``). The folder is validated, the model weights are loaded as HF loads them
   (``strict=False``, tied weights stored once), ``trainer_state.json`` is read, and the datamodule is told how
   many windows (optimizer steps) of the current epoch are done, which its loader skips by index. Lightning gets a
   checkpoint dict that restores nothing more.
2. **When training starts** (the flow callback's ``on_train_start``): the checkpoint's ``TrainerState`` replaces
   the fresh one, the stateful callbacks get their saved state (``restore_callback_states_from_checkpoint``), every
   pickle-based file is verified before any is applied, the optimizer, scheduler and scaler are loaded, and
   Lightning's step and epoch counters are fast-forwarded to the checkpoint's.
3. **At the start of the first epoch** (``on_train_epoch_start``, checkpoint at an epoch end) **or before the first
   window runs** (``on_train_batch_start``, checkpoint mid-epoch): the RNG states, at HF's moment.

Lightning's own ``.ckpt`` files are not HF folders and load through the strategy as usual.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch

from hf_lightning import _compat
from hf_lightning.checkpointing.layout import JIT_LOGGING_WINDOW_KEY, TRAINER_STATE_NAME
from hf_lightning.checkpointing.model_state import model_state_for
from hf_lightning.checkpointing.paths import is_hf_checkpoint_dir, validate_checkpoint_dir
from hf_lightning.checkpointing.reader import load_model_weights, load_optimizer_and_scheduler, load_scaler
from hf_lightning.checkpointing.rng import restore_rng_state
from hf_lightning.checkpointing.safe_load import verify_checkpoint_files
from hf_lightning.optim import fit_optimizer_and_scheduler
from hf_lightning.state import TrainerState

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments
    from hf_lightning.callbacks.events import HFEvents

logger = logging.getLogger(__name__)


class CheckpointResume:
    """Restores a fit from an HF ``checkpoint-N`` folder in HF's order (see the module docstring).

    Args:
        args: a ``TrainingArguments`` (``ignore_data_skip``, ``restore_callback_states_from_checkpoint`` and the
            step settings compared with the checkpoint's).
        load_weights: ``load_weights(folder)`` loads the model's weights when a fit resumes (the facade passes
            ``Trainer._load_from_checkpoint``, HF's override point); by default the model's kind loads them.

    Attributes:
        folder: the checkpoint this fit resumes from, or ``None``.
    """

    def __init__(self, args: TrainingArguments, load_weights: Callable[[str], None] | None = None) -> None:
        self.args = args
        self.load_weights = load_weights
        self.folder: str | None = None
        self._state: TrainerState | None = None
        self._micro_batches_done = 0
        self._rng_moment: str | None = None
        self._logging_window: dict[str, Any] | None = None

    def reset(self) -> None:
        """Forget any earlier fit's checkpoint (a new fit resumes only from its own ``ckpt_path``)."""
        self.folder, self._state, self._micro_batches_done, self._rng_moment = None, None, 0, None
        self._logging_window = None

    # ------------------------------------------------------------------ 1. Lightning reads ckpt_path
    def read(self, trainer: pl.Trainer, path: Any) -> dict[str, Any] | None:
        """Open ``path`` if it is an HF checkpoint folder: load the weights and, for a fit, the training state.

        Args:
            trainer: the ``lightning.Trainer`` whose ``ckpt_path`` is being read.
            path: the ``ckpt_path``.

        Returns:
            The checkpoint dict Lightning's restore goes on with (it restores nothing further), or ``None`` when
            ``path`` is not a folder (a Lightning ``.ckpt`` file, for the strategy to load).

        Raises:
            ValueError: the folder holds no model weights (HF's message).
        """
        if not is_hf_checkpoint_dir(path):
            return None
        path = validate_checkpoint_dir(path)
        module = trainer.lightning_module
        if self.load_weights is not None and trainer.state.fn == "fit":
            self.load_weights(path)
        else:
            load_model_weights(module.model, path, strict=False)
        if trainer.state.fn == "fit":
            self._read_training_state(trainer, module, path)
        return {
            # The module's own weights, which it already holds: Lightning's strict load of them changes nothing.
            "state_dict": module.state_dict(),
            # Empty: the optimizer and scheduler exist only later; they are loaded when training starts.
            "optimizer_states": [],
            "lr_schedulers": [],
            "callbacks": {},
            "pytorch-lightning_version": pl.__version__,
        }

    def _read_training_state(self, trainer: pl.Trainer, module: Any, path: str) -> None:
        self.reset()
        self.folder = path
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
        _warn_changed_args(self.args, state)
        self._state = state
        plan = module.plan
        windows_done = 0 if self.args.ignore_data_skip \
            else state.global_step % plan.update_steps_per_epoch
        self._micro_batches_done = windows_done * plan.gradient_accumulation_steps
        datamodule = trainer.datamodule
        if datamodule is not None and windows_done:
            datamodule.skip_first_windows(windows_done)

    # ------------------------------------------------------------------ 2. training starts
    def take_state(self) -> TrainerState | None:
        """The checkpoint's ``TrainerState`` (once), which replaces the fresh state as in HF; ``None`` otherwise."""
        state, self._state = self._state, None
        if state is not None and state.stateful_callbacks:
            # A SIGTERM checkpoint's logging window is not a callback's state: taken out here, put back by
            # restore_logging_window, and never carried into later checkpoints.
            self._logging_window = state.stateful_callbacks.pop(JIT_LOGGING_WINDOW_KEY, None)
        return state

    def restore_logging_window(self, logbook: Any, trainer: pl.Trainer) -> None:
        """Put a SIGTERM checkpoint's training-loss window back into ``logbook`` (after its ``start``).

        HF's resume starts a new logging window, so the next ``loss`` averages only the steps after the resume;
        a checkpoint ``enable_jit_checkpoint`` wrote at a step between two logs keeps each process's loss sum and
        the last logged step, so the next ``loss`` is the one a run never stopped logs. Applied only for the
        checkpoint's step and process count.
        """
        window, self._logging_window = self._logging_window, None
        saved = (window or {}).get("attributes", {})
        losses = saved.get("tr_loss") or []
        if saved.get("global_step") != logbook.events.state.global_step or len(losses) != trainer.world_size:
            return
        tr_loss = logbook.tr_loss
        logbook.tr_loss = torch.tensor(losses[trainer.global_rank], dtype=tr_loss.dtype, device=tr_loss.device)
        logbook.globalstep_last_logged = int(saved["globalstep_last_logged"])

    def restore_callback_states(self, state: TrainerState, events: HFEvents) -> None:
        """HF's ``restore_callback_states_from_checkpoint``: rebuild each saved stateful callback (and the control).

        For each saved class name, the attached callbacks of that class are paired in order with the saved states
        (several instances are stored as a list: the i-th gets the i-th state). Each pair gives a new instance built
        from the saved args with the saved attributes set; it replaces the attached one and, as in HF, goes to the
        end of the callback list. Saved classes that match no attached callback are ignored with HF's warning.
        """
        attached = list(events.handler.callbacks) + [events.control]
        not_found: list[str] = []
        rebuilt: list[Any] = []
        for name, saved in (state.stateful_callbacks or {}).items():
            same_class = [cb for cb in attached if type(cb).__name__ == name]
            if not same_class:
                not_found.append(name)
                continue
            for cb, entry in zip(same_class, saved if isinstance(saved, list) else [saved]):
                new = type(cb)(**entry.get("args", {}))
                for key, value in entry.get("attributes", {}).items():
                    setattr(new, key, value)
                if cb is events.control:
                    events.control = new
                else:
                    events.handler.remove_callback(cb)
                    rebuilt.append(new)
        if not_found:
            logger.warning(
                "Checkpoint included callbacks not included in current configuration. Ignoring. (%s)",
                ", ".join(not_found),
            )
        for new in rebuilt:
            events.handler.add_callback(new)

    def restore_training(self, trainer: pl.Trainer, module: Any, state: TrainerState) -> None:
        """Verify the folder, load optimizer / scheduler / scaler, and fast-forward Lightning to ``state``'s step."""
        path = self.folder
        # Every pickle-based file of the folder is judged (nothing untrusted unpickled) before any is applied.
        verify_checkpoint_files(path)
        load_optimizer_and_scheduler(*fit_optimizer_and_scheduler(trainer), path, model=module.model,
                                     model_state=model_state_for(module.model))
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            load_scaler(scaler, path)
        plan = module.plan
        _compat.fast_forward(trainer, state.global_step, state.global_step // plan.update_steps_per_epoch)
        # HF restores the RNG right before the first forward when resuming mid-epoch, and before the epoch's
        # data iterator exists at an epoch boundary (that iterator then draws its seed from the restored RNG).
        self._rng_moment = "mid_epoch" if self._micro_batches_done else "epoch_start"
        if state.global_step >= plan.max_steps:
            logger.warning(
                "Resumed from %s at step %d, which already reaches max_steps=%d: no step is left to train. "
                "Raise max_steps / num_train_epochs to train further.",
                path, state.global_step, plan.max_steps,
            )

    def take_micro_batches_done(self) -> int:
        """Micro-batches of the current epoch the checkpoint had done (once; HF's epoch fraction goes on from
        there)."""
        done, self._micro_batches_done = self._micro_batches_done, 0
        return done

    # ------------------------------------------------------------------ 3. the first window
    def restore_rng(self, trainer: pl.Trainer, moment: str) -> None:
        """Restore the checkpoint's RNG states if this is ``moment`` of the first epoch after a resume (no-op
        otherwise).

        HF restores them before the epoch's data iterator exists when the checkpoint ends an epoch (the iterator
        then draws its base seed, the first batches' transforms and collator draws from the restored RNG):
        ``moment="epoch_start"``, called from ``on_train_epoch_start``, before the first window is requested. When
        the checkpoint is mid-epoch, HF restores after the first window following the skipped batches was
        fetched (with the look-ahead batch), right before its forward: ``moment="mid_epoch"``, called from
        ``on_train_batch_start``.
        """
        if self._rng_moment != moment:
            return
        restore_rng_state(self.folder, trainer.global_rank, trainer.world_size)
        self._rng_moment = None


def _warn_changed_args(args: TrainingArguments, state: TrainerState) -> None:
    """HF's ``compare_trainer_and_checkpoint_args``: one warning listing each changed value, HF's wording."""
    lines = [
        f"\n\t{name}: {getattr(args, name)} (from args) != {saved} (from trainer_state.json)"
        for name, saved in (("logging_steps", state.logging_steps), ("eval_steps", state.eval_steps),
                            ("save_steps", state.save_steps))
        if getattr(args, name, None) is not None and saved is not None and getattr(args, name) != saved
    ]
    if state.train_batch_size is not None:
        # HF compares the per-device size with the saved total divided by the GPU count.
        saved_per_device = state.train_batch_size // max(1, args.n_gpu)
        if args.per_device_train_batch_size != saved_per_device:
            lines.append(f"\n\tper_device_train_batch_size: {args.per_device_train_batch_size} (from args) != "
                         f"{saved_per_device} (from trainer_state.json)")
    if lines:
        logger.warning(
            "Warning: The following arguments do not match the ones in the `trainer_state.json` within the "
            "checkpoint directory: %s", "".join(lines),
        )
