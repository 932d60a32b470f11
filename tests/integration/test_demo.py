"""The demo (``python -m hf_lightning.demo``): what it prints and leaves on disk, and the same run through HF."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_lightning.demo import DemoArguments, build_datasets, build_model, main, training_kwargs
from tests.helpers.parity import assert_log_history_equal

MAX_STEPS = 6


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """One 6-step demo run shared by the tests below: ``(output_dir, summary, printed text)``."""
    import contextlib
    import io

    output_dir = tmp_path_factory.mktemp("demo") / "out"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        summary = main(["--output_dir", str(output_dir), "--max_steps", str(MAX_STEPS)])
    return output_dir, summary, printed.getvalue()


def test_demo_prints_train_and_eval_metrics_and_a_summary(demo_run):
    _, summary, printed = demo_run
    for heading in ("***** train metrics *****", "***** eval metrics *****", "***** demo summary *****"):
        assert heading in printed
    assert "perplexity" in printed
    assert "checkpoint-4, checkpoint-6" in printed
    assert summary["global_step"] == MAX_STEPS
    assert summary["perplexity"] == pytest.approx(math.exp(summary["eval_loss"]))


def test_demo_leaves_rotated_checkpoints_model_metrics_and_tensorboard_logs(demo_run):
    output_dir, summary, _ = demo_run
    # save_steps = 2 with save_total_limit=2: checkpoint-2 was written, then rotated away.
    checkpoints = sorted(p.name for p in output_dir.glob("checkpoint-*"))
    assert checkpoints == summary["checkpoints"] == ["checkpoint-4", "checkpoint-6"]
    for name in checkpoints:
        files = {p.name for p in (output_dir / name).iterdir()}
        assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"} <= files
    for name in ("model.safetensors", "trainer_state.json", "train_results.json", "eval_results.json"):
        assert (output_dir / name).is_file(), name
    all_results = json.loads((output_dir / "all_results.json").read_text())
    assert {"train_loss", "eval_loss", "perplexity"} <= set(all_results)
    assert list(output_dir.glob("runs/*/events.out.tfevents.*")), "report_to='tensorboard' wrote no event file"


def test_demo_matches_transformers_trainer(demo_run, tmp_path):
    """The same arguments, model and data through ``transformers.Trainer``: same logs, checkpoints, weights."""
    import transformers

    output_dir, _, _ = demo_run
    demo = DemoArguments(output_dir=str(tmp_path / "hf"), max_steps=MAX_STEPS)
    train_dataset, eval_dataset = build_datasets(demo.seed)
    trainer = transformers.Trainer(
        model=build_model(demo.seed),
        args=transformers.TrainingArguments(**training_kwargs(demo)),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
    )
    trainer.train()
    trainer.evaluate()
    trainer.save_model()
    trainer.save_state()

    # Both sides as written to trainer_state.json (HF's JSON sorts each entry's keys).
    hf_state = json.loads((tmp_path / "hf" / "trainer_state.json").read_text())
    our_state = json.loads((output_dir / "trainer_state.json").read_text())
    assert_log_history_equal(hf_state["log_history"], our_state["log_history"])
    assert our_state["global_step"] == hf_state["global_step"] == MAX_STEPS
    assert sorted(p.name for p in (tmp_path / "hf").glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    hf_weights = load_file(tmp_path / "hf" / "model.safetensors")
    our_weights = load_file(output_dir / "model.safetensors")
    assert hf_weights.keys() == our_weights.keys()
    for key in hf_weights:
        torch.testing.assert_close(our_weights[key], hf_weights[key], rtol=1e-5, atol=1e-6, msg=key)


def test_demo_loss_falls_on_the_learnable_pattern(tmp_path, capsys):
    summary = main(["--output_dir", str(tmp_path), "--max_steps", "24"])
    # Guessing costs ln(32) ≈ 3.47; the rule is learnable, so the loss must clearly fall within 24 steps.
    assert summary["final_loss"] < 0.7 * summary["first_loss"]
    assert summary["eval_loss"] < math.log(32) - 0.5


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max_steps", "0"], "--max_steps must be a positive number of optimizer steps, got 0"),
        (["--max_steps", "-3"], "--max_steps must be a positive number of optimizer steps, got -3"),
    ],
)
def test_demo_rejects_a_non_positive_step_count(tmp_path, argv, message):
    with pytest.raises(ValueError, match=message):
        main(["--output_dir", str(tmp_path), *argv])
    assert not list(tmp_path.iterdir()), "nothing may be written before the arguments are checked"


def test_demo_rejects_unknown_options(tmp_path):
    with pytest.raises(ValueError, match=r"not used by the HfArgumentParser: \['--bogus', '1'\]"):
        main(["--output_dir", str(tmp_path), "--bogus", "1"])
