"""Finding the checkpoint to resume from: the last complete ``checkpoint-N`` folder of an output directory.

Difference from HF on purpose: HF's ``get_last_checkpoint`` returns the highest ``checkpoint-N`` directory even
when a crash left it half written. Ours only returns a *complete* folder (the one rule of
:mod:`hf_lightning.checkpointing.completeness`); incomplete folders are skipped with a warning, so resuming after a
kill or a power cut picks the previous good checkpoint.
"""

from __future__ import annotations

import logging
import os

from hf_lightning.checkpointing.completeness import incomplete_reason
from hf_lightning.checkpointing.layout import checkpoint_step

__all__ = ["get_last_checkpoint"]

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
