"""Weight-decay grouping equals transformers.Trainer's (get_decay_parameter_names / create_optimizer groups)."""

import pytest
import torch
from torch import nn

from hf_lightning.optim import build_param_groups, get_decay_parameter_names

transformers = pytest.importorskip("transformers")


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class MyLayerNorm(nn.LayerNorm):
    """A LayerNorm subclass under a name no pattern catches: excluded by type only."""


class Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))  # top-level param, decayed
        self.my_norm = nn.Parameter(torch.ones(3))  # "_norm" at the end: excluded by name
        self.lin = nn.Linear(3, 3)
        self.ln = nn.LayerNorm(3)  # excluded by type, although its name matches nothing
        self.sub = MyLayerNorm(3)
        self.rms = RMSNorm(3)  # "rms.weight": matches no pattern, decayed (as in HF)
        self.input_rmsnorm = RMSNorm(3)  # "rmsnorm"
        self.post_attention_layernorm = RMSNorm(3)  # "layernorm"
        self.final_norm = RMSNorm(3)  # "_norm."
        self.norm = RMSNorm(3)  # "norm."
        self.normalizer = nn.Linear(3, 3)  # "normalizer": not a norm name, decayed
        self.block = nn.Sequential(nn.Linear(3, 3, bias=False), nn.GELU(), RMSNorm(3))
        self.frozen = nn.Linear(3, 3)
        self.frozen.weight.requires_grad_(False)
        self.register_parameter("absent", None)  # listed by name (HF does), never grouped
        self.Upper_Norm = RMSNorm(3)  # names are lower-cased before matching
        self.BiasFree = nn.Parameter(torch.ones(1))


class TiedRoot(nn.LayerNorm):
    """Root module that is itself a LayerNorm: HF checks types of children only."""

    def __init__(self):
        super().__init__(4)
        self.head = nn.Linear(4, 4)
        self.head2 = nn.Linear(4, 4)
        self.head2.weight = self.head.weight  # tied: named_parameters() yields it once


def _gpt2():
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(cfg)


def _bert():
    cfg = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=16,
        num_labels=3,
    )
    return transformers.BertForSequenceClassification(cfg)


def _llama():
    cfg = transformers.LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=16,
    )
    return transformers.LlamaForCausalLM(cfg)


MODELS = {
    "gpt2": _gpt2,
    "bert_classifier": _bert,
    "llama_rmsnorm": _llama,
    "custom": Custom,
    "layernorm_root_tied": TiedRoot,
    "bare_linear": lambda: nn.Linear(2, 2),
    "bare_layernorm": lambda: nn.LayerNorm(2),
}


@pytest.mark.parametrize("make_model", MODELS.values(), ids=MODELS.keys())
def test_decay_names_equal_hf(make_model):
    model = make_model()
    expected = transformers.Trainer.get_decay_parameter_names(None, model)
    assert get_decay_parameter_names(model) == expected


def _hf_groups(model, tmp_path, weight_decay):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", weight_decay=weight_decay
    )
    optimizer = transformers.Trainer(model=model, args=args).create_optimizer()
    return optimizer.param_groups


@pytest.mark.parametrize("make_model", [_gpt2, _bert, Custom], ids=["gpt2", "bert_classifier", "custom"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_param_groups_equal_hf_trainer(make_model, weight_decay, tmp_path):
    model = make_model()
    ours = build_param_groups(model, weight_decay)
    theirs = _hf_groups(model, tmp_path, weight_decay)
    assert len(ours) == 2
    for mine, hf in zip(ours, theirs):
        assert [id(p) for p in mine["params"]] == [id(p) for p in hf["params"]]
        assert mine["weight_decay"] == hf["weight_decay"]


def test_custom_module_groups_by_name():
    model = Custom()
    names = {id(p): n for n, p in model.named_parameters()}
    decayed, others = build_param_groups(model, 0.1)
    assert [names[id(p)] for p in decayed["params"]] == [
        "scale",
        "lin.weight",
        "rms.weight",
        "normalizer.weight",
        "block.0.weight",
        "block.2.weight",  # an RMSNorm whose name says nothing: HF decays it
    ]
    assert "frozen.weight" not in {names[id(p)] for p in decayed["params"] + others["params"]}
    assert "frozen.bias" in {names[id(p)] for p in others["params"]}
    assert (decayed["weight_decay"], others["weight_decay"]) == (0.1, 0.0)
    assert "absent" in get_decay_parameter_names(model)


def test_groups_always_present_even_when_empty():
    model = nn.LayerNorm(3)
    model.weight.requires_grad_(False)
    model.bias.requires_grad_(False)
    assert build_param_groups(model, 0.5) == [
        {"params": [], "weight_decay": 0.5},
        {"params": [], "weight_decay": 0.0},
    ]
