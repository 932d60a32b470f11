"""trainer/model_card.py against transformers' own modelcard helpers, on hand-made log histories."""

from __future__ import annotations

import pytest

from hf_lightning.trainer.model_card import make_markdown_table, parse_log_history

hf_modelcard = pytest.importorskip("transformers.modelcard")

TRAIN_END = {"train_runtime": 1.0, "train_loss": 0.5, "epoch": 2.0, "step": 4, "total_flos": 3.0}
HISTORIES = {
    "evaluations during training": [
        {"loss": 0.71234567, "epoch": 0.5, "step": 1},
        {"eval_loss": 0.69, "eval_accuracy": 0.5, "eval_model_preparation_time": 0.001, "eval_runtime": 0.1,
         "eval_samples_per_second": 10.0, "eval_steps_per_second": 2.0, "epoch": 1.0, "step": 2},
        {"eval_loss": 0.6812345, "eval_accuracy": 0.75, "epoch": 2.0, "step": 4},
        TRAIN_END,
        {"eval_loss": 0.68, "eval_accuracy": 0.75, "eval_runtime": 0.1, "epoch": 2.0, "step": 4},
    ],
    "evaluation before any training loss": [
        {"eval_loss": 0.7, "epoch": 0.0, "step": 0}, {"loss": 0.6, "epoch": 1.0, "step": 2}, TRAIN_END,
    ],
    "no training": [{"eval_loss": 0.7, "eval_f1": 0.1, "epoch": 0.0, "step": 0}],
    "nothing": [],
    "training without evaluation": [{"loss": 0.6, "epoch": 1.0, "step": 2}, TRAIN_END],
}


@pytest.mark.parametrize("name", sorted(HISTORIES))
def test_log_history_parsed_as_hf(name):
    history = HISTORIES[name]
    ours = parse_log_history(history)
    hf = hf_modelcard.parse_log_history(history)
    assert ours == hf
    if ours[1]:
        assert make_markdown_table(ours[1]) == hf_modelcard.make_markdown_table(hf[1])
