"""Getting checkpoint folders onto the disk: the ``fsync`` helpers, and flushing off the training thread.

When :func:`~hf_lightning.checkpointing.writer.write_checkpoint` returns, ``checkpoint-N`` is complete and got its
name by one atomic rename: a process that is killed at any moment leaves either the previous state or the whole
new folder, because the kernel keeps the written pages whatever happens to the process. Surviving a power cut or a
kernel crash as well needs the data on the disk (``fsync``), and that costs as much again as writing the files.
HF's Trainer never flushes; we flush every checkpoint, but here, on one background thread, so that training does
not wait for the disk:

- jobs run one at a time in the order they were queued: a checkpoint's flush always runs before anything queued
  after it, in particular before the rotation that deletes older checkpoints (the trainer queues rotation here),
  so an older checkpoint is only ever deleted once a newer one is on the disk;
- :func:`wait_for_flushes` blocks until every queued job is done; the trainer calls it before the next save, at
  the end of training and when training fails, and it runs at interpreter exit;
- a job that fails (an ``fsync`` reporting an I/O error or a full disk, a folder that cannot be deleted) is logged
  as a warning naming what it was doing, and raised again by the next :func:`wait_for_flushes` or
  :func:`raise_failed_jobs` that is asked to; until then every job queued behind it is skipped (logged), so a
  rotation never deletes an older checkpoint after the newer one's flush failed;
- a flush that fails withdraws its folder (the writer passes ``on_failure``): the run is left as if that save had
  never happened, and the error is a ``CheckpointSaveError`` naming the folder, the cause and the space.

A folder renamed just before a power cut may come back with truncated files; ``get_last_checkpoint`` checks
each candidate's files and skips such a folder, and the previous checkpoint is still there.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import queue
import shutil
import threading
from collections.abc import Callable
from typing import Any

from hf_lightning.checkpointing.errors import CheckpointFlushError, CheckpointSaveError

logger = logging.getLogger(__name__)

# What fsync reports when the data did not reach the disk; other errors mean the platform cannot fsync this kind
# of file (a folder, on some filesystems) and are ignored.
_DATA_NOT_WRITTEN = {errno.EIO, errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def fsync_path(path: str, directory: bool = False) -> None:
    """Flush one file (or, with ``directory``, one folder's entries) to disk; platforms that cannot are skipped.

    Raises:
        OSError: The data did not reach the disk (``EIO``, ``ENOSPC``, ``EDQUOT``), with ``path`` as its filename.
    """
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    except OSError:
        # Some platforms (Windows) cannot open directories; the rename is still atomic there.
        return
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno in _DATA_NOT_WRITTEN:
            raise OSError(err.errno, err.strerror, path) from err
    finally:
        os.close(fd)


def fsync_tree(root: str) -> None:
    """Flush every file and folder under ``root`` so a rename never publishes data still in page cache."""
    for folder, _, files in os.walk(root):
        for name in files:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder, directory=True)


def _flush_published(final: str) -> None:
    """Flush a renamed checkpoint folder: its files, itself and the parent's entry for it."""
    fsync_tree(final)
    fsync_path(os.path.dirname(final), directory=True)


class _BackgroundJobs:
    """One daemon thread running queued callables in order (started on first use)."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._failures: list[tuple[str, BaseException]] = []

    def submit(self, description: str, job: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="hf_lightning-checkpoint-flush", daemon=True)
                self._thread.start()
        self._queue.put((description, job, args, kwargs))

    def _run(self) -> None:
        while True:
            description, job, args, kwargs = self._queue.get()
            if self._failures:
                # Jobs queued behind a failed one (the rotation behind a flush) may delete what is now the newest
                # checkpoint on the disk: they wait for the failure to be reported, and are dropped.
                logger.warning("Skipped %s: an earlier checkpoint job failed (%s).", description,
                               self._failures[0][0])
                self._queue.task_done()
                continue
            try:
                job(*args, **kwargs)
            except BaseException as err:  # noqa: BLE001 - reported to the training thread, never lost
                logger.warning("Background checkpoint job failed while %s: %s", description, err)
                with self._lock:
                    self._failures.append((description, err))
            finally:
                self._queue.task_done()

    def wait(self, raise_failures: bool = False) -> None:
        if self._thread is None:
            return
        self._queue.join()
        if raise_failures:
            self.raise_failures()

    def raise_failures(self) -> None:
        if not self._failures:
            return
        with self._lock:
            failures, self._failures = self._failures, []
        if failures:
            description, err = failures[0]
            if isinstance(err, CheckpointSaveError):
                raise err
            raise CheckpointFlushError(
                f"A checkpoint job failed in the background while {description}: {err}. The checkpoint folder "
                "named there may not be on the disk; check the disk and save again."
            ) from err


_JOBS = _BackgroundJobs()


def _forget_parent_jobs() -> None:
    # A forked child (a DataLoader worker) has a copy of the parent's queue but not its thread: start empty.
    global _JOBS
    _JOBS = _BackgroundJobs()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_jobs)


def run_in_background(description: str, job: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Queue ``job(*args, **kwargs)`` behind every checkpoint job queued before it.

    Args:
        description: What the job does, for the warning if it fails (e.g. ``"flushing /out/checkpoint-40"``).
        job: The callable; its return value is dropped.
    """
    _JOBS.submit(description, job, *args, **kwargs)


def wait_for_flushes(raise_failures: bool = False) -> None:
    """Block until every queued checkpoint flush and rotation has finished.

    Args:
        raise_failures: Raise the first job that failed since the last call that raised (each failure was
            already logged when it happened): its :class:`CheckpointSaveError` for a flush that withdrew its
            folder, else :class:`CheckpointFlushError`.
    """
    _JOBS.wait(raise_failures=raise_failures)


def raise_failed_jobs() -> None:
    """Raise, without waiting, a checkpoint job that has failed so far (as :func:`wait_for_flushes` would).

    The trainer calls it after every optimizer step, so a run whose checkpoint did not reach the disk stops at the
    next step instead of the next save.
    """
    _JOBS.raise_failures()


def _flush_or_else(final: str, on_failure: Callable[[OSError], Any] | None) -> None:
    try:
        _flush_published(final)
    except OSError as err:
        if on_failure is None:
            raise
        on_failure(err)
        raise


def flush_in_background(final: str, then_remove: str | None = None,
                        on_failure: Callable[[OSError], Any] | None = None) -> None:
    """Queue the flush of a just-published checkpoint folder, and behind it the removal of the one it replaced.

    Args:
        final: The renamed ``checkpoint-N`` folder.
        then_remove: The folder ``final`` replaced; deleted only once the new data is on disk (skipped when the
            flush fails).
        on_failure: Called on the background thread with the ``OSError`` when the flush fails; it may raise the
            error to report instead (the writer withdraws the folder and raises a ``CheckpointSaveError``).
    """
    run_in_background(f"flushing {final} to disk", _flush_or_else, final, on_failure)
    if then_remove is not None:
        run_in_background(f"removing {then_remove}", shutil.rmtree, then_remove, ignore_errors=True)


# Daemon threads are stopped at exit without running their queue: finish it first (a process that is killed skips
# this, and the atomic rename already kept its checkpoints consistent).
atexit.register(wait_for_flushes)

__all__ = ["flush_in_background", "fsync_path", "fsync_tree", "raise_failed_jobs", "run_in_background",
           "wait_for_flushes"]
