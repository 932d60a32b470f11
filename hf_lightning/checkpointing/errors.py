"""The errors a checkpoint raises to the user: a file that cannot be loaded, a save or a background flush that failed.

Each message names the file or folder and says what to do next.
"""

from __future__ import annotations

import errno
import os

__all__ = ["CheckpointFlushError", "CheckpointLoadError", "CheckpointSaveError"]


class CheckpointLoadError(ValueError):
    """A checkpoint file exists but cannot be loaded safely (truncated, corrupt or tampered with).

    Attributes:
        path: The file that failed to load.
        reason: Why, in words.
    """

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = os.fspath(path)
        self.reason = reason
        folder = os.path.dirname(self.path) or "."
        super().__init__(
            f"Cannot load {self.path}: {reason}. The checkpoint folder {folder} is damaged or was modified after "
            "it was saved; delete that folder (or move it out of the output directory) and resume from another "
            "checkpoint, or start training from scratch."
        )


_SAVE_ADVICE = {
    errno_code: advice
    for codes, advice in (
        (("ENOSPC", "EDQUOT"), "Free disk space (or lower save_total_limit, or use an output_dir on a larger disk)"),
        (("EIO",), "Check the disk (an I/O error: a failing device, or a network filesystem that is full or gone)"),
        (("EACCES", "EPERM", "EROFS"), "Make output_dir writable (or choose another output_dir)"),
        (("ECANCELED",), "Fix what the failing process's error names"),
    )
    for errno_code in codes
}
_PERMISSION_ERRORS = ("EACCES", "EPERM", "EROFS")


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (disk full, I/O error, no permission, ...); nothing of it was published.

    The ``errno`` of the underlying ``OSError`` is kept. Earlier checkpoints are untouched, so training can be
    resumed from the last one once the cause is fixed.

    Attributes:
        folder: The ``checkpoint-N`` folder that was being written.
        space: What the checkpoint needs on disk and what was free
            (:class:`~hf_lightning.checkpointing.space.SpaceReport`), or None; told for every cause but a
            permission error.
    """

    def __init__(self, folder: str, cause: OSError, space: object = None):
        self.folder = folder
        name = errno.errorcode.get(cause.errno or 0, "")
        advice = _SAVE_ADVICE.get(name, "Fix the cause")
        self.space = None if name in _PERMISSION_ERRORS else space
        where = f" ({cause.filename})" if cause.filename else ""
        space_text = f" {self.space}" if self.space is not None else ""
        super().__init__(
            cause.errno,
            f"Could not save the checkpoint {folder}: {cause.strerror or cause}{where}.{space_text} Nothing of it "
            f"was published and the earlier checkpoints in {os.path.dirname(folder) or '.'} are intact. {advice}, "
            "then resume with train(resume_from_checkpoint=True) / fit(ckpt_path=get_last_checkpoint(output_dir)).",
        )


class CheckpointFlushError(RuntimeError):
    """A background checkpoint job (flush or rotation) failed; ``description`` says which."""
