"""``sort_checkpoints`` / ``rotate_checkpoints`` with the signatures of HF 5.23's module-level functions.

The exported names take HF's arguments in HF's order (``checkpoint_prefix`` second for sorting, ``use_mtime``
defaulting to False for both) and ``rotate_checkpoints`` returns None, as HF's do. With the default ``checkpoint``
prefix they run the crash-safe rules of :mod:`hf_lightning.checkpointing.rotation` (only complete
``checkpoint-<digits>`` folders count; a folder is renamed before it is deleted). Any other prefix uses the same
ordering and protection rules on every ``<prefix>-<digits>`` folder.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from hf_lightning.checkpointing import rotation
from hf_lightning.checkpointing.layout import PREFIX_CHECKPOINT_DIR

__all__ = ["rotate_checkpoints", "sort_checkpoints"]


def _prefixed_folders(output_dir: str | os.PathLike, prefix: str) -> list[tuple[int, str]]:
    pattern = re.compile(re.escape(prefix) + r"-(\d+)")
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        match = pattern.fullmatch(name)
        path = str(Path(output_dir) / name)
        if match and os.path.isdir(path):
            found.append((int(match.group(1)), path))
    return found


def sort_checkpoints(output_dir: str | os.PathLike, checkpoint_prefix: str = PREFIX_CHECKPOINT_DIR,
                     use_mtime: bool = False, best_model_checkpoint: str | None = None) -> list[str]:
    """Checkpoint folders in ``output_dir``, oldest first (HF's ``trainer_utils.sort_checkpoints``).

    Args:
        output_dir: The folder holding the checkpoints.
        checkpoint_prefix: Folder names are ``<prefix>-<step>``.
        use_mtime: Order by modification time (step order when all mtimes lie within a second).
        best_model_checkpoint: Moved to second-to-last (the newest stays last) when present.

    Returns:
        The folder paths, oldest first.
    """
    if checkpoint_prefix == PREFIX_CHECKPOINT_DIR:
        return rotation.sort_checkpoints(output_dir, use_mtime=use_mtime, best_model_checkpoint=best_model_checkpoint)
    found = _prefixed_folders(output_dir, checkpoint_prefix)
    ordered = sorted((os.path.getmtime(path), path) for _, path in found) if use_mtime else sorted(found)
    if use_mtime and len(ordered) > 1 and ordered[-1][0] - ordered[0][0] < 1.0:
        ordered = sorted(found)
    paths = [path for _, path in ordered]
    if best_model_checkpoint is not None:
        best = str(Path(best_model_checkpoint))
        if best in paths and paths[-1] != best:
            paths = [path for path in paths if path not in (best, paths[-1])] + [best, paths[-1]]
    return paths


def rotate_checkpoints(output_dir: str | os.PathLike, save_total_limit: int | None = None,
                       best_model_checkpoint: str | None = None, use_mtime: bool = False,
                       checkpoint_prefix: str = PREFIX_CHECKPOINT_DIR) -> None:
    """Delete the oldest checkpoints beyond ``save_total_limit`` (HF's ``trainer_utils.rotate_checkpoints``).

    The newest folder and ``best_model_checkpoint`` are never deleted; None or ``<= 0`` deletes nothing.
    """
    if checkpoint_prefix == PREFIX_CHECKPOINT_DIR:
        rotation.rotate_checkpoints(output_dir, save_total_limit, best_model_checkpoint, use_mtime=use_mtime)
        return
    if save_total_limit is None or save_total_limit <= 0:
        return
    checkpoints = sort_checkpoints(output_dir, checkpoint_prefix, use_mtime)
    protected = {checkpoints[-1]} if checkpoints else set()
    if best_model_checkpoint is not None:
        protected.add(str(Path(best_model_checkpoint)))
    keep = max(save_total_limit, len(protected))
    remaining = len(checkpoints)
    for path in checkpoints:
        if remaining <= keep:
            break
        if path not in protected:
            shutil.rmtree(path, ignore_errors=True)
            remaining -= 1
