"""Finding the checkpoint to resume from: the folder a user names, or the last complete ``checkpoint-N`` of a run.

Difference from HF on purpose: HF's ``get_last_checkpoint`` returns the highest ``checkpoint-N`` directory even
when a crash left it half written. Ours only returns a *complete* folder (the one rule of
:mod:`hf_lightning.checkpointing.completeness`); incomplete folders are skipped with a warning, so resuming after a
kill or a power cut picks the previous good checkpoint.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from hf_lightning.checkpointing.completeness import has_model_weights, incomplete_reason
from hf_lightning.checkpointing.layout import checkpoint_step

__all__ = ["get_last_checkpoint", "is_hf_checkpoint_dir", "resolve_resume_checkpoint", "validate_checkpoint_dir"]

logger = logging.getLogger(__name__)


def get_last_checkpoint(folder: str | os.PathLike) -> str | None:
    """Return the complete ``checkpoint-N`` folder with the largest ``N`` inside ``folder``.

    Only directories named exactly ``checkpoint-<digits>`` count (``checkpoint-5-old`` does not). Unlike HF,
    incomplete folders (interrupted saves, truncated files, no weights; see
    :func:`~hf_lightning.checkpointing.completeness.incomplete_reason`) are skipped.

    Args:
        folder: Directory to search, usually ``output_dir``.

    Returns:
        ``os.path.join(folder, "checkpoint-N")``, or None when there is no complete checkpoint.

    Raises:
        FileNotFoundError: ``folder`` does not exist.
        NotADirectoryError: ``folder`` is not a directory.
    """
    if not os.path.exists(folder):
        raise FileNotFoundError(f"Cannot look for checkpoints in {folder!s}: it does not exist.")
    if not os.path.isdir(folder):
        raise NotADirectoryError(f"Cannot look for checkpoints in {folder!s}: it is not a directory.")
    steps: dict[int, str] = {}
    for name in os.listdir(folder):
        step = checkpoint_step(name)
        path = os.path.join(folder, name)
        if step is None or not os.path.isdir(path):
            continue
        reason = incomplete_reason(path)
        if reason is not None:
            logger.warning("Skipping %s: its save did not finish (%s).", path, reason)
            continue
        steps[step] = name
    if not steps:
        return None
    return os.path.join(folder, steps[max(steps)])


def is_hf_checkpoint_dir(path: Any) -> bool:
    """Whether ``path`` names a folder (an HF checkpoint, as opposed to a Lightning ``.ckpt`` file)."""
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
