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


def _skip_without_package(optim):
    pytest.importorskip(OPTIMIZER_PACKAGES[optim].module)


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
