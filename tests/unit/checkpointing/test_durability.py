"""Checkpoints flushed to disk on a background thread: order, failures, and truncated folders skipped on resume."""

import os
import threading

import pytest

import hf_lightning
from hf_lightning.checkpointing import durability
from hf_lightning.checkpointing import durability as ckpt_format
from hf_lightning.checkpointing.completeness import incomplete_reason
from hf_lightning.checkpointing.durability import run_in_background, wait_for_flushes
from hf_lightning.checkpointing.errors import CheckpointFlushError
from hf_lightning.checkpointing.paths import get_last_checkpoint
from hf_lightning.checkpointing.rotation import rotate_checkpoints
from tests.helpers.models import RegressionModel, regression_data
from tests.unit.checkpointing.test_checkpoint_format import _training_parts, _write


@pytest.fixture
def fsynced(monkeypatch):
    """Paths passed to os.fsync, in order (the real fsync still runs)."""
    seen: list[str] = []
    real = os.fsync

    def fsync(fd):
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    yield seen
    wait_for_flushes()


@pytest.fixture
def blocked_flush(monkeypatch):
    """Holds every background flush until the returned event is set."""
    release = threading.Event()
    real = ckpt_format._flush_published

    def flush(final):
        release.wait(timeout=30)
        real(final)

    monkeypatch.setattr(ckpt_format, "_flush_published", flush)
    yield release
    release.set()
    wait_for_flushes()


def test_background_flush_covers_every_file_and_the_folders(tmp_path, fsynced):
    final = _write(tmp_path, 3, flush_in_background=True)
    wait_for_flushes(raise_failures=True)
    files = {os.path.join(final, name) for name in os.listdir(final)}
    assert files <= set(fsynced)
    assert final in fsynced and str(tmp_path) in fsynced
    # The parent's entry is flushed after the folder's contents.
    assert fsynced.index(str(tmp_path)) > max(fsynced.index(f) for f in files)


def test_synchronous_save_flushes_before_the_rename(tmp_path, fsynced):
    final = _write(tmp_path, 3)
    # Flushed under the temporary name: the folder was renamed only afterwards.
    assert fsynced and all(".tmp-checkpoint-3-" in path or path == str(tmp_path) for path in fsynced)
    assert os.path.isdir(final)


def test_save_returns_named_and_complete_before_its_flush(tmp_path, blocked_flush):
    final = _write(tmp_path, 5, flush_in_background=True)
    assert os.path.basename(final) == "checkpoint-5"
    assert incomplete_reason(final) is None
    assert get_last_checkpoint(tmp_path) == final


def test_rotation_queued_behind_a_flush_waits_for_it(tmp_path, blocked_flush):
    _write(tmp_path, 1)
    _write(tmp_path, 2, flush_in_background=True)
    run_in_background("rotating", rotate_checkpoints, str(tmp_path), save_total_limit=1)
    # checkpoint-2 is not on disk yet, so checkpoint-1 must survive.
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1", "checkpoint-2"]
    blocked_flush.set()
    wait_for_flushes(raise_failures=True)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2"]


def test_replaced_folder_is_deleted_only_after_the_new_one_is_flushed(tmp_path, blocked_flush):
    _write(tmp_path, 4)
    final = _write(tmp_path, 4, parts=_training_parts(seed=1), flush_in_background=True)
    # The new folder is published; the one it replaced waits, set aside, until the new one is on disk.
    assert incomplete_reason(final) is None
    set_aside = [name for name in os.listdir(tmp_path) if name.endswith(".replaced")]
    assert len(set_aside) == 1 and incomplete_reason(tmp_path / set_aside[0]) is None
    assert get_last_checkpoint(tmp_path) == final
    blocked_flush.set()
    wait_for_flushes(raise_failures=True)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-4"]


def test_a_failed_job_is_reported_by_the_next_wait(caplog):
    def broken():
        raise OSError(5, "Input/output error")

    run_in_background("flushing /x/checkpoint-9 to disk", broken)
    with pytest.raises(CheckpointFlushError, match=r"flushing /x/checkpoint-9 to disk.*Input/output error"):
        wait_for_flushes(raise_failures=True)
    assert "flushing /x/checkpoint-9 to disk" in caplog.text
    wait_for_flushes(raise_failures=True)  # reported once


def test_jobs_run_in_submission_order():
    order: list[int] = []
    for i in range(20):
        run_in_background(f"job {i}", order.append, i)
    wait_for_flushes(raise_failures=True)
    assert order == list(range(20))


def test_a_forked_child_does_not_inherit_pending_jobs(blocked_flush, tmp_path):
    _write(tmp_path, 1, flush_in_background=True)  # held by blocked_flush
    pid = os.fork()
    if pid == 0:  # the child must not wait for the parent's queue
        try:
            wait_for_flushes()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@pytest.mark.parametrize("damage", ["empty_weights", "cut_weights", "cut_optimizer", "cut_state"])
def test_truncated_newest_checkpoint_is_skipped_for_the_previous_one(tmp_path, damage, caplog):
    # What a power cut right after the rename (before the background flush) can leave behind.
    previous = _write(tmp_path, 2)
    newest = _write(tmp_path, 4)
    name, keep = {
        "empty_weights": ("model.safetensors", 0),
        "cut_weights": ("model.safetensors", -5),
        "cut_optimizer": ("optimizer.pt", -30),
        "cut_state": ("trainer_state.json", -3),
    }[damage]
    path = os.path.join(newest, name)
    size = os.path.getsize(path)
    os.truncate(path, keep if keep >= 0 else size + keep)
    assert incomplete_reason(newest) is not None
    assert get_last_checkpoint(tmp_path) == previous
    assert f"Skipping {newest}" in caplog.text


def test_training_run_leaves_hf_rotation_and_flushed_folders(tmp_path, fsynced):
    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=6, save_steps=2, save_total_limit=2,
        report_to="none", use_cpu=True, disable_tqdm=True, logging_strategy="no")
    hf_lightning.Trainer(model=RegressionModel(), args=args, train_dataset=regression_data()).train()
    # train() returns after every flush and rotation: HF's folders, each flushed.
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-4", "checkpoint-6"]
    for step in (4, 6):
        folder = os.path.join(tmp_path, f"checkpoint-{step}")
        assert folder in fsynced
        assert os.path.join(folder, "model.safetensors") in fsynced
    assert durability._JOBS._queue.unfinished_tasks == 0
