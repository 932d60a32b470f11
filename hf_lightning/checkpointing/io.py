"""Lightning's ``CheckpointIO`` for HF ``checkpoint-N`` folders: the plugin every checkpoint save goes through.

The flow callback saves through the strategy's ``CheckpointIO``, so a user's plugin (another storage) sees HF
checkpoints too. Reading a folder back (``fit(ckpt_path=<checkpoint folder>)``) does not go through a
``CheckpointIO``: strategies such as FSDP never ask theirs, so :class:`hf_lightning.resume.CheckpointResume` answers
the strategy's ``load_checkpoint`` for HF folders itself. Lightning's own ``.ckpt`` files load as usual.
"""

from __future__ import annotations

from typing import Any

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from hf_lightning.checkpointing.writer import CheckpointContents, write_checkpoint


class HFCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` that also writes HF ``checkpoint-N`` folders.

    Writing: the flow callback hands :meth:`save_checkpoint` a
    :class:`~hf_lightning.checkpointing.writer.CheckpointContents` and the folder is written by
    :func:`~hf_lightning.checkpointing.writer.write_checkpoint` (crash-safe, HF's file set). Subclass
    and override :meth:`save_checkpoint` to send checkpoints elsewhere; pass your instance as
    ``build_lightning_trainer(args, plugins=[...])``. Lightning ``.ckpt`` dicts are handled as usual.
    """

    def save_checkpoint(self, checkpoint: Any, path: Any, storage_options: Any = None) -> None:
        if isinstance(checkpoint, CheckpointContents):
            write_checkpoint(path, checkpoint)
            return
        super().save_checkpoint(checkpoint, path, storage_options=storage_options)
