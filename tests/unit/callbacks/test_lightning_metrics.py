"""How one HF log is named for Lightning's callback metrics, loggers and progress bar (no Lightning run)."""

from __future__ import annotations

from hf_lightning.callbacks.lightning_metrics import numeric_logs, progress_bar_view, tensorboard_names

LOGS = {"loss": 2.5, "grad_norm": 0.75, "learning_rate": 4.5e-05, "epoch": 0.25, "eval_loss": 2.0,
        "eval_accuracy": 0.5, "eval_val_loss": 1.0, "test_loss": 3.0, "num_input_tokens_seen": 128,
        "flag": True, "note": "text", "none": None}


def test_only_numbers_are_published_and_booleans_are_not_numbers():
    assert numeric_logs(LOGS) == {k: LOGS[k] for k in ("loss", "grad_norm", "learning_rate", "epoch", "eval_loss",
                                                        "eval_accuracy", "eval_val_loss", "test_loss",
                                                        "num_input_tokens_seen")}


def test_loggers_get_hf_tensorboard_names():
    assert tensorboard_names(numeric_logs(LOGS)) == {
        "train/loss": 2.5, "train/grad_norm": 0.75, "train/learning_rate": 4.5e-05, "train/epoch": 0.25,
        "eval/loss": 2.0, "eval/accuracy": 0.5, "eval/val_loss": 1.0, "test/loss": 3.0,
        "train/num_input_tokens_seen": 128,
    }


def test_progress_bar_shows_loss_learning_rate_as_text_and_eval_loss():
    assert progress_bar_view(numeric_logs(LOGS)) == {"loss": 2.5, "learning_rate": "4.5e-05", "eval_loss": 2.0}
    assert progress_bar_view({"eval_accuracy": 0.5}) == {}
