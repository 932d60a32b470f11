"""Logging parity: what lands in ``log_history`` (non-finite losses, token counts, cadence, precision, clipping)
through ``transformers.Trainer`` and ``hf_lightning.Trainer`` on the same run (CPU, dropout 0, one thread)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tests.helpers.models import (
    DictDataset,
    lm_data,
    pad_collator,
    padded_lm_data,
    regression_data,
    RegressionModel,
    tiny_gpt2,
)
from tests.helpers.parity import assert_log_history_equal, assert_parity, assert_weights_close, run_pair

BASE = dict(per_device_train_batch_size=4, logging_steps=1, learning_rate=3e-3, save_strategy="no")


def gpt2_96():
    return tiny_gpt2(vocab=96, n_positions=32)


# ---------------------------------------------------------------------------------------------- non-finite losses
class PoisonedRegression(nn.Module):
    """A linear regressor whose loss *value* becomes non-finite on batches holding a ``poison`` row.

    The non-finite part is a constant added to the loss, so gradients stay finite and training goes on; only the
    logged (and evaluated) loss sees the NaN/inf.
    """

    def __init__(self, bad_value: float, seed: int = 42):
        super().__init__()
        torch.manual_seed(seed)
        self.lin = nn.Linear(4, 1)
        self.bad_value = bad_value

    def forward(self, x, labels=None, poison=None):
        preds = self.lin(x).squeeze(-1)
        if labels is None:
            return (preds,)
        loss = nn.functional.mse_loss(preds, labels)
        if poison is not None and bool(poison.any()):
            loss = loss + torch.tensor(self.bad_value)
        return (loss, preds)


def poisoned_data(n: int, poisoned: set[int], seed: int = 5) -> DictDataset:
    rows = regression_data(n=n, seed=seed).rows
    return DictDataset([dict(row, poison=torch.tensor(int(i in poisoned))) for i, row in enumerate(rows)])


@pytest.mark.parametrize("nan_inf_filter", [True, False])
@pytest.mark.parametrize("bad_value", [math.inf, math.nan], ids=["inf", "nan"])
def test_logging_nan_inf_filter(tmp_path, nan_inf_filter, bad_value):
    """Sequential batches of 4 with GA=2: row 13 poisons micro-batch 3, i.e. the second half of step 2, in a log
    window of 3 steps. With the filter HF adds the running average instead; eval drops the non-finite batch."""
    hf, ours = run_pair(
        lambda: PoisonedRegression(bad_value), tmp_path, train_dataset=poisoned_data(32, {13}),
        eval_dataset=poisoned_data(10, {1}, seed=9),
        args=dict(BASE, gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=3, learning_rate=1e-2,
                  train_sampling_strategy="sequential", logging_nan_inf_filter=nan_inf_filter,
                  eval_strategy="epoch", per_device_eval_batch_size=4),
    )
    # assert_parity's final math.isclose on training_loss is False for NaN == NaN, so compare piece by piece.
    assert ours.train_output.global_step == hf.train_output.global_step
    assert_log_history_equal(hf.log_history, ours.log_history)
    assert_weights_close(hf.state_dict, ours.state_dict)
    assert ours.events == hf.events
    hf_loss, our_loss = hf.train_output.training_loss, ours.train_output.training_loss
    assert (math.isnan(hf_loss) and math.isnan(our_loss)) or math.isclose(hf_loss, our_loss, rel_tol=1e-5)
    losses = [e["loss"] for e in hf.log_history if "loss" in e]
    assert math.isfinite(losses[0]) == nan_inf_filter
    evals = [e["eval_loss"] for e in hf.log_history if "eval_loss" in e]
    assert all(math.isfinite(v) == nan_inf_filter for v in evals)


# ---------------------------------------------------------------------------------------------- token counts
def _pad_collator_without_mask(features: list[dict]) -> dict:
    batch = pad_collator(features)
    del batch["attention_mask"]
    return batch


def _pad_token_holder():
    """A real tokenizer whose ``pad_token_id`` (0, pad_collator's pad) counts non-padding tokens without a mask."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1}, unk_token="[UNK]"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]")


@pytest.mark.parametrize("mode,collator,with_tokenizer", [
    ("all", pad_collator, False),
    (True, pad_collator, False),
    ("non_padding", pad_collator, False),
    ("non_padding", _pad_collator_without_mask, True),
    ("non_padding", _pad_collator_without_mask, False),
], ids=["all", "True", "non_padding-mask", "non_padding-pad_id", "non_padding-fallback"])
def test_include_num_input_tokens_seen(tmp_path, mode, collator, with_tokenizer):
    kwargs = dict(data_collator=collator)
    if with_tokenizer:
        kwargs["processing_class"] = _pad_token_holder()
    hf, ours = run_pair(
        gpt2_96, tmp_path, train_dataset=padded_lm_data(n=21),
        args=dict(BASE, gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=2,
                  include_num_input_tokens_seen=mode),
        trainer_kwargs=kwargs,
    )
    assert_parity(hf, ours)
    seen = [e["num_input_tokens_seen"] for e in ours.log_history]
    assert seen == sorted(seen) and seen[-1] > 0
    assert ours.trainer.state.num_input_tokens_seen == hf.trainer.state.num_input_tokens_seen


def test_logging_strategy_epoch(tmp_path):
    """One training log per epoch (averaged over the epoch's steps), then the epoch's evaluation."""
    train, evald = lm_data(n_train=28, n_eval=8)
    hf, ours = run_pair(
        lambda: tiny_gpt2(), tmp_path, train_dataset=train, eval_dataset=evald,
        args=dict(BASE, gradient_accumulation_steps=2, num_train_epochs=3, logging_strategy="epoch",
                  eval_strategy="epoch", per_device_eval_batch_size=4, include_num_input_tokens_seen="all"),
    )
    assert_parity(hf, ours)
    assert [e["step"] for e in ours.log_history if "loss" in e] == [4, 8, 12]


# ---------------------------------------------------------------------------------------------- precision
def test_bf16_on_cpu(tmp_path):
    """HF's ``bf16=True`` + ``use_cpu=True`` (accelerate's CPU autocast) against Lightning's "bf16-mixed"."""
    train, evald = lm_data(n_train=24, n_eval=8)
    hf, ours = run_pair(
        lambda: tiny_gpt2(), tmp_path, train_dataset=train, eval_dataset=evald,
        args=dict(BASE, gradient_accumulation_steps=2, num_train_epochs=2, bf16=True, eval_strategy="epoch",
                  per_device_eval_batch_size=4),
    )
    assert ours.trainer.lightning_module.trainer.precision == "bf16-mixed"
    assert_parity(hf, ours)


# ---------------------------------------------------------------------------------------------- clipping / accumulation
@pytest.mark.parametrize("max_grad_norm", [0.0, 0.01, 1.0])
def test_max_grad_norm(tmp_path, max_grad_norm):
    """0 disables clipping (the norm is still logged); 0.01 clips every step."""
    hf, ours = run_pair(
        gpt2_96, tmp_path, train_dataset=padded_lm_data(n=24),
        args=dict(BASE, gradient_accumulation_steps=2, num_train_epochs=1, max_grad_norm=max_grad_norm),
        trainer_kwargs=dict(data_collator=pad_collator),
    )
    assert_parity(hf, ours)
    norms = [e["grad_norm"] for e in hf.log_history if "grad_norm" in e]
    assert len(norms) == 3 and all(n > 0.01 for n in norms)


@pytest.mark.parametrize("model_name", ["gpt2", "regression"])
def test_gradient_accumulation_larger_than_epoch(tmp_path, model_name):
    """10 rows, B=4: 3 micro-batches per epoch and GA=5, so every epoch is one short window (one step)."""
    if model_name == "gpt2":
        make, train, kwargs = gpt2_96, padded_lm_data(n=10), dict(data_collator=pad_collator)
    else:
        make, train, kwargs = RegressionModel, regression_data(n=10), {}
    hf, ours = run_pair(
        make, tmp_path, train_dataset=train,
        args=dict(BASE, gradient_accumulation_steps=5, num_train_epochs=3),
        trainer_kwargs=kwargs,
    )
    assert_parity(hf, ours)
    assert [e["epoch"] for e in ours.log_history if "loss" in e] == [1.0, 2.0, 3.0]


def _gpt2_with_dropout():
    from transformers import GPT2Config, GPT2LMHeadModel, set_seed

    set_seed(42)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16))


def test_bf16_autocast_covers_forward_only_as_hf(tmp_path):
    """bf16 with dropout on: HF (accelerate) autocasts the model's forward only and returns fp32 outputs; the loss
    scaling and the backward run outside autocast. Same scope here, so logs and weights are bit-identical."""
    train, evald = lm_data(n_train=24, n_eval=8)
    hf, ours = run_pair(
        _gpt2_with_dropout, tmp_path, train_dataset=train, eval_dataset=evald,
        args=dict(BASE, gradient_accumulation_steps=2, num_train_epochs=2, bf16=True, eval_strategy="epoch",
                  per_device_eval_batch_size=4),
    )
    assert_parity(hf, ours, rtol=0.0)
    for key in hf.state_dict:
        assert torch.equal(ours.state_dict[key], hf.state_dict[key]), key
    # The autocast wrapper lives only as long as the run: the model's own forward is back afterwards.
    assert "forward" not in ours.trainer.model.__dict__
