"""``save_total_limit``: which ``checkpoint-N`` folders to keep, with HF 5.23's ordering and deletion rules.

Ordering (``sort_checkpoints``): by folder mtime or by step; when the mtimes of the oldest and newest folder are
less than a second apart (filesystems with coarse or fake mtimes) the step order is used instead. A given best
checkpoint is moved to second-to-last so the newest stays last.

Deletion (``rotate_checkpoints``): the newest folder and the best one are protected; the oldest unprotected
folders are deleted until ``max(save_total_limit, number of protected)`` remain. So ``save_total_limit=1`` with a
best checkpoint that is not the newest keeps two folders during training; :func:`final_cleanup_for_limit_one`
applies HF's end-of-training rule that then keeps only the best.

Differences from HF on purpose: only complete folders (the rule of :mod:`hf_lightning.checkpointing.completeness`,
the one resume uses) named exactly ``checkpoint-<digits>`` take part (HF globs ``checkpoint-*``, so
``checkpoint-5-old`` or a folder a crash left half written would count, and could be the "newest" that gets
protected; an incomplete folder, a truncated one included, is neither counted nor deleted); a folder is first
renamed to a hidden temporary name and then deleted, so a crash during deletion never leaves a ``checkpoint-N``
folder with some of its files gone; and folders a run did not write (:func:`foreign_checkpoints`: an earlier
run's, not the lineage being resumed) can be passed as ``keep`` and are then neither counted nor deleted.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from hf_lightning.checkpointing.completeness import is_complete_checkpoint
from hf_lightning.checkpointing.layout import TEMPORARY_CHECKPOINT_PREFIX, checkpoint_step

__all__ = [
    "clean_stale_temporary_folders",
    "final_cleanup_for_limit_one",
    "foreign_checkpoints",
    "rotate_checkpoints",
    "sort_checkpoints",
]

logger = logging.getLogger(__name__)

# HF falls back to step order when all mtimes lie within this many seconds.
_MTIME_RESOLUTION_SECONDS = 1.0
_warned_about_mtime = False


def _checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, str]]:
    """``(step, path)`` of every complete ``checkpoint-N`` folder, with paths spelled as HF's glob spells them."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        step = checkpoint_step(name)
        # `str(Path(...) / name)` normalises the folder the way HF's `Path.glob` does, so paths compare equal.
        path = str(Path(output_dir) / name)
        if step is not None and os.path.isdir(path) and is_complete_checkpoint(path):
            found.append((step, path))
    return found


def _warn_unreliable_mtime_once() -> None:
    global _warned_about_mtime
    if not _warned_about_mtime:
        _warned_about_mtime = True
        logger.warning("Checkpoint mtimes are less than a second apart; ordering checkpoints by step instead.")


def sort_checkpoints(
    output_dir: str | os.PathLike, use_mtime: bool = False, best_model_checkpoint: str | os.PathLike | None = None
) -> list[str]:
    """List the complete ``checkpoint-N`` folders in ``output_dir``, oldest first, as HF's ``sort_checkpoints``.

    Args:
        output_dir: The folder holding the checkpoints.
        use_mtime: Order by modification time (ties broken by path) instead of by step. Falls back to step order
            when the newest and oldest mtimes are less than 1 s apart.
        best_model_checkpoint: When given, present and not already last, moved to second-to-last.

    Returns:
        Paths ``str(Path(output_dir) / "checkpoint-N")``, oldest first.
    """
    found = _checkpoints(output_dir)
    if use_mtime:
        ordered = sorted((os.path.getmtime(path), path) for _, path in found)
        if len(ordered) > 1 and ordered[-1][0] - ordered[0][0] < _MTIME_RESOLUTION_SECONDS:
            _warn_unreliable_mtime_once()
            ordered = sorted(found)
    else:
        ordered = sorted(found)
    paths = [path for _, path in ordered]
    if best_model_checkpoint is not None and paths:
        best = str(Path(best_model_checkpoint))
        if best in paths and paths[-1] != best:
            newest = paths[-1]
            paths = [path for path in paths if path not in (best, newest)] + [best, newest]
    return paths


def _delete_checkpoint(path: str) -> None:
    """Delete a checkpoint folder so that no crash can leave it half deleted under its own name."""
    parent, name = os.path.split(path)
    step = checkpoint_step(name)
    doomed = os.path.join(parent, f"{TEMPORARY_CHECKPOINT_PREFIX}{step}-{os.getpid()}.deleting")
    try:
        os.replace(path, doomed)
    except OSError:
        doomed = path
    shutil.rmtree(doomed, ignore_errors=True)


def _normalised(paths: Iterable[str | os.PathLike]) -> set[str]:
    return {str(Path(path)) for path in paths}


def rotate_checkpoints(
    output_dir: str | os.PathLike,
    save_total_limit: int | None = None,
    best_model_checkpoint: str | os.PathLike | None = None,
    use_mtime: bool = True,
    keep: Iterable[str | os.PathLike] = (),
    protect: Iterable[str | os.PathLike] = (),
) -> list[str]:
    """Delete the oldest checkpoints beyond ``save_total_limit``, keeping the newest and the best one.

    HF calls this after every save with ``use_mtime=True``. The best checkpoint counts as protected even when
    its folder is gone, exactly as in HF (so two folders may remain with a limit of 1).

    Args:
        output_dir: The folder holding the checkpoints.
        save_total_limit: Folders to keep; None or ``<= 0`` deletes nothing.
        best_model_checkpoint: Path of the best checkpoint (``TrainerState.best_model_checkpoint``).
        use_mtime: Order by modification time (see :func:`sort_checkpoints`).
        keep: Folders that take no part: neither counted against the limit nor deleted (another run's, see
            :func:`foreign_checkpoints`).
        protect: Folders counted against the limit but never deleted, like the best one (e.g. the checkpoint a
            run resumes from).

    Returns:
        The deleted paths, oldest first.
    """
    if save_total_limit is None or save_total_limit <= 0:
        return []
    untouchable = _normalised(keep)
    checkpoints = [path for path in sort_checkpoints(output_dir, use_mtime=use_mtime) if path not in untouchable]
    if len(checkpoints) <= save_total_limit:
        return []
    shielded = [path for path in protect if os.path.isdir(path)]
    protected = {checkpoints[-1]} | {c for c in checkpoints if any(os.path.samefile(c, p) for p in shielded)}
    if best_model_checkpoint is not None:
        protected.add(str(Path(best_model_checkpoint)))
    keep = max(save_total_limit, len(protected))
    deleted: list[str] = []
    for path in checkpoints:
        if len(checkpoints) - len(deleted) <= keep:
            break
        if path not in protected:
            logger.info("Deleting older checkpoint %s (save_total_limit=%d).", path, save_total_limit)
            _delete_checkpoint(path)
            deleted.append(path)
    return deleted


def final_cleanup_for_limit_one(
    output_dir: str | os.PathLike,
    best_model_checkpoint: str | os.PathLike | None,
    keep: Iterable[str | os.PathLike] = (),
) -> list[str]:
    """At the end of training with ``save_total_limit == 1``, delete every checkpoint except the best one.

    HF does this when ``args.should_save``, ``state.best_model_checkpoint`` is set and ``save_total_limit == 1``;
    the caller checks those conditions. Unlike HF (which raises ``FileNotFoundError`` there), a best checkpoint
    that no longer exists deletes nothing and logs a warning, since deleting every folder would lose them all.

    Args:
        output_dir: The folder holding the checkpoints.
        best_model_checkpoint: Path of the best checkpoint; None deletes nothing.
        keep: Folders never deleted (another run's, see :func:`foreign_checkpoints`).

    Returns:
        The deleted paths.
    """
    if best_model_checkpoint is None:
        return []
    if not os.path.isdir(best_model_checkpoint):
        logger.warning(
            "Best checkpoint %s no longer exists; keeping all checkpoints in %s instead of deleting every one "
            "but the best.", best_model_checkpoint, output_dir
        )
        return []
    deleted = []
    untouchable = _normalised(keep)
    for path in sort_checkpoints(output_dir, best_model_checkpoint=best_model_checkpoint):
        if path not in untouchable and not os.path.samefile(path, best_model_checkpoint):
            logger.info("Deleting checkpoint %s: save_total_limit=1 keeps only the best one.", path)
            _delete_checkpoint(path)
            deleted.append(path)
    return deleted


def foreign_checkpoints(output_dir: str | os.PathLike, resume_from: str | os.PathLike | None = None) -> list[str]:
    """The complete ``checkpoint-N`` folders in ``output_dir`` a run starting now did not write.

    Those are every folder there, except the lineage of the checkpoint being resumed when it lies in
    ``output_dir``: its own folder and those of lower steps, which the run continues and rotates as HF does.
    A folder of a higher step than the resumed one (a later state abandoned by resuming from an earlier one) is
    foreign too.

    Args:
        output_dir: The run's output directory.
        resume_from: The checkpoint folder being resumed, or None for a run from scratch.

    Returns:
        Paths spelled as :func:`sort_checkpoints` spells them, by step.
    """
    found = sorted(_checkpoints(output_dir))
    if not found:
        return []
    lineage_step = -1
    if resume_from is not None and os.path.isdir(resume_from):
        parent, name = os.path.split(os.path.normpath(os.fspath(resume_from)))
        step = checkpoint_step(name)
        if step is not None and os.path.isdir(output_dir) and os.path.samefile(parent or ".", output_dir):
            lineage_step = step
    return [path for step, path in found if step > lineage_step]


def clean_stale_temporary_folders(output_dir: str | os.PathLike, older_than: float) -> list[str]:
    """Remove ``.tmp-checkpoint-*`` folders left by interrupted saves or deletions of an earlier run.

    Folders modified at or after ``older_than`` are left alone: they may belong to a save in progress.

    Args:
        output_dir: The folder holding the checkpoints.
        older_than: A ``time.time()`` timestamp, typically when the current run started.

    Returns:
        The removed paths.
    """
    if not os.path.isdir(output_dir):
        return []
    removed = []
    for name in sorted(os.listdir(output_dir)):
        path = os.path.join(output_dir, name)
        if not name.startswith(TEMPORARY_CHECKPOINT_PREFIX) or not os.path.isdir(path):
            continue
        if os.path.getmtime(path) < older_than:
            logger.info("Removing %s, left over by an interrupted checkpoint save or deletion.", path)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
