"""No data loss: a run never deletes checkpoints it did not write, and a failed save leaves the earlier ones intact.

- An earlier run's ``checkpoint-N`` folders in the same ``output_dir`` are neither counted by ``save_total_limit``
  nor deleted (HF's rotation deletes them: checked live below), and a warning names them. The lineage of the
  checkpoint being resumed (its own and lower steps) rotates exactly as in HF.
- A folder of the same name the new run writes is kept as ``superseded-checkpoint-N-<time>``.
- Disk full / permission denied while saving raises ``CheckpointSaveError`` (an ``OSError`` with the same errno)
  that names the folder and the fix; nothing of the failed checkpoint is published, earlier ones are untouched,
  and training resumes from them.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch

import hf_lightning
from hf_lightning.checkpointing import writer as fmt
from hf_lightning.checkpointing.errors import CheckpointSaveError
from hf_lightning.checkpointing.safe_load import verify_checkpoint_files
from hf_lightning.checkpointing.rotation import final_cleanup_for_limit_one, foreign_checkpoints, rotate_checkpoints
from tests.helpers.models import RegressionModel, regression_data

BASE = dict(report_to="none", use_cpu=True, disable_tqdm=True, per_device_train_batch_size=4, logging_steps=1,
            save_steps=2)


def _train(out: Path, kind: str = "ours", resume=None, **overrides):
    values = dict(BASE, output_dir=str(out), **overrides)
    if kind == "hf":
        import transformers

        args = transformers.TrainingArguments(**values)
        trainer = transformers.Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(n=16))
    else:
        args = hf_lightning.TrainingArguments(**values)
        trainer = hf_lightning.Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(n=16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train(resume_from_checkpoint=resume)
    return trainer


def _names(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if not p.name.startswith("runs"))


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("kind", ["hf", "ours"])
def test_new_run_leaves_an_earlier_runs_checkpoints_alone(tmp_path, caplog, kind):
    out = tmp_path / "out"
    _train(out, kind, max_steps=12, save_total_limit=2)
    assert _names(out) == ["checkpoint-10", "checkpoint-12"]
    earlier = {name: _snapshot(out / name) for name in _names(out)}
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        _train(out, kind, max_steps=6, save_total_limit=2, learning_rate=1e-3)
    if kind == "hf":
        # HF's rotation counts the earlier run's folders as its own: it deletes them (mtime order) or, when all
        # mtimes lie within a second as here, this run's newer-by-time but lower-step folders (step order).
        assert len(_names(out)) == 2
        return
    assert _names(out) == ["checkpoint-10", "checkpoint-12", "checkpoint-4", "checkpoint-6"]
    for name, files in earlier.items():
        assert _snapshot(out / name) == files
    warning = next(r.getMessage() for r in caplog.records if "did not write" in r.getMessage())
    assert "checkpoint-10, checkpoint-12" in warning and "save_total_limit" in warning


def test_same_name_from_an_earlier_run_is_kept_aside(tmp_path, caplog):
    out = tmp_path / "out"
    _train(out, max_steps=4)
    earlier = {name: _snapshot(out / name) for name in ("checkpoint-2", "checkpoint-4")}
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        _train(out, max_steps=4, learning_rate=1e-3)
    names = _names(out)
    assert names[:2] == ["checkpoint-2", "checkpoint-4"]
    superseded = [n for n in names if n.startswith("superseded-")]
    assert [n.rsplit("-", 2)[0] for n in superseded] == ["superseded-checkpoint-2", "superseded-checkpoint-4"]
    for name in superseded:
        assert _snapshot(out / name) == earlier[name.removeprefix("superseded-").rsplit("-", 2)[0]]
    # The new run's folders are its own (another learning rate, other weights).
    assert (out / "checkpoint-4" / "model.safetensors").read_bytes() != earlier["checkpoint-4"]["model.safetensors"]
    assert any("is kept as" in r.getMessage() and "superseded-checkpoint-2" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("resume_name", ["checkpoint-6", "checkpoint-4"])
def test_resumed_lineage_rotates_as_hf_does(tmp_path, resume_name):
    """Resuming from the last checkpoint rotates its lineage exactly as HF; a later step left by resuming from an
    earlier checkpoint is the only folder kept aside."""
    folders = {}
    for kind in ("hf", "ours"):
        out = tmp_path / kind
        _train(out, kind, max_steps=6)
        _train(out, kind, resume=str(out / resume_name), max_steps=10, save_total_limit=2)
        folders[kind] = _names(out)
    assert folders["hf"] == ["checkpoint-10", "checkpoint-8"]
    if resume_name == "checkpoint-6":
        assert folders["ours"] == folders["hf"]
    else:
        # checkpoint-6 belonged to the abandoned continuation of checkpoint-4: rewritten by this run, kept aside.
        assert folders["ours"][:2] == folders["hf"]
        assert [n.rsplit("-", 2)[0] for n in folders["ours"][2:]] == ["superseded-checkpoint-6"]


def test_foreign_checkpoints_and_keep(tmp_path):
    out = tmp_path / "out"
    _train(out, max_steps=6)  # checkpoint-2, 4, 6
    paths = {n: str(out / n) for n in ("checkpoint-2", "checkpoint-4", "checkpoint-6")}
    assert foreign_checkpoints(out) == list(paths.values())
    assert foreign_checkpoints(out, resume_from=paths["checkpoint-4"]) == [paths["checkpoint-6"]]
    assert foreign_checkpoints(out, resume_from=tmp_path / "elsewhere") == list(paths.values())
    # keep: neither counted nor deleted.
    assert rotate_checkpoints(out, save_total_limit=1, use_mtime=False, keep=[paths["checkpoint-2"]]) == [
        paths["checkpoint-4"]]
    assert final_cleanup_for_limit_one(out, paths["checkpoint-6"], keep=[paths["checkpoint-2"]]) == []
    assert _names(out) == ["checkpoint-2", "checkpoint-6"]


def _fail_on(monkeypatch, suffix: str, code: int, nth_checkpoint: str):
    original = torch.save

    def save(obj, f, *args, **kwargs):
        if str(f).endswith(suffix) and nth_checkpoint in str(f):
            raise OSError(code, os.strerror(code), str(f))
        return original(obj, f, *args, **kwargs)

    monkeypatch.setattr(fmt.torch, "save", save)


@pytest.mark.parametrize("code,advice", [(errno.ENOSPC, "Free disk space"), (errno.EACCES, "Make output_dir writable")])
def test_disk_full_or_permission_error_while_saving(tmp_path, monkeypatch, code, advice):
    out = tmp_path / "out"
    # The temporary folder of checkpoint-4 is named after the step; fail while its optimizer.pt is written.
    _fail_on(monkeypatch, "optimizer.pt", code, ".tmp-checkpoint-4-")
    with pytest.raises(CheckpointSaveError, match=rf"checkpoint-4: {os.strerror(code)}.*earlier checkpoints in "
                                                  rf".*out are intact\. {advice}") as err:
        _train(out, max_steps=6, save_total_limit=1)
    assert isinstance(err.value, OSError) and err.value.errno == code
    assert _names(out) == ["checkpoint-2"]  # no temporary folder, no half checkpoint-4, nothing rotated away
    verify_checkpoint_files(out / "checkpoint-2")
    monkeypatch.undo()
    trainer = _train(out, resume=True, max_steps=6, save_total_limit=1)
    assert trainer.state.global_step == 6 and _names(out) == ["checkpoint-6"]


def test_failed_rename_over_an_existing_folder_puts_it_back(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _train(out, max_steps=2)
    before = _snapshot(out / "checkpoint-2")
    original = os.replace

    def replace(src, dst):
        if str(src).startswith(str(out / ".tmp-checkpoint-2-")) and not str(src).endswith(".replaced"):
            raise OSError(errno.EIO, os.strerror(errno.EIO), src)
        return original(src, dst)

    monkeypatch.setattr(fmt.os, "replace", replace)
    # Writing checkpoint-2 again in the same process (not an earlier run's folder: replaced, not kept aside).
    with pytest.raises(CheckpointSaveError, match="checkpoint-2"):
        fmt.write_checkpoint(out, 2, model=RegressionModel(), optimizer=torch.optim.SGD(RegressionModel().parameters(),
                             lr=0.1), scheduler=torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(
                                 RegressionModel().parameters(), lr=0.1), lambda s: 1.0),
                             state=hf_lightning.TrainerState(), args=None)
    assert _names(out) == ["checkpoint-2"]
    assert _snapshot(out / "checkpoint-2") == before
    shutil.rmtree(out)


def test_resume_finishes_a_rotation_a_kill_interrupted(tmp_path):
    """Killed after checkpoint-6 was published but before rotation: resuming at max_steps still ends with
    save_total_limit folders, as the uninterrupted run would."""
    out = tmp_path / "out"
    _train(out, max_steps=6)  # no limit: checkpoint-2, 4, 6 — the state such a kill leaves with a limit of 2
    trainer = _train(out, resume=True, max_steps=6, save_total_limit=2)
    assert trainer.state.global_step == 6
    assert _names(out) == ["checkpoint-4", "checkpoint-6"]
    # The checkpoint resumed from is never the one deleted, even when another is the newest by time (which HF's
    # rule protects too, so both stay).
    os.utime(out / "checkpoint-4", (2e9, 2e9))
    _train(out, resume=str(out / "checkpoint-6"), max_steps=6, save_total_limit=1)
    assert _names(out) == ["checkpoint-4", "checkpoint-6"]
