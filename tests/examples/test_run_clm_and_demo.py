"""``examples/run_clm.py`` and the ``make demo`` driver (``examples/demo.py``): short runs, resume, what is left."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tests.examples.conftest import EXAMPLES, load_example, quick_args

ROOT = EXAMPLES.parent
SMALL_GPT2 = ["--config_overrides", "n_embd=32,n_layer=1,n_head=2", "--vocab_size", "400", "--block_size", "32"]


def _clm_args(tmp_path: Path, max_steps: int) -> list[str]:
    return [*quick_args(tmp_path), *SMALL_GPT2, "--do_train", "--do_eval", "--max_steps", str(max_steps),
            "--per_device_train_batch_size", "4", "--max_eval_samples", "8", "--logging_steps", "1",
            "--eval_strategy", "steps", "--eval_steps", "2", "--save_steps", "2", "--save_total_limit", "2",
            "--lr_scheduler_type", "constant", "--learning_rate", "3e-3"]


def test_run_clm_trains_evaluates_saves_and_resumes(tmp_path, capsys):
    run_clm = load_example("run_clm")
    out = tmp_path / "out"
    first = run_clm.main(_clm_args(tmp_path, 4))
    assert first["perplexity"] == pytest.approx(math.exp(first["eval_loss"]))
    assert "eval_accuracy" in first and 0.0 <= first["eval_accuracy"] <= 1.0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    # The output folder loads back with transformers: weights, config and the tokenizer trained at start-up.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert AutoModelForCausalLM.from_pretrained(out).config.n_embd == 32
    assert len(AutoTokenizer.from_pretrained(out)) == 400
    printed = capsys.readouterr().out
    assert "***** train metrics *****" in printed and "***** eval metrics *****" in printed

    # The same command with more steps picks up checkpoint-4 (get_last_checkpoint) and continues to step 6.
    run_clm.main(_clm_args(tmp_path, 6))
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    logged_steps = [entry["step"] for entry in state["log_history"] if "loss" in entry]
    assert logged_steps == [1, 2, 3, 4, 5, 6], "the resumed run keeps the first run's log history"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]


def test_run_clm_reads_a_json_file_of_arguments(tmp_path):
    run_clm = load_example("run_clm")
    options = {
        "output_dir": str(tmp_path / "out"), "cache_dir": str(tmp_path / "cache"), "disable_tqdm": True,
        "use_cpu": True, "config_overrides": "n_embd=32,n_layer=1,n_head=2", "vocab_size": 400, "block_size": 32,
        "do_train": True, "max_steps": 2, "per_device_train_batch_size": 4, "save_steps": 2,
    }
    path = tmp_path / "args.json"
    path.write_text(json.dumps(options))
    metrics = run_clm.main([str(path)])
    assert metrics["epoch"] > 0 and (tmp_path / "out" / "checkpoint-2").is_dir()


def test_run_clm_rejects_a_tokenizer_name_that_is_not_a_local_folder(tmp_path):
    run_clm = load_example("run_clm")
    with pytest.raises(ValueError, match=r"--tokenizer_name 'gpt2' is not a folder with a tokenizer.json"):
        run_clm.main([*_clm_args(tmp_path, 2), "--tokenizer_name", "gpt2"])


def test_demo_trains_resumes_and_prints_a_summary(tmp_path, capsys, caplog):
    demo = load_example("demo")
    out = tmp_path / "demo_output"
    runs = demo.main(["--output_dir", str(out), "--first_steps", "3", "--total_steps", "5"])
    printed = capsys.readouterr().out

    (first_name, first), (second_name, second) = runs
    assert (first["first_step"], first["global_step"]) == (0, 3)
    assert (second["first_step"], second["global_step"]) == (3, 5)
    assert f"Checkpoint detected, resuming training at {out / 'checkpoint-3'}" in caplog.text
    for metrics in (first, second):
        assert metrics["perplexity"] == pytest.approx(math.exp(metrics["eval_loss"]))
    # The summary table: a header, a rule, one row per run, then what is on disk.
    summary = printed[printed.index("Summary"):]
    assert re.search(r"^run\s+steps\s+train loss\s+eval loss\s+eval accuracy\s+perplexity$", summary, re.M)
    assert re.search(r"^1: from scratch\s+0 -> 3\s", summary, re.M)
    assert re.search(r"^2: resumed\s+3 -> 5\s", summary, re.M)
    assert "checkpoints left    checkpoint-4, checkpoint-5  (save_total_limit=2)" in summary
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-5"]
    # HF names the run folder after the second it started (<Mon DD_HH-MM-SS>_<host>): two invocations in the same
    # second share one folder, each writing its own event file.
    event_files = list(out.glob("runs/*/events.out.tfevents.*"))
    assert len(event_files) >= 2, "each invocation writes TensorBoard events"
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()

    # Running the demo again replaces its own folder.
    demo.main(["--output_dir", str(out), "--first_steps", "1", "--total_steps", "2"])
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--first_steps", "5", "--total_steps", "5"], r"--first_steps \(5\) must be positive and below --total_steps"),
        (["--first_steps", "0"], r"--first_steps \(0\) must be positive"),
    ],
)
def test_demo_rejects_step_counts_that_cannot_resume(tmp_path, argv, message):
    demo = load_example("demo")
    with pytest.raises(SystemExit, match=message):
        demo.main(["--output_dir", str(tmp_path / "d"), *argv])
    assert not (tmp_path / "d").exists()


def test_demo_leaves_a_folder_it_did_not_write_alone(tmp_path):
    demo = load_example("demo")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="exists and was not written by this demo"):
        demo.main(["--output_dir", str(tmp_path / "mine"), "--first_steps", "1", "--total_steps", "2"])
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_make_demo_runs_the_run_clm_demo():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "examples/demo.py" in recipe and "--output_dir demo_output" in recipe
