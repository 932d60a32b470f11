"""Which ModelState a model gets (duck typing, no peft import), and the PEFT kind's loading rules vs HF's."""

import copy

import pytest
import torch

from hf_lightning.checkpointing.model_state import PeftModelState, PlainModelState, is_peft_model, model_state_for

peft = pytest.importorskip("peft")


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=8))


def _lora(**kw):
    return peft.LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True, **kw)


class _Wrapper(torch.nn.Module):  # as DDP: the model under .module
    def __init__(self, module):
        super().__init__()
        self.module = module


def test_peft_models_get_the_peft_kind_and_others_the_plain_kind():
    lora = peft.get_peft_model(_gpt2(), _lora())
    assert isinstance(model_state_for(lora), PeftModelState)
    assert isinstance(model_state_for(_Wrapper(lora)), PeftModelState)
    assert isinstance(model_state_for(_gpt2()), PlainModelState)
    assert not isinstance(model_state_for(_gpt2()), PeftModelState)
    assert isinstance(model_state_for(torch.nn.Linear(2, 2)), PlainModelState)
    # transformers' own adapters (add_adapter) are not a PeftModel, for HF's Trainer either.
    with_adapter = _gpt2()
    with_adapter.add_adapter(_lora())
    assert not is_peft_model(with_adapter)


def _perturbed(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(1.0)
    return model


def test_several_adapters_load_as_hf_loads_them(tmp_path):
    """Sub-folder per adapter: every adapter is loaded, only the active one trainable, as HF's
    ``_load_from_checkpoint``."""
    from transformers import Trainer, TrainingArguments

    model = peft.get_peft_model(_gpt2(), _lora())
    model.add_adapter("other", _lora())
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    model.set_adapter("other")
    model.save_pretrained(str(tmp_path / "ckpt"))
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    ours, hf = _perturbed(copy.deepcopy(model)), _perturbed(copy.deepcopy(model))
    PeftModelState().load(ours, str(tmp_path / "ckpt"))
    trainer = Trainer(model=hf, args=TrainingArguments(output_dir=str(tmp_path / "hf"), report_to="none",
                                                       use_cpu=True))
    trainer._load_from_checkpoint(str(tmp_path / "ckpt"))
    for key, value in saved.items():
        assert torch.equal(ours.state_dict()[key], hf.state_dict()[key]), key
        assert torch.equal(ours.state_dict()[key], value), key
    assert ours.active_adapters == hf.active_adapters == ["other"]
    assert {n: p.requires_grad for n, p in ours.named_parameters()} == \
        {n: p.requires_grad for n, p in hf.named_parameters()}


def test_check_loadable_probes_a_custom_save_pretrained(tmp_path):
    import safetensors.torch
    from transformers import GPT2LMHeadModel

    class Sharded(GPT2LMHeadModel):
        def save_pretrained(self, save_directory, **kwargs):
            return super().save_pretrained(save_directory, max_shard_size="20KB")

    class OwnNames(GPT2LMHeadModel):
        def save_pretrained(self, save_directory, **kwargs):
            safetensors.torch.save_file({"w": torch.zeros(1)}, f"{save_directory}/weights.safetensors")

    config = _gpt2().config
    PlainModelState().check_loadable(Sharded(config))  # model.safetensors.index.json: loadable
    PlainModelState().check_loadable(_gpt2())  # transformers' own save_pretrained: not probed
    PeftModelState().check_loadable(peft.get_peft_model(_gpt2(), _lora()))
    with pytest.raises(ValueError, match=r"writes \['weights.safetensors'\].*load_best_model_at_end=False"):
        PlainModelState().check_loadable(OwnNames(config))
