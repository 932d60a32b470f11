"""Lightning's ``CheckpointIO`` for HF ``checkpoint-N`` folders: the entry point both trainers save and load through.

``HFCheckpointIO`` lets ``lightning.Trainer.fit(..., ckpt_path=<checkpoint folder>)`` resume from a folder that
HF's Trainer or hf_lightning wrote. Lightning asks the strategy's ``CheckpointIO`` for a checkpoint dict; for an
HF folder we return a small *marker* dict and let the module and the flow callback restore from the folder in
their ``on_load_checkpoint`` hooks with HF's rules (weights now; optimizer, scheduler, RNG and the data position
when training starts). Lightning's own ``.ckpt`` files still load as usual.
"""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from hf_lightning.checkpointing.completeness import has_model_weights
from hf_lightning.checkpointing.layout import TRAINER_STATE_NAME
from hf_lightning.checkpointing.paths import get_last_checkpoint
from hf_lightning.checkpointing.writer import CheckpointContents, write_checkpoint

#: Key of the marker dict that carries the HF checkpoint folder through Lightning's restore.
HF_CHECKPOINT_KEY = "hf_checkpoint_dir"


def is_hf_checkpoint_dir(path: Any) -> bool:
    return isinstance(path, (str, os.PathLike)) and os.path.isdir(path)


def validate_checkpoint_dir(path: str | os.PathLike) -> str:
    """Return ``path`` if it is a loadable HF checkpoint folder, else raise HF's error (with a hint)."""
    path = os.fspath(path)
    if not os.path.isdir(path) or not has_model_weights(path):
        raise ValueError(
            f"Can't find a valid checkpoint at {path}: the folder is missing or holds no model weights "
            "(model.safetensors, pytorch_model.bin or a sharded index). Pass a complete checkpoint-N folder, or "
            "resume_from_checkpoint=True to pick the last complete one in output_dir."
        )
    return path


def resolve_resume_checkpoint(resume_from_checkpoint: Any, output_dir: str) -> str | None:
    """HF's handling of ``train(resume_from_checkpoint=...)``: False/None → None, True → last checkpoint."""
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is True:
        last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        if last is None:
            raise ValueError(f"No valid checkpoint found in output directory ({output_dir})")
        return last
    return validate_checkpoint_dir(resume_from_checkpoint)


class HFCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` that also reads and writes HF ``checkpoint-N`` folders.

    Writing: the flow callback hands :meth:`save_checkpoint` a
    :class:`~hf_lightning.checkpointing.writer.CheckpointContents` and the folder is written by
    :func:`~hf_lightning.checkpointing.writer.write_checkpoint` (crash-safe, HF's file set). Subclass
    and override :meth:`save_checkpoint` / :meth:`load_checkpoint` to send checkpoints elsewhere; pass your
    instance as ``build_lightning_trainer(args, plugins=[...])``. Lightning ``.ckpt`` dicts are handled as usual.
    """

    def save_checkpoint(self, checkpoint: Any, path: Any, storage_options: Any = None) -> None:
        if isinstance(checkpoint, CheckpointContents):
            write_checkpoint(path, checkpoint)
            return
        super().save_checkpoint(checkpoint, path, storage_options=storage_options)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict:
        if not is_hf_checkpoint_dir(path):
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        path = validate_checkpoint_dir(path)
        return {
            HF_CHECKPOINT_KEY: path,
            "has_trainer_state": os.path.isfile(os.path.join(path, TRAINER_STATE_NAME)),
            # Lightning restores these itself; the HF module/flow hooks fill them from the folder instead, so
            # they are empty here (zip() over an empty list restores nothing).
            "state_dict": {},
            "optimizer_states": [],
            "lr_schedulers": [],
            # Present (empty) so that Lightning calls the callbacks' on_load_checkpoint hooks.
            "callbacks": {},
            "pytorch-lightning_version": pl.__version__,
        }
