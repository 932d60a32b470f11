"""The checks before training change nothing training computes: numbers stay HF's, the model is never copied."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import hf_lightning
from tests.helpers.models import RegressionModel, regression_data
from tests.helpers.parity import assert_log_history_equal, assert_weights_close


class NoisyCollator:
    """Draws from every global generator while collating (augmentation-style), so a check that consumed the global
    RNG, or called the collator on the real loader, would shift every later training number away from HF's."""

    def __call__(self, features):
        noise = torch.randn(len(features), 4) * 0.01 + (random.random() + float(np.random.rand())) * 1e-3
        return {"x": torch.stack([f["x"] for f in features]) + noise,
                "labels": torch.stack([f["labels"] for f in features])}


class DropoutRegression(RegressionModel):
    """Dropout in training: the loss depends on the global RNG at every step."""

    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.3)

    def forward(self, x, labels=None):
        return super().forward(self.drop(x), labels)


def _mae(pred) -> dict:
    return {"mae": float(np.abs(pred.predictions - pred.label_ids).mean())}


def _run(kind, tmp_path, model_cls, collator=None, eval_dataset=None, **extra):
    values = dict(output_dir=str(tmp_path / kind), report_to="none", use_cpu=True, disable_tqdm=True, max_steps=4,
                  per_device_train_batch_size=4, logging_steps=1, save_strategy="no", seed=3, **extra)
    library = __import__("transformers") if kind == "hf" else hf_lightning
    model = model_cls()
    trainer = library.Trainer(model=model, args=library.TrainingArguments(**values), train_dataset=regression_data(n=16),
                              eval_dataset=eval_dataset, data_collator=collator, compute_metrics=_mae)
    trainer.train()
    return trainer.state.log_history, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("case", ["batch_check", "metric_check"])
def test_checks_keep_training_bit_identical_to_hf(tmp_path, case):
    """``batch_check``: the first training batch is collated with an RNG-drawing collator before training.
    ``metric_check``: one evaluation batch runs through the model and ``compute_metrics`` before training (for
    ``metric_for_best_model="mae"``), with dropout drawing from the RNG at every training step."""
    if case == "batch_check":
        kwargs = dict(model_cls=RegressionModel, collator=NoisyCollator())
    else:
        kwargs = dict(model_cls=DropoutRegression, eval_dataset=regression_data(n=8, seed=2), eval_strategy="steps",
                      eval_steps=2, metric_for_best_model="mae", greater_is_better=False)
    hf_logs, hf_weights = _run("hf", tmp_path, **kwargs)
    our_logs, our_weights = _run("ours", tmp_path, **kwargs)
    assert_log_history_equal(hf_logs, our_logs, rtol=0)
    assert_weights_close(hf_weights, our_weights, rtol=0, atol=0)


class ModelHoldingCollator:
    """Holds the model, like ``DataCollatorForSeq2Seq(model=...)``, and forgets to make tensors."""

    def __init__(self, model):
        self.model = model

    def __call__(self, features):
        return {"x": [f["x"].tolist() for f in features], "labels": [float(f["labels"]) for f in features]}


class CountingModel(RegressionModel):
    copies = 0

    def __deepcopy__(self, memo):
        CountingModel.copies += 1
        raise AssertionError("the model was deep-copied")


def test_collator_holding_the_model_is_checked_without_copying_the_model(tmp_path):
    model = CountingModel()
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, max_steps=1,
                                          per_device_train_batch_size=4, disable_tqdm=True)
    trainer = hf_lightning.Trainer(model=model, args=args, train_dataset=regression_data(n=8),
                                   data_collator=ModelHoldingCollator(model))
    with pytest.raises(ValueError, match="column 'x' as a list of list"):
        trainer.train()
    assert CountingModel.copies == 0
