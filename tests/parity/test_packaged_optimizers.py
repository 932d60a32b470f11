"""Optimizers from other packages (``optim/packaged.py``) against transformers.Trainer 5.23: dropout on, bit-identical.

Each run evaluates and saves during training (schedule-free optimizers swap the weights at HF's evaluation, so the
saved weights are its eval-mode ones) and evaluates once more after training.
"""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.models import lm_data
from tests.helpers.parity import assert_log_history_equal, run_pair


def _gpt2_with_dropout():
    from transformers import GPT2Config, GPT2LMHeadModel, set_seed

    set_seed(7)
    config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16, resid_pdrop=0.1,
                        embd_pdrop=0.1, attn_pdrop=0.1, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _run_both(tmp_path, optim: str, **extra):
    train, evald = lm_data(n_train=24, n_eval=6, vocab=64)
    args = dict(per_device_train_batch_size=4, per_device_eval_batch_size=6, gradient_accumulation_steps=2,
                max_steps=4, logging_steps=1, eval_strategy="steps", eval_steps=2, save_steps=2,
                learning_rate=5e-3, weight_decay=0.1, warmup_steps=1, optim=optim)
    args.update(extra)
    hf, ours = run_pair(_gpt2_with_dropout, tmp_path, train_dataset=train, eval_dataset=evald, args=args)
    assert_log_history_equal(hf.log_history, ours.log_history, rtol=0.0)
    _assert_same_weights(hf.state_dict, ours.state_dict)
    assert ours.checkpoints() == hf.checkpoints() == ["checkpoint-2", "checkpoint-4"]
    for name in hf.checkpoints():
        _assert_same_weights(load_file(os.path.join(hf.output_dir, name, "model.safetensors")),
                             load_file(os.path.join(ours.output_dir, name, "model.safetensors")))
    # After training, evaluate() puts the optimizer in eval mode again (HF's evaluation loop does).
    metrics = [r.trainer.evaluate() for r in (hf, ours)]
    assert metrics[0]["eval_loss"] == metrics[1]["eval_loss"]
    _assert_same_weights(hf.trainer.model.state_dict(), ours.trainer.model.state_dict())
    return hf, ours


DEFAULT = [
    pytest.param("schedule_free_adamw", {}, "schedulefree", id="schedule_free_adamw"),
    pytest.param("grokadamw", {"optim_args": "lamb=1.5,gamma=0.2"}, "grokadamw", id="grokadamw"),
    pytest.param("stable_adamw", {"optim_args": "kahan_sum=True"}, "optimi", id="stable_adamw"),
]
SLOW = [
    pytest.param("schedule_free_sgd", {"optim_args": "r=0.5"}, "schedulefree", id="schedule_free_sgd",
                 marks=pytest.mark.slow),
    pytest.param("schedule_free_radam", {}, "schedulefree", id="schedule_free_radam", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("optim", "extra", "module"), DEFAULT + SLOW)
def test_bit_identical_to_hf(tmp_path, optim, extra, module):
    pytest.importorskip(module)
    hf, ours = _run_both(tmp_path, optim, **extra)
    assert type(ours.trainer.optimizer).__name__ == type(hf.trainer.optimizer.optimizer).__name__
