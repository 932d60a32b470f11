"""How much disk a checkpoint needs and how much is free, for the error a failed save raises.

A save that runs out of space says what it needed and what was there, so the user can tell a disk that is too
small from one that other files filled. What a checkpoint needs is measured, never guessed from the arguments:

- the checkpoint folder before it in the same output directory, when there is one: the next checkpoint of a run
  holds the same files, of the same sizes (the model, the optimizer state and a few small files);
- otherwise (the first save of a run) the bytes of the tensors to be written: the model's parameters and buffers
  plus, for a full checkpoint, the optimizer's state tensors. That is a lower bound: the small files come on top.
- A folder that was written completely and then failed to reach the disk (a background flush) needs its own size.

Reading sizes touches this process's tensors and the directory only (no collective), so it is safe on a process
whose save failed while the others wait.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from hf_lightning.checkpointing.completeness import is_complete_checkpoint
from hf_lightning.checkpointing.layout import checkpoint_step

__all__ = ["SpaceReport", "checkpoint_space_report", "folder_size", "format_size", "free_bytes"]


def format_size(size: int) -> str:
    """``1536`` → ``"1.5 kB"`` (decimal units, as ``df -H`` prints them)."""
    value = float(size)
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def folder_size(path: str | os.PathLike) -> int:
    """Total size in bytes of the files under ``path`` (0 when it is missing)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(folder, name))
            except OSError:
                pass
    return total


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes free for this user on the filesystem holding ``path`` (its nearest existing parent); None if unknown.

    A user quota (``EDQUOT``) is not visible here: the figure is the filesystem's.
    """
    path = os.path.abspath(os.fspath(path))
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _tensor_bytes(value: Any) -> int:
    if hasattr(value, "element_size") and hasattr(value, "numel"):
        return int(value.numel()) * int(value.element_size())
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _previous_checkpoint(run_dir: str, failed: str) -> str | None:
    """The complete ``checkpoint-N`` in ``run_dir`` with the highest step, other than ``failed``."""
    if not os.path.isdir(run_dir):
        return None
    best: tuple[int, str] | None = None
    for name in os.listdir(run_dir):
        step = checkpoint_step(name)
        path = os.path.join(run_dir, name)
        if step is None or os.path.abspath(path) == os.path.abspath(failed) or not is_complete_checkpoint(path):
            continue
        if best is None or step > best[0]:
            best = (step, path)
    return None if best is None else best[1]


class SpaceReport:
    """What a checkpoint needs on disk, how that was measured, and what is free.

    Attributes:
        needed: Bytes the checkpoint needs (see the module docstring for how).
        measured_as: How ``needed`` was measured, in words ("the size of checkpoint-4", ...).
        free: Bytes free on the filesystem of the output directory, None when unknown.
        where: The output directory.
    """

    def __init__(self, needed: int, measured_as: str, free: int | None, where: str) -> None:
        self.needed = needed
        self.measured_as = measured_as
        self.free = free
        self.where = where

    def __str__(self) -> str:
        free = "an unknown amount is" if self.free is None else f"{format_size(self.free)} are"
        return (f"The checkpoint needs about {format_size(self.needed)} ({self.measured_as}); {free} free on the "
                f"filesystem of {self.where} now.")


def checkpoint_space_report(run_dir: str, failed: str, model: Any = None, optimizer: Any = None,
                            written: str | None = None) -> SpaceReport:
    """Measure what the checkpoint ``failed`` needs and what is free in ``run_dir``.

    Args:
        run_dir: The output directory.
        failed: The ``checkpoint-N`` folder that could not be saved (left out of the measurement).
        model: The model being saved (its parameters and buffers count when there is no earlier checkpoint).
        optimizer: Its state tensors count too (None for a model-only checkpoint).
        written: A folder holding the complete files of this checkpoint (a background flush failed after they
            were all written); measured first, before it is removed.

    Returns:
        The :class:`SpaceReport`.
    """
    if written is not None and os.path.isdir(written):
        needed, how = folder_size(written), "the size of its files, all written before the flush failed"
    else:
        previous = _previous_checkpoint(run_dir, failed)
        if previous is not None:
            needed, how = folder_size(previous), f"the size of {os.path.basename(previous)}, the checkpoint before it"
        else:
            needed = 0
            if model is not None:
                needed += sum(_tensor_bytes(p) for p in model.parameters())
                needed += sum(_tensor_bytes(b) for b in model.buffers())
            state = getattr(optimizer, "state", None) if optimizer is not None else None
            if isinstance(state, dict):
                needed += sum(_tensor_bytes(v) for v in state.values())
            how = "at least: the bytes of the model's tensors and the optimizer's state, the files' headers aside"
    return SpaceReport(needed, how, free_bytes(run_dir), run_dir)
