"""Checkpoint folders, rotation, best model and save helpers against transformers.Trainer."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.models import lm_data, tiny_gpt2
from tests.helpers.parity import assert_parity, run_pair

BASE = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=2,
            eval_strategy="steps", eval_steps=2, save_steps=2, learning_rate=2e-2, per_device_eval_batch_size=8)


def _files(run, name):
    return sorted(p.name for p in (Path(run.output_dir) / name).iterdir())


def _state(run, name):
    return json.loads((Path(run.output_dir) / name / "trainer_state.json").read_text())


@pytest.mark.parametrize("limit", [1, 2, 3])
@pytest.mark.parametrize("best", [False, True])
def test_rotation_and_best_model(tmp_path, limit, best):
    train, evald = lm_data(n_train=48, n_eval=8)
    args = dict(BASE, save_total_limit=limit, load_best_model_at_end=best)
    hf, ours = run_pair(lambda: tiny_gpt2(), tmp_path, train_dataset=train, eval_dataset=evald, args=args)
    assert_parity(hf, ours)
    assert ours.checkpoints() == hf.checkpoints()
    for name in ours.checkpoints():
        # training_args.json is written beside training_args.bin on purpose (arguments without unpickling).
        assert [f for f in _files(ours, name) if f != "training_args.json"] == _files(hf, name)
        hf_state, our_state = _state(hf, name), _state(ours, name)
        for key in ("best_metric", "global_step", "epoch", "best_global_step"):
            if hf_state[key] is None:
                assert our_state[key] is None, key
            else:
                assert our_state[key] == pytest.approx(hf_state[key], rel=1e-5), key
        for key in ("best_model_checkpoint",):
            a, b = hf_state[key], our_state[key]
            assert (a is None) == (b is None) and (a is None or Path(a).name == Path(b).name)
        assert len(our_state["log_history"]) == len(hf_state["log_history"])
    if best:
        # The user's model object holds the best checkpoint's weights.
        best_dir = Path(ours.trainer.state.best_model_checkpoint)
        saved = load_file(str(best_dir / "model.safetensors"))
        for key, value in saved.items():
            assert torch.equal(ours.state_dict[key], value), key


def test_save_strategy_epoch_and_best(tmp_path):
    train, evald = lm_data(n_train=40, n_eval=8)
    for extra in (dict(eval_strategy="epoch", save_strategy="epoch"),
                  dict(save_strategy="best", metric_for_best_model="loss")):
        args = dict(BASE, **extra)
        hf, ours = run_pair(lambda: tiny_gpt2(), tmp_path / extra["save_strategy"], train_dataset=train,
                            eval_dataset=evald, args=args)
        assert_parity(hf, ours)
        assert ours.checkpoints() == hf.checkpoints()


def test_save_only_model_and_ratio_save_steps(tmp_path):
    train, evald = lm_data(n_train=40, n_eval=8)
    args = dict(BASE, save_only_model=True, save_steps=0.5, eval_strategy="no")
    hf, ours = run_pair(lambda: tiny_gpt2(), tmp_path, train_dataset=train, args=args)
    assert ours.checkpoints() == hf.checkpoints()
    for name in ours.checkpoints():
        assert [f for f in _files(ours, name) if f != "training_args.json"] == _files(hf, name)


def test_save_model_state_and_metrics_files(tmp_path):
    train, evald = lm_data(n_train=24, n_eval=8)
    hf, ours = run_pair(lambda: tiny_gpt2(), tmp_path, train_dataset=train, eval_dataset=evald,
                        args=dict(BASE, save_strategy="no", eval_strategy="no"))
    for run in (hf, ours):
        metrics = run.trainer.evaluate()
        run.trainer.save_model()
        run.trainer.save_state()
        run.trainer.save_metrics("eval", metrics)
        run.trainer.save_metrics("train", run.train_output.metrics)
    hf_files = sorted(os.listdir(hf.output_dir))
    ours_files = sorted(f for f in os.listdir(ours.output_dir) if f != "training_args.json")
    assert ours_files == hf_files
    for name in ("all_results.json", "eval_results.json"):
        a = json.loads((Path(hf.output_dir) / name).read_text())
        b = json.loads((Path(ours.output_dir) / name).read_text())
        assert sorted(a) == sorted(b)
        assert b["eval_loss"] == pytest.approx(a["eval_loss"], rel=1e-5)
    a = load_file(str(Path(hf.output_dir) / "model.safetensors"))
    b = load_file(str(Path(ours.output_dir) / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6)
