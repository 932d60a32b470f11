"""A full disk or a write error during a checkpoint save fails that save cleanly, and nothing is lost.

Each case trains a dropout model (GA 2, a checkpoint every 2 steps, ``save_total_limit=1``) and makes the save of
``checkpoint-4`` fail: a file half written, then ``ENOSPC`` / ``EDQUOT`` / ``EIO`` (the write path), or the
background ``fsync`` of the published folder reporting it (the flush path), or a real full tmpfs where this
machine lets us mount one. Each time the run stops with a ``CheckpointSaveError`` naming the folder, the cause,
the space the checkpoint needs (the size of ``checkpoint-2``) and the space free; no staging folder is left;
``checkpoint-2`` is byte-for-byte what was saved and still what ``get_last_checkpoint`` returns (no rotation
deleted it); and resuming from it ends bit-identical to a run that never failed (weights ``torch.equal``, every
``log_history`` entry ``==``).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import safetensors.torch
import torch

import hf_lightning
from hf_lightning.checkpointing.errors import CheckpointSaveError
from hf_lightning.checkpointing.space import folder_size
from hf_lightning.state import TrainerState
from tests.reliability._fuzz_worker import DropoutRegression, _data

FAILING = ".tmp-checkpoint-4-"
_TIMING_KEYS = ("_runtime", "_per_second")


def _args(out: Path) -> hf_lightning.TrainingArguments:
    return hf_lightning.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=8,
        save_steps=2, save_total_limit=1, logging_steps=1, learning_rate=5e-2, seed=11, report_to="none",
        use_cpu=True, disable_tqdm=True)


class _Snapshot(hf_lightning.TrainerCallback):
    """Keeps the bytes of checkpoint-2 as saved."""

    def __init__(self):
        self.files: dict[str, bytes] = {}

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == 2:
            folder = Path(args.output_dir, "checkpoint-2")
            self.files = {p.name: p.read_bytes() for p in folder.iterdir()}


def _train(out: Path, resume=None, callbacks=()):
    model = DropoutRegression()
    trainer = hf_lightning.Trainer(model=model, args=_args(out), train_dataset=_data(20, seed=3),
                                   callbacks=list(callbacks))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train(resume_from_checkpoint=resume)
    return trainer, model


def _comparable(log_history):
    return [{k: v for k, v in entry.items() if not k.endswith(_TIMING_KEYS)} for entry in log_history
            if "train_runtime" not in entry]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    trainer, model = _train(tmp_path_factory.mktemp("uninterrupted") / "out")
    return model.state_dict(), trainer.state.log_history


def _half_then_fail(path: str, code: int) -> None:
    size = os.path.getsize(path)
    os.truncate(path, size // 2)
    raise OSError(code, os.strerror(code), path)


def _fail_writing(monkeypatch, target: str, code: int) -> None:
    """Make the write of ``target`` inside checkpoint-4's staging folder stop half way with ``code``."""
    if target == "model.safetensors":
        real_save_file = safetensors.torch.save_file

        def save_file(tensors, filename, *args, **kwargs):
            real_save_file(tensors, filename, *args, **kwargs)
            if FAILING in str(filename):
                _half_then_fail(str(filename), code)

        monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    elif target == "optimizer.pt":
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            real_save(obj, f, *args, **kwargs)
            if FAILING in str(f) and str(f).endswith(target):
                _half_then_fail(str(f), code)

        monkeypatch.setattr(torch, "save", save)
    elif target == "trainer_state.json":
        real_json = TrainerState.save_to_json

        def save_to_json(self, path):
            real_json(self, path)
            if FAILING in str(path):
                _half_then_fail(str(path), code)

        monkeypatch.setattr(TrainerState, "save_to_json", save_to_json)
    elif target == "fsync":
        # The background flush of the published checkpoint-4: the data did not reach the disk.
        real_fsync = os.fsync

        def fsync(fd):
            if "/checkpoint-4" in os.readlink(f"/proc/self/fd/{fd}"):
                raise OSError(code, os.strerror(code))
            return real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)
    else:
        raise AssertionError(target)


def _assert_failed_cleanly(out: Path, err: CheckpointSaveError, code: int, snapshot: _Snapshot,
                           flushing: bool = False) -> None:
    message = str(err)
    assert err.errno == code and err.folder == str(out / "checkpoint-4")
    assert f"Could not save the checkpoint {out / 'checkpoint-4'}: {os.strerror(code)}" in message
    assert "The checkpoint needs about " in message and f"are free on the filesystem of {out} now" in message
    assert "earlier checkpoints in" in message and "resume_from_checkpoint=True" in message
    assert err.space.free is not None
    if flushing:
        # checkpoint-4 was complete when its flush failed: its own size, a little more than checkpoint-2's.
        assert "(the size of its files, all written before the flush failed)" in message
        assert err.space.needed >= folder_size(out / "checkpoint-2")
    else:
        assert "(the size of checkpoint-2, the checkpoint before it)" in message
        assert err.space.needed == folder_size(out / "checkpoint-2")
    # No staging debris, no half checkpoint-4, and checkpoint-2 was not rotated away (save_total_limit=1).
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2"]
    assert {p.name: p.read_bytes() for p in (out / "checkpoint-2").iterdir()} == snapshot.files
    assert hf_lightning.get_last_checkpoint(str(out)) == str(out / "checkpoint-2")


def _assert_resume_exact(out: Path, uninterrupted) -> None:
    weights, log_history = uninterrupted
    trainer, model = _train(out, resume=True)
    assert trainer.state.global_step == 8
    for key, value in weights.items():
        assert torch.equal(model.state_dict()[key], value), key
    assert _comparable(trainer.state.log_history) == _comparable(log_history)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-8"]


@pytest.mark.parametrize("target,code", [
    ("model.safetensors", errno.ENOSPC),
    ("optimizer.pt", errno.EDQUOT),
    ("trainer_state.json", errno.EIO),
    ("fsync", errno.ENOSPC),
    ("fsync", errno.EIO),
])
def test_a_failed_save_stops_the_run_and_loses_nothing(tmp_path, monkeypatch, uninterrupted, target, code):
    out = tmp_path / "out"
    snapshot = _Snapshot()
    _fail_writing(monkeypatch, target, code)
    with pytest.raises(CheckpointSaveError) as raised:
        _train(out, callbacks=[snapshot])
    monkeypatch.undo()
    _assert_failed_cleanly(out, raised.value, code, snapshot, flushing=target == "fsync")
    _assert_resume_exact(out, uninterrupted)


def test_the_first_save_failing_reports_the_tensors_to_write(tmp_path, monkeypatch):
    out = tmp_path / "out"
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if str(f).endswith("optimizer.pt"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    expected = r"checkpoint-2: No space left on device .*needs about [\d.]+ (bytes|kB) \(at least: the bytes of the"
    with pytest.raises(CheckpointSaveError, match=expected) as raised:
        _train(out)
    # DropoutRegression: 4x16 + 16 + 16x1 + 1 float32 parameters, and Adam's two moments of each, and step counts.
    n = 4 * 16 + 16 + 16 + 1
    assert raised.value.space.needed >= 3 * 4 * n
    assert os.listdir(out) == []


def _mount_tmpfs(where: Path, size: str) -> bool:
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    return proc.returncode == 0


class _FillDisk(hf_lightning.TrainerCallback):
    """After checkpoint-2 is saved, fills the disk but for half a checkpoint."""

    def __init__(self, filler: Path):
        self.filler = filler

    def on_save(self, args, state, control, **kwargs):
        if state.global_step != 2:
            return
        keep_free = folder_size(Path(args.output_dir, "checkpoint-2")) // 2
        with open(self.filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as err:
                assert err.errno == errno.ENOSPC
        os.truncate(self.filler, max(0, os.path.getsize(self.filler) - keep_free))


def test_a_real_full_disk(tmp_path, uninterrupted):
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "2m"):
        pytest.skip("cannot mount a tmpfs here (needs root on Linux); the patched cases above cover the logic")
    try:
        out, filler = disk / "out", disk / "filler"
        snapshot = _Snapshot()
        with pytest.raises(CheckpointSaveError) as raised:
            _train(out, callbacks=[snapshot, _FillDisk(filler)])
        assert raised.value.space.free < raised.value.space.needed
        _assert_failed_cleanly(out, raised.value, errno.ENOSPC, snapshot)
        filler.unlink()
        _assert_resume_exact(out, uninterrupted)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


# ---- the mechanics, without training -------------------------------------------------------------------------


def _write(run_dir: Path, step: int, **kwargs):
    from tests.unit.checkpointing.test_checkpoint_format import _write as write

    return write(run_dir, step, **kwargs)


def test_a_failed_flush_over_a_replaced_folder_puts_the_old_one_back_and_skips_what_was_queued(tmp_path,
                                                                                             monkeypatch):
    from hf_lightning.checkpointing.durability import run_in_background, wait_for_flushes
    from tests.unit.checkpointing.test_checkpoint_format import _training_parts

    _write(tmp_path, 2)
    _write(tmp_path, 4)
    before = {p.name: p.read_bytes() for p in (tmp_path / "checkpoint-4").iterdir()}
    real_fsync = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("checkpoint-4/optimizer.pt"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    # checkpoint-4 written again (same run, other contents), flushed in the background, a rotation queued behind.
    _write(tmp_path, 4, parts=_training_parts(seed=1), flush_in_background=True)
    ran = []
    run_in_background("rotating", ran.append, "rotation")
    with pytest.raises(CheckpointSaveError, match=r"checkpoint-4: Input/output error \(.*optimizer.pt\)\. The "
                                                  r"checkpoint needs about"):
        wait_for_flushes(raise_failures=True)
    assert ran == []  # the job behind the failed flush was dropped
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2", "checkpoint-4"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "checkpoint-4").iterdir()} == before
    run_in_background("rotating", ran.append, "rotation")
    wait_for_flushes(raise_failures=True)
    assert ran == ["rotation"]  # reported once; the queue runs again


class _Group:
    """Stands in for the other process of a 2-process save: ``all_succeeded`` answers with its part's outcome."""

    def __init__(self, other_ok: bool):
        self.other_ok, self.calls = other_ok, []

    def __call__(self, ok: bool) -> bool:
        self.calls.append(ok)
        return ok and self.other_ok


def test_several_processes_all_raise_when_one_process_fails(tmp_path, monkeypatch):
    from hf_lightning.checkpointing import writer

    _write(tmp_path, 2)
    # This process saves; its optimizer.pt hits a full disk: it tells the group, removes the staging folder, raises.
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if str(f).endswith("optimizer.pt"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    group = _Group(other_ok=True)
    with pytest.raises(CheckpointSaveError, match=r"checkpoint-4: No space left on device .*the size of "
                                                  r"checkpoint-2") as raised:
        _write(tmp_path, 4, world_size=2, process_index=0, barrier=lambda: None, all_succeeded=group)
    assert group.calls == [True, False] and raised.value.errno == errno.ENOSPC
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2"]
    monkeypatch.undo()
    # A process whose own part worked stops too, when another one's failed.
    group = _Group(other_ok=False)
    with pytest.raises(CheckpointSaveError, match=r"checkpoint-4: another process could not write its part") as raised:
        _write(tmp_path, 4, world_size=2, process_index=1, should_save=False, barrier=lambda: None,
               all_succeeded=group)
    assert group.calls == [True] and raised.value.errno == errno.ECANCELED
    assert writer.TEMPORARY_CHECKPOINT_PREFIX not in "".join(os.listdir(tmp_path))
