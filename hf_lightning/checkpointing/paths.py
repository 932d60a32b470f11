"""Checkpoint folder names (``checkpoint-N``) and finding the last complete one.

Difference from HF on purpose: HF's ``get_last_checkpoint`` returns the highest ``checkpoint-N`` directory even
when a crash left it half written. Ours only returns a *complete* folder, i.e. one holding
``trainer_state.json``, which is the last file a checkpoint save writes, and no truncated file; incomplete folders
are skipped with a warning, so resuming after a kill or a power cut picks the previous good checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import re

__all__ = [
    "PREFIX_CHECKPOINT_DIR",
    "TRAINER_STATE_NAME",
    "checkpoint_folder_name",
    "get_last_checkpoint",
    "incomplete_reason",
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
    """Tell whether a checkpoint folder was fully written (see :func:`incomplete_reason`).

    Args:
        path: A checkpoint folder.

    Returns:
        True when ``path`` is a directory with a ``trainer_state.json`` that parses and no truncated file.
    """
    return incomplete_reason(path) is None


def incomplete_reason(path: str | os.PathLike) -> str | None:
    """Why a checkpoint folder is not complete, or None when it is.

    ``trainer_state.json`` is the last file a save writes; a folder HF's Trainer was killed in lacks it or holds a
    truncated one, so it must exist and parse. A folder whose data did not reach the disk before a power cut (see
    :mod:`hf_lightning.checkpointing.durability`) can come back with empty or cut-off files, so every file must be
    non-empty, every ``.safetensors`` file as long as its header says, and every zip-format torch file
    (``.pt``/``.pth``/``.bin``) must end with its zip directory. These checks read a few bytes per file.

    Args:
        path: A checkpoint folder.

    Returns:
        A short reason (``"no trainer_state.json"``, ``"model.safetensors is truncated"``, ...) or None.
    """
    state_file = os.path.join(path, TRAINER_STATE_NAME)
    if not os.path.isfile(state_file):
        return f"no {TRAINER_STATE_NAME}"
    try:
        with open(state_file, encoding="utf-8") as f:
            json.load(f)
    except (OSError, ValueError):
        return f"{TRAINER_STATE_NAME} does not parse"
    for root, _, files in os.walk(path):
        for name in files:
            file = os.path.join(root, name)
            try:
                if _truncated(file):
                    return f"{os.path.relpath(file, path)} is truncated"
            except OSError as err:
                return f"{os.path.relpath(file, path)} cannot be read ({err.strerror or err})"
    return None


_ZIP_LOCAL_HEADER = b"PK\x03\x04"
_ZIP_END_OF_DIRECTORY = b"PK\x05\x06"
# The end-of-directory record is 22 bytes plus a comment of at most 65535 bytes.
_ZIP_TAIL = 22 + 65535


def _truncated(file: str) -> bool:
    size = os.path.getsize(file)
    if size == 0:
        return True
    if file.endswith(".safetensors"):
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return True
            header_len = int.from_bytes(head, "little")
            if 8 + header_len > size:
                return True
            try:
                header = json.loads(f.read(header_len))
            except ValueError:
                return True
        ends = [entry["data_offsets"][1] for key, entry in header.items()
                if key != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry]
        return 8 + header_len + max(ends, default=0) > size
    if file.endswith((".pt", ".pth", ".bin")):
        with open(file, "rb") as f:
            if f.read(4) != _ZIP_LOCAL_HEADER:
                return False  # a legacy (non-zip) pickle: nothing cheap to check
            f.seek(max(0, size - _ZIP_TAIL))
            return _ZIP_END_OF_DIRECTORY not in f.read()
    return False


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
        reason = incomplete_reason(path)
        if reason is not None:
            logger.warning("Skipping %s: its save did not finish (%s).", path, reason)
            continue
        steps[int(match.group(1))] = name
    if not steps:
        return None
    return os.path.join(folder, steps[max(steps)])
