"""Our run of the golden configuration against HF's recorded artifacts and a live HF run."""

import json
from pathlib import Path

import pytest

import torch

from tests.helpers.models import DictDataset
from tests.helpers.parity import assert_parity, run, run_pair

GOLDEN = Path(__file__).resolve().parents[3] / "shared" / "reference" / "golden"

GOLDEN_ARGS = dict(
    per_device_train_batch_size=4, per_device_eval_batch_size=8, gradient_accumulation_steps=2,
    num_train_epochs=2, logging_steps=2, eval_strategy="steps", eval_steps=4, save_steps=4,
    save_total_limit=2, load_best_model_at_end=True,
)


def _gpt2():
    # Exactly make_golden.py's model: GPT-2 defaults (dropout 0.1 included), seeded with set_seed(42).
    from transformers import GPT2Config, GPT2LMHeadModel, set_seed

    set_seed(42)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16))


def lm_data():
    # Exactly make_golden.py's data.
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (80, 16), dtype=torch.long)
    rows = [{"input_ids": r, "attention_mask": torch.ones_like(r), "labels": r.clone()} for r in ids]
    return DictDataset(rows[:64]), DictDataset(rows[64:])


def test_golden_run_matches_live_hf(tmp_path):
    train, evald = lm_data()
    hf, ours = run_pair(_gpt2, tmp_path, train_dataset=train, eval_dataset=evald, args=GOLDEN_ARGS)
    assert_parity(hf, ours)
    assert ours.checkpoints() == hf.checkpoints() == ["checkpoint-12", "checkpoint-16"]
    for name in ours.checkpoints():
        hf_files = sorted(p.name for p in (Path(hf.output_dir) / name).iterdir())
        ours_files = sorted(p.name for p in (Path(ours.output_dir) / name).iterdir())
        # training_args.json is ours on purpose: arguments readable without unpickling.
        assert [f for f in ours_files if f != "training_args.json"] == hf_files
    hf_state = json.loads((Path(hf.output_dir) / "checkpoint-16" / "trainer_state.json").read_text())
    our_state = json.loads((Path(ours.output_dir) / "checkpoint-16" / "trainer_state.json").read_text())
    for key in ("best_metric", "global_step", "epoch", "max_steps", "logging_steps", "eval_steps", "save_steps",
                "train_batch_size", "num_train_epochs", "total_flos"):
        assert our_state[key] == pytest.approx(hf_state[key], rel=1e-5), key
    assert our_state["stateful_callbacks"] == hf_state["stateful_callbacks"]
    assert sorted(our_state) == sorted(hf_state)
    assert Path(our_state["best_model_checkpoint"]).name == Path(hf_state["best_model_checkpoint"]).name


@pytest.mark.skipif(not GOLDEN.is_dir(), reason="shared/reference/golden not beside the project")
def test_golden_artifacts(tmp_path):
    """The recorded HF run (another machine): same steps, keys, events and checkpoints; numbers close."""
    train, evald = lm_data()
    ours = run("ours", _gpt2, tmp_path, train_dataset=train, eval_dataset=evald, args=GOLDEN_ARGS)
    golden_log = json.loads((GOLDEN / "log_history.json").read_text())
    assert [e["step"] for e in ours.log_history] == [e["step"] for e in golden_log]
    for a, b in zip(golden_log, ours.log_history):
        assert list(a) == list(b)
        for key in ("loss", "grad_norm", "learning_rate", "epoch", "eval_loss", "train_loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4), (a["step"], key)
    assert ours.events == json.loads((GOLDEN / "callback_events.json").read_text())
    golden_ckpt = json.loads((GOLDEN / "checkpoints.json").read_text())
    assert ours.checkpoints() == golden_ckpt["checkpoints_left_in_output_dir"]
