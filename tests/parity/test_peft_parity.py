"""PEFT (LoRA) models and models whose ``save_pretrained`` shards: checkpoints, resume, best model and
``save_model`` against the real ``transformers.Trainer`` (dropout on in the base model and in LoRA)."""

import os
import shutil

import pytest
import torch

from tests.helpers.models import lm_data
from tests.helpers.parity import assert_log_history_equal

pytest.importorskip("peft")

ARGS = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=2,
            save_steps=4, learning_rate=3e-3, report_to="none", use_cpu=True, disable_tqdm=True, seed=42)
BEST = dict(eval_strategy="steps", eval_steps=4, load_best_model_at_end=True, metric_for_best_model="eval_loss")
# train_loss covers only the steps of one train() call (HF 5.x): a resumed run's last entry differs by design.
RUN_SCOPED = ("train_loss",)
NON_DETERMINISTIC = ("_runtime", "_per_second", "model_preparation_time")


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel, set_seed

    set_seed(42)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16))


def _lora():
    from peft import LoraConfig, get_peft_model

    return get_peft_model(_gpt2(), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["c_attn"],
                                              fan_in_fan_out=True, task_type="CAUSAL_LM"))


def _train(lib_name, make_model, output_dir, resume=None, **extra):
    import transformers

    import hf_lightning

    lib = transformers if lib_name == "hf" else hf_lightning
    torch.set_num_threads(1)
    train, evald = lm_data(n_train=32, n_eval=8)
    args = lib.TrainingArguments(output_dir=str(output_dir), **{**ARGS, **extra})
    trainer = lib.Trainer(model=make_model(), args=args, train_dataset=train, eval_dataset=evald)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _assert_identical(hf, ours):
    assert hf.keys() == ours.keys()
    for key in hf:
        assert torch.equal(hf[key], ours[key]), key


def _files(folder):
    # training_args.json is ours only (written beside training_args.bin, see docs/migration.md).
    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, _, names in os.walk(folder) for name in names if name != "training_args.json")


@pytest.fixture(scope="module")
def hf_lora(tmp_path_factory):
    """An uninterrupted HF LoRA run: checkpoint-4 (mid-epoch) and checkpoint-8 (the end)."""
    out = tmp_path_factory.mktemp("hf_lora")
    trainer = _train("hf", _lora, out)
    return out, trainer.state.log_history, _weights(trainer)


@pytest.fixture(scope="module")
def ours_lora(tmp_path_factory):
    out = tmp_path_factory.mktemp("ours_lora")
    trainer = _train("ours", _lora, out)
    return out, trainer.state.log_history, _weights(trainer)


@pytest.mark.parametrize("writer", ["hf", "ours"])
def test_lora_resumes_mid_run_bit_identical(tmp_path, hf_lora, ours_lora, writer):
    hf_out, hf_log, hf_weights = hf_lora
    if writer == "ours":
        # The uninterrupted runs match, adapter-only checkpoint files included.
        ours_out, ours_log, ours_weights = ours_lora
        assert_log_history_equal(hf_log, ours_log)
        _assert_identical(hf_weights, ours_weights)
        for step in (4, 8):
            assert _files(ours_out / f"checkpoint-{step}") == _files(hf_out / f"checkpoint-{step}")
            assert "adapter_model.safetensors" in _files(ours_out / f"checkpoint-{step}")
    source = (hf_out if writer == "hf" else ours_lora[0]) / "checkpoint-4"
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copytree(source, out / "checkpoint-4")
    resumed = _train("ours", _lora, out, resume=True)
    assert resumed.state.global_step == 8
    assert_log_history_equal(hf_log, resumed.state.log_history, ordered=False, skip_keys=RUN_SCOPED)
    _assert_identical(hf_weights, _weights(resumed))
    # The adapter stays trainable after the resume (HF loads it with is_trainable=True).
    assert all(p.requires_grad for n, p in resumed.model.named_parameters() if "lora_" in n)


def test_lora_load_best_model_at_end_matches_hf(tmp_path):
    # The highest eval loss is the first one, so the best checkpoint is not the last and loading it changes weights.
    best = dict(BEST, greater_is_better=True)
    hf = _train("hf", _lora, tmp_path / "hf", **best)
    ours = _train("ours", _lora, tmp_path / "ours", **best)
    assert ours.state.best_model_checkpoint.endswith(os.path.basename(hf.state.best_model_checkpoint))
    assert_log_history_equal(hf.state.log_history, ours.state.log_history)
    _assert_identical(_weights(hf), _weights(ours))
    assert hf.state.best_model_checkpoint.endswith("checkpoint-4")
    # save_model() then writes the best adapter as HF writes it, and peft reads it back.
    from peft import PeftModel

    hf.save_model(str(tmp_path / "hf_saved"))
    ours.save_model(str(tmp_path / "ours_saved"))
    assert _files(tmp_path / "ours_saved") == _files(tmp_path / "hf_saved")
    loaded = PeftModel.from_pretrained(_gpt2(), str(tmp_path / "ours_saved"))
    _assert_identical(_weights(hf), {k: v.detach() for k, v in loaded.state_dict().items()})


def _other_names_gpt2():
    """A model whose ``save_pretrained`` writes its weights under a name no trainer loads back."""
    import safetensors.torch
    from transformers import GPT2LMHeadModel

    class OwnFormatGPT2(GPT2LMHeadModel):
        def save_pretrained(self, save_directory, **kwargs):
            os.makedirs(save_directory, exist_ok=True)
            state = {k: v.detach().clone().contiguous() for k, v in self.state_dict().items()}
            safetensors.torch.save_file(state, os.path.join(save_directory, "weights.safetensors"))

    model = _gpt2()
    own = OwnFormatGPT2(model.config)
    own.load_state_dict(model.state_dict())
    return own


def _add_adapter_gpt2():
    """Adapters added by transformers' own ``add_adapter``: not a PeftModel (HF's Trainer cannot load its best
    checkpoint back either)."""
    from peft import LoraConfig

    model = _gpt2()
    model.add_adapter(LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True))
    return model


@pytest.mark.parametrize("make_model", [_other_names_gpt2, _add_adapter_gpt2], ids=["other_names", "add_adapter"])
def test_unloadable_best_model_is_refused_before_the_first_step(tmp_path, make_model):
    import hf_lightning

    class Steps(hf_lightning.TrainerCallback):
        begun = 0

        def on_step_begin(self, args, state, control, **kwargs):
            Steps.begun += 1

    train, evald = lm_data(n_train=32, n_eval=8)
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), **{**ARGS, **BEST})
    trainer = hf_lightning.Trainer(model=make_model(), args=args, train_dataset=train, eval_dataset=evald,
                                   callbacks=[Steps()])
    with pytest.raises(ValueError, match="load_best_model_at_end=True cannot load the best checkpoint"):
        trainer.train()
    assert Steps.begun == 0
    assert not [name for name in os.listdir(tmp_path) if name.startswith("checkpoint-")]


def _sharded_gpt2():
    """A model whose custom ``save_pretrained`` writes sharded weights (``model.safetensors.index.json``, no
    ``model.safetensors``)."""
    from transformers import GPT2LMHeadModel

    class ShardedGPT2(GPT2LMHeadModel):
        def save_pretrained(self, save_directory, **kwargs):
            kwargs["max_shard_size"] = "20KB"
            return super().save_pretrained(save_directory, **kwargs)

    model = _gpt2()
    sharded = ShardedGPT2(model.config)
    sharded.load_state_dict(model.state_dict())
    return sharded


def test_sharded_save_pretrained_resumes_and_loads_best(tmp_path):
    """The probe of a custom ``save_pretrained`` (run before training for load_best_model_at_end) accepts sharded
    weights, and both the best model and a resume read them."""
    best = BEST  # the eval loss rises from step 4 to step 8 here, so the best checkpoint is not the last
    hf = _train("hf", _sharded_gpt2, tmp_path / "hf", **best)
    ours = _train("ours", _sharded_gpt2, tmp_path / "ours", **best)
    assert "model.safetensors.index.json" in os.listdir(tmp_path / "ours" / "checkpoint-4")
    assert hf.state.best_model_checkpoint.endswith("checkpoint-4")
    assert_log_history_equal(hf.state.log_history, ours.state.log_history)
    _assert_identical(_weights(hf), _weights(ours))
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copytree(tmp_path / "ours" / "checkpoint-4", out / "checkpoint-4")
    resumed = _train("ours", _sharded_gpt2, out, resume=True, **best)
    assert_log_history_equal(hf.state.log_history, resumed.state.log_history, ordered=False, skip_keys=RUN_SCOPED)
    _assert_identical(_weights(hf), _weights(resumed))
