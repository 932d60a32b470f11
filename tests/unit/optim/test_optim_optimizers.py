"""Optimizer registry and create_optimizer against transformers.Trainer (5.23)."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hf_lightning.optim import (
    OPTIMIZER_REGISTRY,
    UNSUPPORTED_OPTIMIZERS,
    Adafactor,
    create_optimizer,
    get_optimizer_cls_and_kwargs,
    parse_optim_args,
)

transformers = pytest.importorskip("transformers")
from transformers.training_args import OptimizerNames  # noqa: E402


def _model():
    cfg = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=8, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(cfg)


def _args(tmp_path, **kw):
    return transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)


CASES = [
    ("adamw_torch", {}),
    ("adamw_torch_fused", {}),
    ("adamw_torch", {"learning_rate": 3e-4, "adam_beta1": 0.8, "adam_beta2": 0.95, "adam_epsilon": 1e-6}),
    ("adafactor", {"learning_rate": 1e-3}),
    ("sgd", {}),
    ("sgd", {"optim_args": "momentum=0.9, dampening=0.1,weight_decay=0.01,nesterov=False"}),
    ("sgd", {"optim_args": "momentum=0.9,nesterov=yes"}),
    ("adagrad", {"optim_args": "lr_decay=0.01,eps=1e-8,weight_decay=0.1"}),
    ("rmsprop", {}),
    ("rmsprop", {"optim_args": "momentum=0.5,alpha=0.9,eps=1e-7,weight_decay=0.1,centered=True"}),
]


@pytest.mark.parametrize(("optim", "extra"), CASES)
def test_cls_and_kwargs_equal_hf(optim, extra, tmp_path):
    args = _args(tmp_path, optim=optim, **extra)
    hf_cls, hf_kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(args, _model())
    cls, kwargs = get_optimizer_cls_and_kwargs(args)
    assert kwargs == hf_kwargs
    assert list(kwargs) == list(hf_kwargs)
    if optim == "adafactor":
        assert hf_cls is transformers.optimization.Adafactor and cls is Adafactor
    else:
        assert cls is hf_cls


@pytest.mark.parametrize(("optim", "extra"), CASES)
def test_create_optimizer_equals_hf_trainer(optim, extra, tmp_path):
    model = _model()
    args = _args(tmp_path, optim=optim, weight_decay=0.05, **extra)
    ours = create_optimizer(model, args)
    theirs = transformers.Trainer(model=model, args=args).create_optimizer()
    assert type(ours).__name__ == type(theirs).__name__
    assert ours.defaults == theirs.defaults
    assert ours.state_dict()["param_groups"] == theirs.state_dict()["param_groups"]
    for mine, hf in zip(ours.param_groups, theirs.param_groups):
        assert [id(p) for p in mine["params"]] == [id(p) for p in hf["params"]]


def test_default_optim_is_fused_adamw(tmp_path):
    args = _args(tmp_path)
    opt = create_optimizer(_model(), args)
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["fused"] is True
    assert [g["weight_decay"] for g in opt.param_groups] == [0.0, 0.0]


def test_fused_adamw_steps_bit_identical_to_hf(tmp_path):
    torch.manual_seed(0)
    ours_model, hf_model = _model().eval(), _model().eval()  # eval: no dropout, same gradients
    hf_model.load_state_dict(ours_model.state_dict())
    args = _args(tmp_path, learning_rate=1e-2, weight_decay=0.1)
    ours = create_optimizer(ours_model, args)
    theirs = transformers.Trainer(model=hf_model, args=args).create_optimizer()
    batch = torch.randint(0, 50, (2, 8))
    for _ in range(3):
        for model, opt in ((ours_model, ours), (hf_model, theirs)):
            model(input_ids=batch, labels=batch).loss.backward()
            opt.step()
            opt.zero_grad()
    for (name, a), b in zip(ours_model.state_dict().items(), hf_model.state_dict().values()):
        assert torch.equal(a, b), name


def test_registry_covers_every_hf_optimizer_name():
    hf_names = {name.value for name in OptimizerNames}
    assert set(OPTIMIZER_REGISTRY) | set(UNSUPPORTED_OPTIMIZERS) == hf_names
    assert not set(OPTIMIZER_REGISTRY) & set(UNSUPPORTED_OPTIMIZERS)


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_OPTIMIZERS))
def test_unsupported_optimizer_names_fail_clearly(name, tmp_path):
    args = SimpleNamespace(optim=OptimizerNames(name), optim_args=None, learning_rate=1e-3, weight_decay=0.0)
    package = UNSUPPORTED_OPTIMIZERS[name].split()[0]
    with pytest.raises(ValueError, match=rf"optim='{name}' needs the {package}.*adamw_torch_fused") as info:
        create_optimizer(nn.Linear(2, 2), args)
    assert "optimizer_cls_and_kwargs" in str(info.value)


def test_unknown_optimizer_name_lists_supported():
    args = SimpleNamespace(optim="adam", optim_args=None, learning_rate=1e-3)
    with pytest.raises(ValueError,
                       match=r"optim='adam' is not a known optimizer.*adafactor, adagrad, adalomo, adamw_8bit"):
        get_optimizer_cls_and_kwargs(args)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, {}),
        ("", {}),
        ("momentum=0.9", {"momentum": "0.9"}),
        (" a = 1 , b=x ", {"a": "1", "b": "x"}),
    ],
)
def test_parse_optim_args(text, expected):
    assert parse_optim_args(text) == expected


@pytest.mark.parametrize("text", ["momentum", "a=1,b", "a=1=2"])
def test_parse_optim_args_rejects_malformed(text):
    with pytest.raises(ValueError, match=r"optim_args=.*is not of the form key=value"):
        parse_optim_args(text)


def test_optim_args_value_must_be_numeric(tmp_path):
    args = _args(tmp_path, optim="sgd", optim_args="momentum=lots")
    with pytest.raises(ValueError, match=r"optim_args: momentum='lots' is not a number"):
        get_optimizer_cls_and_kwargs(args)


def test_optimizer_cls_and_kwargs_replaces_registry(tmp_path):
    model = _model()
    args = _args(tmp_path, optim="adafactor", weight_decay=0.01)
    spec = (torch.optim.SGD, {"lr": 0.3, "momentum": 0.5})
    ours = create_optimizer(model, args, optimizer_cls_and_kwargs=spec)
    theirs = transformers.Trainer(model=model, args=args, optimizer_cls_and_kwargs=spec).create_optimizer()
    assert type(ours) is type(theirs) is torch.optim.SGD
    assert ours.state_dict()["param_groups"] == theirs.state_dict()["param_groups"]
    assert spec[1] == {"lr": 0.3, "momentum": 0.5}  # the caller's dict is left alone


def test_optimizer_cls_and_kwargs_params_override(tmp_path):
    model = _model()
    args = _args(tmp_path)
    groups = [{"params": list(model.parameters()), "weight_decay": 0.2}]
    ours = create_optimizer(model, args, optimizer_cls_and_kwargs=(torch.optim.SGD, {"lr": 0.1, "params": groups}))
    hf_spec = (torch.optim.SGD, {"lr": 0.1, "params": groups})
    theirs = transformers.Trainer(model=model, args=args, optimizer_cls_and_kwargs=hf_spec).create_optimizer()
    assert ours.state_dict()["param_groups"] == theirs.state_dict()["param_groups"]


class _Factory:
    """HF 5.x factory protocol: not an Optimizer subclass, instantiated, then called with the model."""

    def __call__(self, model, lr):
        return torch.optim.SGD(model.parameters(), lr=lr)


def test_optimizer_factory_like_hf(tmp_path):
    model = _model()
    args = _args(tmp_path)
    ours = create_optimizer(model, args, optimizer_cls_and_kwargs=(_Factory, {"lr": 0.2}))
    theirs = transformers.Trainer(
        model=model, args=args, optimizer_cls_and_kwargs=(_Factory, {"lr": 0.2})
    ).create_optimizer()
    assert ours.state_dict()["param_groups"] == theirs.state_dict()["param_groups"]


def test_reads_plain_string_optim_from_any_args_object():
    args = SimpleNamespace(
        optim="adamw_torch",
        optim_args=None,
        learning_rate=0.1,
        weight_decay=0.3,
        adam_beta1=0.9,
        adam_beta2=0.99,
        adam_epsilon=1e-7,
    )
    opt = create_optimizer(nn.Linear(2, 2), args)
    assert isinstance(opt, torch.optim.AdamW)
    assert [(len(g["params"]), g["weight_decay"]) for g in opt.param_groups] == [(1, 0.3), (1, 0.0)]
    assert opt.defaults["betas"] == (0.9, 0.99) and opt.defaults["eps"] == 1e-7
