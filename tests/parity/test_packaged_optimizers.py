"""Optimizers from other packages (``optim/packaged.py``) against transformers.Trainer 5.23: dropout on, bit-identical.

The schedule-free / GrokAdamW / StableAdamW runs evaluate and save during training (schedule-free optimizers swap
the weights at HF's evaluation, so the saved weights are its eval-mode ones) and evaluate once more after training.
The GaLore / APOLLO / LOMO / bitsandbytes / torchao runs train a tiny Llama (``nn.Linear`` layers for
``optim_target_modules``) with attention dropout.
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


def _llama_with_dropout():
    from transformers import LlamaConfig, LlamaForCausalLM, set_seed

    set_seed(7)
    config = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, attention_dropout=0.1,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation="eager")
    return LlamaForCausalLM(config)


LOW_RANK = {"optim_target_modules": ["attn", "mlp"], "optim_args": "rank=4,update_proj_gap=2"}
LLAMA_DEFAULT = [
    pytest.param("galore_adamw", LOW_RANK, "galore_torch", id="galore_adamw"),
    pytest.param("galore_adamw_layerwise", LOW_RANK, "galore_torch", id="galore_adamw_layerwise"),
    pytest.param("lomo", {}, "lomo_optim", id="lomo"),
    pytest.param("adamw_bnb_8bit", {}, "bitsandbytes", id="adamw_bnb_8bit"),
]
LLAMA_SLOW = [
    pytest.param(name, extra, module, id=name, marks=pytest.mark.slow) for name, extra, module in [
        ("galore_adafactor", {**LOW_RANK, "optim_target_modules": r".*(q_proj|up_proj)"}, "galore_torch"),
        ("apollo_adamw", LOW_RANK, "apollo_torch"),
        ("apollo_adamw_layerwise", {**LOW_RANK, "optim_target_modules": "all-linear"}, "apollo_torch"),
        ("paged_lion_8bit", {}, "bitsandbytes"),
        ("rmsprop_bnb_32bit", {}, "bitsandbytes"),
        ("paged_ademamix_8bit", {"optim_args": "alpha=4.0,t_alpha=3"}, "bitsandbytes"),
        ("adamw_torch_8bit", {}, "torchao"),
        ("adamw_torch_4bit", {}, "torchao"),
    ]
]


@pytest.mark.parametrize(("optim", "extra", "module"), LLAMA_DEFAULT + LLAMA_SLOW)
def test_llama_bit_identical_to_hf(tmp_path, optim, extra, module):
    pytest.importorskip(module)
    train, _ = lm_data(n_train=24, n_eval=0, vocab=64)
    args = dict(per_device_train_batch_size=4, max_steps=3, logging_steps=1, learning_rate=5e-3, warmup_steps=1,
                save_strategy="no", optim=optim, **extra)
    hf, ours = run_pair(_llama_with_dropout, tmp_path, train_dataset=train, args=args)
    assert_log_history_equal(hf.log_history, ours.log_history, rtol=0.0)
    _assert_same_weights(hf.state_dict, ours.state_dict)
    if optim.endswith("layerwise") or optim == "lomo":
        # The weights move in the backward; the loop's step and clipping see no gradient (HF logs 0.0).
        assert all(entry["grad_norm"] == 0.0 for entry in ours.log_history if "grad_norm" in entry)


def _with_hf_shaped_lomo_step(base):
    class HFShapedStep(base):
        """HF 5.23's training_step body as subclasses copy it: the rate goes to ``accelerator.backward``."""

        def training_step(self, model, inputs, num_items_in_batch=None):
            model.train()
            if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
                self.optimizer.train()
            inputs = self._prepare_inputs(inputs)
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
            kwargs = {"learning_rate": self._get_learning_rate()} if self.args.optim == "lomo" else {}
            self.accelerator.backward(loss, **kwargs)
            return loss.detach()

    return HFShapedStep


def test_lomo_through_a_subclass_calling_accelerator_backward(tmp_path):
    pytest.importorskip("lomo_optim")
    import transformers

    import hf_lightning

    train, _ = lm_data(n_train=8, n_eval=0, vocab=64)
    args = dict(per_device_train_batch_size=4, max_steps=2, logging_steps=1, learning_rate=5e-3, warmup_steps=1,
                save_strategy="no", optim="lomo")
    hf, ours = run_pair(_llama_with_dropout, tmp_path, train_dataset=train, args=args,
                        hf_trainer_cls=_with_hf_shaped_lomo_step(transformers.Trainer),
                        ours_trainer_cls=_with_hf_shaped_lomo_step(hf_lightning.Trainer))
    assert_log_history_equal(hf.log_history, ours.log_history, rtol=0.0)
    _assert_same_weights(hf.state_dict, ours.state_dict)
