"""Tampered and truncated checkpoint files: resuming refuses them, runs no code, and names the file.

Every pickle-based file a checkpoint folder can hold (``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``,
``rng_state.pth``, ``rng_state_{rank}.pth``, ``training_args.bin``) gets a code-running payload (inside a
``torch.save`` archive, or as a raw pickle) or is cut in half, and a resume is attempted through both entry
points: ``Trainer.train(resume_from_checkpoint=...)`` and ``lightning.Trainer.fit(..., ckpt_path=...)``. Files our
CPU run does not write itself (``scaler.pt``, ``rng_state_1.pth``) are planted: resuming must judge every such
file in the folder, not only the ones this run would read.
"""

from __future__ import annotations

import os
import pickle
import shutil
import warnings
from pathlib import Path

import pytest
import torch

import hf_lightning
from hf_lightning.checkpointing.errors import CheckpointLoadError
from hf_lightning.checkpointing.safe_load import verify_checkpoint_files
from tests.helpers.models import RegressionModel, regression_data
from tests.helpers.recorder import EventRecorder

VICTIMS = ["optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state.pth", "rng_state_1.pth", "training_args.bin"]
KINDS = ["payload", "raw_pickle_payload", "truncated"]
BASE = dict(report_to="none", use_cpu=True, disable_tqdm=True, per_device_train_batch_size=4, save_steps=2,
            logging_steps=1)


class Payload:
    """Unpickling this creates the folder named by HFL_TAMPER_MARKER: proof that code ran."""

    def __reduce__(self):
        return os.mkdir, (os.environ["HFL_TAMPER_MARKER"],)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A checkpoint written by hf_lightning after 2 steps, plus a genuine scaler.pt and rng_state_1.pth."""
    out = tmp_path_factory.mktemp("source") / "out"
    args = hf_lightning.TrainingArguments(output_dir=str(out), max_steps=2, **BASE)
    hf_lightning.Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(n=16)).train()
    folder = out / "checkpoint-2"
    torch.save(torch.amp.GradScaler("cpu", init_scale=1024.0).state_dict(), folder / "scaler.pt")
    shutil.copy(folder / "rng_state.pth", folder / "rng_state_1.pth")
    return folder


def _tamper(path: Path, kind: str) -> None:
    if kind == "payload":
        torch.save({"state": {}, "param_groups": [], "evil": Payload()}, path)
    elif kind == "raw_pickle_payload":
        with open(path, "wb") as f:
            pickle.dump({"state": Payload()}, f)
    else:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])


def _resume(entry: str, folder: Path, out: Path, recorder: EventRecorder) -> None:
    args = hf_lightning.TrainingArguments(output_dir=str(out), max_steps=4, **BASE)
    model, train = RegressionModel(), regression_data(n=16)
    if entry == "facade":
        trainer = hf_lightning.Trainer(model=model, args=args, train_dataset=train, callbacks=[recorder])
        trainer.train(resume_from_checkpoint=str(folder))
    else:
        pl_trainer = hf_lightning.build_lightning_trainer(args, callbacks=[recorder], enable_progress_bar=False,
                                                          logger=False)
        pl_trainer.fit(hf_lightning.HFLightningModule(model, args),
                       datamodule=hf_lightning.HFDataModule(args, train_dataset=train), ckpt_path=str(folder))


@pytest.mark.parametrize("entry", ["facade", "native"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("victim", VICTIMS)
def test_tampered_file_is_refused_naming_it(tmp_path, monkeypatch, checkpoint, victim, kind, entry):
    folder = tmp_path / "out" / "checkpoint-2"
    shutil.copytree(checkpoint, folder)
    marker = tmp_path / "payload_ran"
    monkeypatch.setenv("HFL_TAMPER_MARKER", str(marker))
    _tamper(folder / victim, kind)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    recorder = EventRecorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CheckpointLoadError, match=rf"Cannot load .*checkpoint-2/{victim.replace('.', r'[.]')}: ") \
                as err:
            _resume(entry, folder, tmp_path / "out", recorder)
    message = str(err.value)
    assert "weights_only=False" not in message
    assert "delete that folder" in message  # says what to do
    assert not marker.exists(), "the payload ran"
    assert not [e for e in recorder.events if e.startswith(("on_step_end", "on_optimizer_step", "on_save"))]
    # Nothing written or changed on disk.
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoint-2"]
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_untampered_checkpoint_resumes(tmp_path, checkpoint):
    """The planted genuine scaler.pt / rng_state_1.pth pass, so the refusals above come from the tampering."""
    folder = tmp_path / "out" / "checkpoint-2"
    shutil.copytree(checkpoint, folder)
    assert set(verify_checkpoint_files(folder)) >= set(VICTIMS)
    recorder = EventRecorder()
    _resume("facade", folder, tmp_path / "out", recorder)
    assert sum(e.startswith("on_step_end") for e in recorder.events) == 2


def test_checkpoint_written_by_hf_passes_verification(tmp_path):
    """HF's training_args.bin names transformers / accelerate / torch classes; none of that is taken for tampering."""
    import transformers

    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=1, save_steps=1, **{
        k: v for k, v in BASE.items() if k != "save_steps"})
    transformers.Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(n=8)).train()
    checked = verify_checkpoint_files(tmp_path / "checkpoint-1")
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin", "trainer_state.json"} <= set(checked)


class MyTrainingArguments(hf_lightning.TrainingArguments):
    """A user's own subclass, pickled under this test module's name."""


def test_training_args_of_a_user_subclass_are_accepted(tmp_path):
    torch.save(MyTrainingArguments(output_dir=str(tmp_path), report_to="none"), tmp_path / "training_args.bin")
    assert verify_checkpoint_files(tmp_path) == ["training_args.bin"]
