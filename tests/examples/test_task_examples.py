"""``run_glue.py``, ``run_ner.py``, ``run_translation.py`` and ``lightning_native.py``: a few steps each, what they
report and leave on disk, and each one's documented command line."""

from __future__ import annotations

import ast
import json
import shlex
import subprocess
import sys

import pytest

from tests.examples.conftest import EXAMPLES, load_example, quick_args

SMALL_BERT = ["--config_overrides", "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64"]
SMALL_T5 = ["--config_overrides", "d_model=32,d_ff=64,d_kv=8,num_heads=4,num_layers=1,num_decoder_layers=1"]
FEW_STEPS = ["--max_steps", "4", "--per_device_train_batch_size", "8", "--logging_steps", "2", "--eval_strategy",
             "steps", "--eval_steps", "2", "--save_steps", "2", "--save_total_limit", "1", "--learning_rate", "1e-3"]
FEW_ROWS = ["--max_eval_samples", "16", "--max_predict_samples", "16"]


def _documented_command(name: str) -> list[str]:
    """The command line in the script's docstring, as words after ``python examples/<name>.py``."""
    docstring = ast.get_docstring(ast.parse((EXAMPLES / f"{name}.py").read_text()))
    command = docstring[docstring.index(f"python examples/{name}.py"):].split("\n\n")[0]
    words = shlex.split(command.replace("\\\n", " "))
    return words[2:]


def test_run_glue_reports_accuracy_f1_and_writes_predictions(tmp_path):
    run_glue = load_example("run_glue")
    results = run_glue.main([*quick_args(tmp_path), *SMALL_BERT, *FEW_STEPS, *FEW_ROWS,
                             "--do_train", "--do_eval", "--do_predict"])
    for key in ("train_loss", "eval_loss", "eval_accuracy", "eval_f1", "predict_accuracy", "predict_f1"):
        assert key in results, key
    out = tmp_path / "out"
    lines = (out / "predict_results.txt").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 17
    assert {line.split("\t")[1] for line in lines[1:]} <= {"negative", "positive"}
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]
    all_results = json.loads((out / "all_results.json").read_text())
    assert {"train_loss", "eval_accuracy", "predict_f1"} <= set(all_results)
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}


def test_run_ner_reports_entity_scores_and_writes_tags(tmp_path):
    run_ner = load_example("run_ner")
    results = run_ner.main([*quick_args(tmp_path), *SMALL_BERT, *FEW_STEPS, *FEW_ROWS,
                            "--do_train", "--do_eval", "--do_predict", "--label_all_tokens", "true"])
    for key in ("eval_precision", "eval_recall", "eval_f1", "eval_accuracy", "predict_f1"):
        assert 0.0 <= results[key] <= 1.0, key
    out = tmp_path / "out"
    predicted = (out / "predictions.txt").read_text().splitlines()
    test_rows = [json.loads(line) for line in (EXAMPLES / "data" / "ner" / "test.jsonl").read_text().splitlines()]
    # One tag per word (the [CLS]/[SEP] tokens and -100 positions are left out).
    assert [len(line.split()) for line in predicted] == [len(row["tokens"]) for row in test_rows[:16]]
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"]["0"] == "O" and set(config["label2id"]) == {
        "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"}


def _generation_supported() -> str | None:
    """Why ``Seq2SeqTrainer`` cannot run ``predict_with_generate`` yet, or None when it can."""
    import tempfile

    import hf_lightning
    from tests.helpers.models import RegressionModel

    with tempfile.TemporaryDirectory() as output_dir:
        args = hf_lightning.Seq2SeqTrainingArguments(output_dir=output_dir, predict_with_generate=True,
                                                     report_to="none")
        try:
            hf_lightning.Seq2SeqTrainer(model=RegressionModel(), args=args)
        except ValueError as exc:
            return f"Seq2SeqTrainer refuses predict_with_generate=True: {exc}"
    return None


def test_run_translation_trains_on_the_loss(tmp_path):
    run_translation = load_example("run_translation")
    results = run_translation.main([*quick_args(tmp_path), *SMALL_T5, *FEW_STEPS, *FEW_ROWS,
                                    "--do_train", "--do_eval", "--do_predict"])
    assert {"train_loss", "eval_loss", "predict_loss"} <= set(results)
    assert "eval_bleu" not in results, "without --predict_with_generate the evaluation reports the loss only (HF)"
    assert not (tmp_path / "out" / "generated_predictions.txt").exists()


def test_run_translation_with_predict_with_generate(tmp_path):
    reason = _generation_supported()
    if reason is not None:
        pytest.skip(reason)
    run_translation = load_example("run_translation")
    results = run_translation.main([*quick_args(tmp_path), *SMALL_T5, *FEW_STEPS, *FEW_ROWS,
                                    "--do_train", "--do_eval", "--do_predict", "--predict_with_generate",
                                    "--val_max_target_length", "12", "--num_beams", "2"])
    for key in ("eval_bleu", "eval_gen_len", "predict_bleu", "predict_gen_len"):
        assert key in results, key
    assert 0 < results["predict_gen_len"] <= 12
    lines = (tmp_path / "out" / "generated_predictions.txt").read_text().splitlines()
    assert len(lines) == 16


def test_lightning_native_trains_with_a_plain_lightning_trainer_and_its_own_callback(tmp_path):
    native = load_example("lightning_native")
    results = native.main([*quick_args(tmp_path), *SMALL_BERT, *FEW_STEPS, "--do_train", "--do_eval",
                           "--do_predict"])
    # The user's Lightning callback saw one training batch per optimizer step.
    assert results["throughput_global_step"] == 4
    # torchmetrics streamed the evaluation metrics under HF's names.
    assert {"eval_loss", "eval_accuracy", "eval_f1", "predict_accuracy"} <= set(results)
    out = tmp_path / "out"
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    assert [entry["step"] for entry in state["log_history"] if "eval_accuracy" in entry] == [2, 4]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]
    assert len((out / "predict_results.txt").read_text().splitlines()) == 101

    # The same command with more steps resumes through fit(ckpt_path=<checkpoint-4>).
    native.main([*quick_args(tmp_path), *SMALL_BERT, *FEW_STEPS, "--max_steps", "6", "--do_train"])
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    assert [entry["step"] for entry in state["log_history"] if "loss" in entry] == [2, 4, 6]


def test_lightning_native_refuses_evaluation_without_training(tmp_path):
    native = load_example("lightning_native")
    with pytest.raises(ValueError, match="lightning_native.py evaluates the model it has just trained: add --do_train"):
        native.main([*quick_args(tmp_path), "--do_eval"])


@pytest.mark.parametrize("name", ["run_clm", "run_glue", "run_ner", "run_translation", "lightning_native"])
def test_documented_command_parses(name):
    """Every script's docstring shows a command line; its words are valid arguments of that script."""
    module = load_example(name)
    words = _documented_command(name)
    assert words[:2] == ["--output_dir", f"out/{name.split('_')[-1]}"]
    training_cls = module.Seq2SeqTrainingArguments if name == "run_translation" else module.TrainingArguments
    parser = module.HfArgumentParser((module.ModelArguments, module.DataTrainingArguments, training_cls))
    _, _, training_args = parser.parse_args_into_dataclasses(words, look_for_args_file=False)
    assert training_args.do_train


def test_run_glue_runs_as_a_command_line(tmp_path):
    """The script as a user runs it: a fresh interpreter, `python examples/run_glue.py ...`."""
    command = [sys.executable, str(EXAMPLES / "run_glue.py"), *quick_args(tmp_path), *SMALL_BERT, "--max_steps",
               "2", "--do_train", "--do_eval", "--max_eval_samples", "8"]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "***** eval metrics *****" in finished.stdout and "eval_accuracy" in finished.stdout
    assert (tmp_path / "out" / "checkpoint-2").is_dir()
