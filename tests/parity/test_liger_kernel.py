"""``use_liger_kernel=True``: Liger's kernels are Triton (GPU) code that cannot run on this machine, so the tests
check what can be checked here: without ``liger-kernel`` installed, the error HF gives, before any step and with
nothing written; with an installed ``liger_kernel`` package (a stand-in module recording its calls, since the real
one needs triton and a GPU) the model is patched with ``liger_kernel_config`` when training starts, as HF does,
and a loss-only evaluation asks the patched forward to skip the logits."""

from __future__ import annotations

import sys
import types

import pytest

from tests.helpers.models import lm_data, tiny_gpt2


def _args(tmp_path, kind: str, **extra):
    import transformers

    import hf_lightning

    module = transformers if kind == "hf" else hf_lightning
    return module.TrainingArguments(output_dir=str(tmp_path / kind), use_cpu=True, report_to="none", max_steps=1,
                                    per_device_train_batch_size=4, use_liger_kernel=True, save_strategy="no", **extra)


def test_without_liger_kernel_both_raise_hf_error_before_training(tmp_path):
    import transformers

    import hf_lightning

    train, _ = lm_data(n_train=8, n_eval=0)
    errors = []
    for kind, cls in (("hf", transformers.Trainer), ("ours", hf_lightning.Trainer)):
        model = tiny_gpt2()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        trainer = cls(model=model, args=_args(tmp_path, kind), train_dataset=train)
        with pytest.raises(ImportError) as error:
            trainer.train()
        errors.append(str(error.value))
        assert all((before[k] == v).all() for k, v in model.state_dict().items())
    assert errors[0] == errors[1]
    assert not any(p.name.startswith("checkpoint-") for p in (tmp_path / "ours").iterdir())


@pytest.fixture
def recorded_liger(monkeypatch):
    calls = []

    def apply_to_instance(model, **kwargs):
        calls.append((type(model).__name__, kwargs))
        forward = model.forward

        def patched(*args, skip_logits=None, **kw):
            calls.append(("forward", skip_logits))
            return forward(*args, **kw)

        model.forward = patched

    package = types.ModuleType("liger_kernel")
    sub = types.ModuleType("liger_kernel.transformers")
    sub._apply_liger_kernel_to_instance = apply_to_instance
    package.transformers = sub
    monkeypatch.setitem(sys.modules, "liger_kernel", package)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", sub)
    return calls


def test_kernels_applied_with_the_config_when_training_starts(tmp_path, recorded_liger):
    import hf_lightning

    train, evald = lm_data(n_train=8, n_eval=4)
    trainer = hf_lightning.Trainer(model=tiny_gpt2(), args=_args(tmp_path, "ours", liger_kernel_config={"rope": False}),
                                   train_dataset=train, eval_dataset=evald)
    assert recorded_liger == []
    trainer.train()
    assert recorded_liger[0] == ("GPT2LMHeadModel", {"rope": False})
    assert ("forward", None) in recorded_liger
    recorded_liger.clear()
    trainer.evaluate()
    assert recorded_liger and all(call == ("forward", True) for call in recorded_liger)
