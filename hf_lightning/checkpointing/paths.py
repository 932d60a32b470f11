"""Checkpoint folder names (``checkpoint-N``) and finding the last complete one.

Difference from HF on purpose: HF's ``get_last_checkpoint`` returns the highest ``checkpoint-N`` directory even
when a crash left it half written. Ours only returns a *complete* folder, i.e. one holding
``trainer_state.json``, which is the last file a checkpoint save writes; incomplete folders are skipped with a
warning, so resuming after a kill picks the previous good checkpoint.
"""

from __future__ import annotations

import logging
import json
import os
import re

__all__ = [
    "PREFIX_CHECKPOINT_DIR",
    "TRAINER_STATE_NAME",
    "checkpoint_folder_name",
    "get_last_checkpoint",
    "is_complete_checkpoint",
]

logger = logging.getLogger(__name__)

PREFIX_CHECKPOINT_DIR = "checkpoint"
TRAINER_STATE_NAME = "trainer_state.json"

_CHECKPOINT_NAME = re.compile(r"^" + PREFIX_CHECKPOINT_DIR + r"\-(\d+)$")


def checkpoint_folder_name(global_step: int) -> str:
    """Return the folder name HF uses for the checkpoint taken at ``global_step``, e.g. ``checkpoint-500``."""
    return f"{PREFIX_CHECKPOINT_DIR}-{global_step}"


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """Tell whether a checkpoint folder was fully written (it holds a readable ``trainer_state.json``).

    ``trainer_state.json`` is the last file a save writes; a folder HF's Trainer was killed in may hold a truncated
    one, so it must also parse.

    Args:
        path: A checkpoint folder.

    Returns:
        True when ``path`` is a directory containing a ``trainer_state.json`` that parses as JSON.
    """
    state_file = os.path.join(path, TRAINER_STATE_NAME)
    if not os.path.isfile(state_file):
        return False
    try:
        with open(state_file, encoding="utf-8") as f:
            json.load(f)
    except (OSError, ValueError):
        return False
    return True


def get_last_checkpoint(folder: str | os.PathLike) -> str | None:
    """Return the complete ``checkpoint-N`` folder with the largest ``N`` inside ``folder``.

    Only directories named exactly ``checkpoint-<digits>`` count (``checkpoint-5-old`` does not). Unlike HF,
    folders without ``trainer_state.json`` (interrupted saves) are skipped.

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
        match = _CHECKPOINT_NAME.search(name)
        path = os.path.join(folder, name)
        if match is None or not os.path.isdir(path):
            continue
        if not is_complete_checkpoint(path):
            logger.warning("Skipping %s: it has no %s, so its save did not finish.", path, TRAINER_STATE_NAME)
            continue
        steps[int(match.group(1))] = name
    if not steps:
        return None
    return os.path.join(folder, steps[max(steps)])
