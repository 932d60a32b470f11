"""README.md's examples run: the ```python blocks as written, and both sides of the migration ```diff."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_lightning.demo import PatternDataset, build_model
from tests.helpers.parity import assert_log_history_equal

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


def _diff_side(diff: str, side: str) -> str:
    """The code of one side of a unified-diff block: ``side`` is "-" (before) or "+" (after)."""
    other = "+" if side == "-" else "-"
    return "\n".join(line[1:] for line in diff.splitlines() if line and line[0] != other)


def _token_accuracy(eval_pred) -> dict[str, float]:
    # Next-token accuracy: the logits at t predict the label at t + 1 (the demo model's shifted loss).
    predictions = np.argmax(eval_pred.predictions[:, :-1], axis=-1)
    return {"accuracy": float((predictions == eval_pred.label_ids[:, 1:]).mean())}


def test_readme_has_the_quick_start_commands_and_links():
    text = README.read_text()
    bash = "\n".join(_blocks("bash"))
    assert re.search(r"^make demo\b", bash, re.MULTILINE) and re.search(r"^make test\b", bash, re.MULTILINE)
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.MULTILINE) and re.search(r"^test:", makefile, re.MULTILINE)
    for link in re.findall(r"\]\(([^)#]+\.md)\)", text):
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"
    assert "docs/migration.md" in text and "docs/architecture.md" in text


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_python_block_runs_as_written(tmp_path, monkeypatch, index):
    monkeypatch.chdir(tmp_path)
    code = _blocks("python")[index]
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": f"readme_block_{index}"})
    if "native_output" in code:
        # What the README promises after the Lightning-native example: a lightning.Trainer the user built.
        assert "pl.Trainer(" in code and "build_lightning_trainer" not in code
        assert sorted(p.name for p in (tmp_path / "native_output").glob("checkpoint-*")) == [
            "checkpoint-10",
            "checkpoint-20",
        ]
        assert not list(tmp_path.rglob("*.ckpt"))  # no Lightning checkpoint beside HF's folders


def test_readme_has_runnable_python():
    assert _blocks("python"), "README.md has no ```python block for test_python_block_runs_as_written to run"


def test_migration_diff_runs_the_same_on_both_sides(tmp_path, monkeypatch):
    """The "before" side with transformers and the "after" side with hf_lightning: same logs and checkpoints."""
    (diff,) = _blocks("diff")
    results = {}
    for side, name in (("-", "hf"), ("+", "ours")):
        code = _diff_side(diff, side)
        assert ("from transformers import" in code) == (name == "hf")
        run_dir = tmp_path / name
        run_dir.mkdir()
        monkeypatch.chdir(run_dir)
        torch.set_num_threads(1)
        # The names the example leaves to the reader's script, made tiny: 3 epochs of 25 steps.
        namespace = {
            "model": build_model(seed=0),
            "train_ds": PatternDataset(200, seed=0),
            "eval_ds": PatternDataset(32, seed=1),
            "compute_metrics": _token_accuracy,
        }
        exec(compile(code, f"README.md diff ({name})", "exec"), namespace)
        results[name] = (namespace["trainer"], namespace["metrics"], run_dir / "out")

    (hf_trainer, hf_metrics, hf_out), (our_trainer, our_metrics, our_out) = results["hf"], results["ours"]
    assert_log_history_equal(hf_trainer.state.log_history, our_trainer.state.log_history)
    assert any("eval_accuracy" in entry for entry in our_trainer.state.log_history)
    assert our_metrics["eval_loss"] == pytest.approx(hf_metrics["eval_loss"], rel=1e-5)
    assert our_metrics["eval_accuracy"] == pytest.approx(hf_metrics["eval_accuracy"], rel=1e-5)
    checkpoints = sorted(p.name for p in hf_out.glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-50", "checkpoint-75"]
    assert sorted(p.name for p in our_out.glob("checkpoint-*")) == checkpoints
    assert (our_out / "model.safetensors").is_file() and (hf_out / "model.safetensors").is_file()
