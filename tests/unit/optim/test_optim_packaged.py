"""Optimizers from other packages: built as transformers.Trainer 5.23 builds them; a missing package fails early."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from hf_lightning.optim import create_optimizer, get_optimizer_cls_and_kwargs
from hf_lightning.optim.packaged import OPTIMIZER_PACKAGES, check_optimizer_package, set_optimizer_mode

transformers = pytest.importorskip("transformers")


def _model():
    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=8, bos_token_id=0,
                                  eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def _args(tmp_path, **kw):
    return transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)


CASES = [
    ("schedule_free_adamw", {}),
    ("schedule_free_adamw", {"warmup_steps": 0.25, "optim_args": "weight_lr_power=1.5,r=0.5"}),
    ("schedule_free_sgd", {"warmup_steps": 3, "weight_decay": 0.1}),
    ("schedule_free_radam", {"adam_beta1": 0.8, "warmup_steps": 3}),
    ("grokadamw", {}),
    ("grokadamw", {"optim_args": "alpha_init=0.9,lamb=1.5,gamma=0.2,grokking_signal_decay_rate=0.3,"
                                 "gradient_clipping=0.5"}),
    ("stable_adamw", {"weight_decay": 0.05}),
    # HF's quirk: bool("False") is True.
    ("stable_adamw", {"optim_args": "max_lr=0.01,kahan_sum=False,decouple_lr=False"}),
]


LOW_RANK = {"optim_target_modules": ["attn", "mlp"], "optim_args": "rank=4,update_proj_gap=2,scale=0.5"}
# Built from a tiny Llama (GaLore / APOLLO need nn.Linear modules).
MODEL_CASES = [
    ("galore_adamw", LOW_RANK),
    ("galore_adafactor", {"optim_target_modules": r".*(q_proj|up_proj)", "optim_args": "proj_type=left"}),
    ("galore_adamw_8bit", {"optim_target_modules": "all_linear"}),
    ("galore_adamw_layerwise", LOW_RANK),
    ("apollo_adamw", {"optim_target_modules": ["self_attn.q_proj", "mlp"], "optim_args": "proj=svd,rank=2"}),
    ("apollo_adamw_layerwise", {"optim_target_modules": "all-linear"}),
    ("lomo", {}),
    ("adalomo", {}),
    ("adamw_torch_4bit", {"optim_args": "block_size=128,bf16_stochastic_round=true"}),
    ("adamw_torch_8bit", {}),
    ("adamw_bnb_8bit", {}),
    ("paged_adamw_32bit", {"adam_beta2": 0.95}),
    ("lion_8bit", {}),
    ("paged_lion_32bit", {}),
    ("rmsprop_bnb", {"optim_args": "alpha=0.9"}),
    ("rmsprop_bnb_8bit", {}),
    ("ademamix", {"optim_args": "beta3=0.999,alpha=4,t_alpha=10,t_beta3=20"}),
    ("paged_ademamix_8bit", {}),
]


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=2, vocab_size=32, max_position_embeddings=16)
    return transformers.LlamaForCausalLM(cfg)


def _same(a, b) -> bool:
    """Equal kwargs where tensors must be the very same objects and optimizers of one type over the same groups."""
    if isinstance(a, torch.Tensor):
        return a is b
    if isinstance(a, torch.optim.Optimizer):
        return type(a) is type(b) and _same(a.param_groups, b.param_groups)
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _skip_without_package(optim):
    pytest.importorskip(OPTIMIZER_PACKAGES[optim].module)


@pytest.mark.parametrize(("optim", "extra"), MODEL_CASES)
def test_model_based_cls_and_kwargs_equal_hf(optim, extra, tmp_path):
    _skip_without_package(optim)
    model = _llama()
    args = _args(tmp_path, optim=optim, **extra)
    hf_cls, hf_kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(args, model)
    cls, kwargs = get_optimizer_cls_and_kwargs(args, model)
    if optim.endswith("layerwise"):
        assert type(hf_cls).__name__ == type(cls).__name__ and cls.__name__ == "LayerWiseDummyOptimizer"
        hf_kwargs["optimizer_dict"] = dict(hf_kwargs["optimizer_dict"])
    elif optim in ("lomo", "adalomo"):
        assert issubclass(cls, hf_cls)  # the same class, with a step() that leaves the update to fused_backward
    else:
        assert cls is hf_cls
    assert _same(kwargs, hf_kwargs), (kwargs, hf_kwargs)


def test_layerwise_steps_each_parameter_in_the_backward(tmp_path):
    pytest.importorskip("galore_torch")
    model = _llama()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = create_optimizer(model, _args(tmp_path, optim="galore_adamw_layerwise", **LOW_RANK))
    model(input_ids=torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss.backward()
    assert all(p.grad is None for p in model.parameters())  # each parameter's optimizer stepped and zeroed it
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters())
    assert type(optimizer).__name__ == "LayerWiseDummyOptimizer" and optimizer.step(lambda: 3) == 3


@pytest.mark.parametrize(("extra", "error", "message"), [
    ({}, ValueError, r"You need to define `optim_target_modules` to use galore_adamw optimizers"),
    ({"optim_target_modules": ["nothing_here"]}, ValueError, r"No target modules found for galore_adamw"),
    ({"optim_target_modules": ["attn"], "gradient_accumulation_steps": 2, "optim": "galore_adamw_layerwise"},
     ValueError, r"Layerwise galore_adamw_layerwise does not support gradient accumulation"),
])
def test_low_rank_errors_like_hf(tmp_path, extra, error, message):
    pytest.importorskip("galore_torch")
    args = _args(tmp_path, **{"optim": "galore_adamw", **extra})
    with pytest.raises(error, match=message):
        get_optimizer_cls_and_kwargs(args, _llama())
    with pytest.raises(error):
        transformers.Trainer.get_optimizer_cls_and_kwargs(args, _llama())


def test_low_rank_warns_about_a_named_module_that_is_not_linear(tmp_path, caplog):
    pytest.importorskip("galore_torch")
    args = _args(tmp_path, optim="galore_adamw", optim_target_modules=["mlp", "embed_tokens"])
    with caplog.at_level("WARNING"):
        get_optimizer_cls_and_kwargs(args, _llama())
    assert "model.embed_tokens matched but ignored. galore_adamw only supports linear layers." in caplog.text


def test_lomo_needs_the_model(tmp_path):
    pytest.importorskip("lomo_optim")
    with pytest.raises(ValueError, match="You need to pass a `model`"):
        get_optimizer_cls_and_kwargs(_args(tmp_path, optim="lomo"))


def test_bitsandbytes_8bit_keeps_embeddings_in_32bit(tmp_path):
    bnb = pytest.importorskip("bitsandbytes")
    model = _llama()
    create_optimizer(model, _args(tmp_path, optim="adamw_bnb_8bit"))
    overrides = bnb.optim.GlobalOptimManager.get_instance().module_weight_config_triple
    assert (model.model.embed_tokens, "weight", {"optim_bits": 32}) in overrides


@pytest.mark.parametrize(("optim", "extra"), CASES)
def test_cls_and_kwargs_equal_hf(optim, extra, tmp_path):
    _skip_without_package(optim)
    args = _args(tmp_path, optim=optim, **extra)
    hf_cls, hf_kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(args, _model())
    cls, kwargs = get_optimizer_cls_and_kwargs(args, _model())
    assert cls is hf_cls
    assert kwargs == hf_kwargs and list(kwargs) == list(hf_kwargs)


@pytest.mark.parametrize(("optim", "extra"), CASES)
def test_create_optimizer_equals_hf_trainer(optim, extra, tmp_path):
    _skip_without_package(optim)
    model = _model()
    args = _args(tmp_path, optim=optim, weight_decay=0.05, **{k: v for k, v in extra.items() if k != "weight_decay"})
    ours = create_optimizer(model, args)
    theirs = transformers.Trainer(model=model, args=args).create_optimizer()
    assert type(ours) is type(theirs)
    assert ours.state_dict()["param_groups"] == theirs.state_dict()["param_groups"]


@pytest.mark.parametrize("optim", sorted(OPTIMIZER_PACKAGES))
def test_missing_package_names_the_pip_install(optim, tmp_path, monkeypatch):
    package = OPTIMIZER_PACKAGES[optim]
    monkeypatch.setitem(sys.modules, package.module, None)  # find_spec and import see it as absent
    args = _args(tmp_path, optim=optim)
    message = rf"optim='{optim}' needs the `{package.module}` package, which is not installed: `pip install \"?" \
              rf"{package.requirement}"
    with pytest.raises(ImportError, match=message):
        check_optimizer_package(args)
    with pytest.raises(ImportError, match=message):
        get_optimizer_cls_and_kwargs(args, _model())


def test_too_old_package_is_refused(tmp_path, monkeypatch):
    pytest.importorskip("schedulefree")
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.3.0" if name == "schedulefree" else real(name))
    with pytest.raises(ImportError, match=r"schedulefree.*is version 1.3.0; this optimizer needs 1.4.0.*"
                                          r"pip install \"schedulefree>=1.4.0\""):
        check_optimizer_package(_args(tmp_path, optim="schedule_free_radam"))
    check_optimizer_package(_args(tmp_path, optim="schedule_free_adamw"))  # no minimum for the others


def test_missing_package_fails_before_any_work(tmp_path, monkeypatch):
    import hf_lightning
    from tests.helpers.models import lm_data

    monkeypatch.setitem(sys.modules, "schedulefree", None)
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = tmp_path / "out"
    args = hf_lightning.TrainingArguments(output_dir=str(out), use_cpu=True, report_to="none", max_steps=2,
                                          optim="schedule_free_adamw", disable_tqdm=True)
    train, _ = lm_data(n_train=8, vocab=50, seq_len=8)
    steps = []

    class Spy(hf_lightning.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            steps.append(state.global_step)

    trainer = hf_lightning.Trainer(model=model, args=args, train_dataset=train, callbacks=[Spy()])
    with pytest.raises(ImportError, match=r"pip install \"schedulefree\""):
        trainer.train()
    assert steps == [] and os.listdir(out) == []  # Trainer() made the folder, as HF's does; nothing in it
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_set_optimizer_mode_calls_the_method_only_when_present():
    calls = []

    class WithModes(torch.optim.SGD):
        def train(self):
            calls.append("train")

        def eval(self):
            calls.append("eval")

    opt = WithModes([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    set_optimizer_mode(opt, "eval")
    set_optimizer_mode(opt, "train")
    set_optimizer_mode(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), "eval")
    set_optimizer_mode(None, "train")
    assert calls == ["eval", "train"]
