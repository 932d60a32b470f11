"""A ``lightning.Trainer`` the user builds (no ``build_lightning_trainer``) fitting ``HFLightningModule`` against the
real ``transformers.Trainer``, dropout on: log_history, HF callback events, checkpoint-N folders after rotation, the
best model and the final weights; then ``fit(ckpt_path=checkpoint-N)`` on another user-built trainer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.models import lm_data
from tests.helpers.parity import assert_log_history_equal, assert_weights_close, run
from tests.helpers.recorder import EventRecorder

ARGS = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=2,
            eval_strategy="steps", eval_steps=2, save_steps=2, save_total_limit=2, load_best_model_at_end=True,
            learning_rate=2e-2, per_device_eval_batch_size=8)


def _gpt2_with_dropout():
    from transformers import GPT2Config, GPT2LMHeadModel, set_seed

    set_seed(42)
    # GPT-2's default dropout (0.1) in the embeddings, attention and residuals.
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16))


def _user_built_fit(output_dir: Path, train, evald, ckpt_path: str | None = None):
    """What a Lightning user writes: their own lightning.Trainer, HF's pieces as the module and datamodule."""
    from hf_lightning import HFDataModule, HFLightningModule, TrainingArguments

    torch.set_num_threads(1)
    args = TrainingArguments(output_dir=str(output_dir), report_to="none", use_cpu=True, disable_tqdm=True, seed=42,
                             **ARGS)
    model = _gpt2_with_dropout()
    recorder = EventRecorder()
    module = HFLightningModule(model, args, callbacks=[recorder])
    trainer = pl.Trainer(accelerator="cpu", devices=1, enable_checkpointing=False, logger=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=HFDataModule(args, train_dataset=train, eval_dataset=evald), ckpt_path=ckpt_path)
    return module, recorder, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _checkpoint_files(root: Path, name: str) -> list[str]:
    # training_args.json is written beside training_args.bin on purpose (arguments without unpickling).
    return sorted(p.name for p in (root / name).iterdir() if p.name != "training_args.json")


def test_user_built_lightning_trainer_matches_transformers_trainer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Lightning's default_root_dir
    train, evald = lm_data(n_train=48, n_eval=8)
    hf = run("hf", _gpt2_with_dropout, tmp_path, train_dataset=train, eval_dataset=evald, args=ARGS)
    ours_dir = tmp_path / "ours"
    module, recorder, weights = _user_built_fit(ours_dir, train, evald)

    assert_log_history_equal(hf.log_history, module.trainer_state.log_history)
    assert recorder.events == hf.events
    hf_dir = Path(hf.output_dir)
    kept = sorted((p.name for p in ours_dir.glob("checkpoint-*")), key=lambda n: int(n.split("-")[1]))
    assert kept == hf.checkpoints() and len(kept) == 2
    hf_best = Path(hf.trainer.state.best_model_checkpoint).name
    assert Path(module.trainer_state.best_model_checkpoint).name == hf_best
    assert hf_best != kept[-1], "the run should exercise rotation keeping an older best checkpoint"
    for name in kept:
        assert _checkpoint_files(ours_dir, name) == _checkpoint_files(hf_dir, name)
        ours_state = json.loads((ours_dir / name / "trainer_state.json").read_text())
        hf_state = json.loads((hf_dir / name / "trainer_state.json").read_text())
        for key in ("best_metric", "global_step", "epoch", "best_global_step"):
            assert ours_state[key] == pytest.approx(hf_state[key], rel=1e-5), (name, key)
        assert Path(ours_state["best_model_checkpoint"]).name == Path(hf_state["best_model_checkpoint"]).name
    # load_best_model_at_end: the final weights are the best checkpoint's, as HF's.
    assert_weights_close(hf.state_dict, weights)
    for key, value in load_file(str(ours_dir / hf_best / "model.safetensors")).items():
        assert torch.equal(weights[key], value), key
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "ours"]  # nothing from Lightning in the cwd

    # Resume a copy of the best (mid-run) checkpoint on another user-built trainer: same end as the whole run.
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(ours_dir / hf_best, resumed_dir / hf_best)
    resumed, _, resumed_weights = _user_built_fit(resumed_dir, train, evald, ckpt_path=str(resumed_dir / hf_best))
    assert_log_history_equal(module.trainer_state.log_history, resumed.trainer_state.log_history, rtol=0,
                             ordered=False, skip_keys=("train_loss",))
    for key in weights:
        assert torch.equal(resumed_weights[key], weights[key]), key


def test_facade_build_lightning_trainer_and_user_built_trainer_are_bit_identical(tmp_path, monkeypatch):
    """Dropout on, so the seeding moment matters: HF's Trainer() seeds once the model exists; HFLightningModule(...)
    does the same on the Lightning-native paths."""
    monkeypatch.chdir(tmp_path)
    train, evald = lm_data(n_train=24, n_eval=8)
    args = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=1,
                eval_strategy="steps", eval_steps=2, learning_rate=3e-3, save_strategy="no")
    runs = {native: run("ours", _gpt2_with_dropout, tmp_path, train_dataset=train, eval_dataset=evald, args=args,
                        native=native) for native in (False, True, "user")}
    facade = runs[False]
    for native in (True, "user"):
        assert_log_history_equal(facade.log_history, runs[native].log_history, rtol=0)
        assert runs[native].events == facade.events, native
        for key, value in facade.state_dict.items():
            assert torch.equal(runs[native].state_dict[key], value), (native, key)
    assert {p.name for p in tmp_path.iterdir()} <= {"ours", "ours_native", "ours_user"}  # no lightning_logs/
