"""``accelerator_config`` options HF's Trainer honours on one process, against the real ``transformers.Trainer``."""

from __future__ import annotations

import pytest

from tests.helpers.models import lm_data, tiny_gpt2
from tests.helpers.parity import assert_parity, run

BASE = dict(per_device_train_batch_size=4, num_train_epochs=1, logging_steps=1, save_strategy="no")


def test_gradient_accumulation_num_steps_becomes_gradient_accumulation_steps(tmp_path):
    train, _ = lm_data(n_train=24, n_eval=0)
    # A fresh dict each: HF writes num_steps=1 back into the one it is given.
    hf, ours = (run(kind, tiny_gpt2, tmp_path, train_dataset=train, args=dict(BASE, accelerator_config={
        "gradient_accumulation_kwargs": {"num_steps": 3, "sync_each_batch": True}})) for kind in ("hf", "ours"))
    assert hf.trainer.args.gradient_accumulation_steps == ours.trainer.args.gradient_accumulation_steps == 3
    assert hf.train_output.global_step == 2
    assert_parity(hf, ours)


def test_gradient_accumulation_num_steps_and_steps_both_set_is_an_error(tmp_path):
    import transformers

    import hf_lightning

    config = {"gradient_accumulation_kwargs": {"num_steps": 3}}
    kwargs = dict(output_dir=str(tmp_path / "out"), gradient_accumulation_steps=2, accelerator_config=config,
                  report_to="none", use_cpu=True)
    with pytest.raises(ValueError) as hf_error:
        transformers.Trainer(model=tiny_gpt2(), args=transformers.TrainingArguments(**kwargs))
    with pytest.raises(ValueError) as ours_error:
        hf_lightning.TrainingArguments(**kwargs)
    # HF's words (its message lacks a space after the first sentence; ours has it).
    assert str(ours_error.value).replace(". ", "") == str(hf_error.value).replace(". ", "")
    assert not (tmp_path / "out").exists()


def test_use_configured_state_without_a_configured_state_is_hfs_error(tmp_path):
    import transformers
    from accelerate.state import AcceleratorState

    import hf_lightning

    AcceleratorState._reset_state(reset_partial_state=True)  # an earlier HF Trainer in this process set one up

    kwargs = dict(output_dir=str(tmp_path / "out"), accelerator_config={"use_configured_state": True}, use_cpu=True)
    with pytest.raises(ValueError) as hf_error:
        transformers.TrainingArguments(**kwargs)
    with pytest.raises(ValueError) as ours_error:
        hf_lightning.TrainingArguments(**kwargs)
    assert str(ours_error.value).startswith(str(hf_error.value))
    assert not (tmp_path / "out").exists()


@pytest.fixture
def configured_partial_state():
    from accelerate.state import AcceleratorState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield PartialState(cpu=True)
    AcceleratorState._reset_state(reset_partial_state=True)


def test_use_configured_state_reuses_the_users_accelerate_state(tmp_path, configured_partial_state):
    import transformers

    import hf_lightning

    train, _ = lm_data(n_train=16, n_eval=0)
    hf, ours = (run(kind, tiny_gpt2, tmp_path, train_dataset=train,
                    args=dict(BASE, accelerator_config={"use_configured_state": True})) for kind in ("hf", "ours"))
    # HF drops the key once read; the configured state is still the one in use.
    assert ours.trainer.args.to_dict()["accelerator_config"] == hf.trainer.args.to_dict()["accelerator_config"]
    assert "use_configured_state" not in ours.trainer.args.accelerator_config
    assert configured_partial_state.initialized
    assert_parity(hf, ours)
    # DeepSpeed arguments with a configured state that is not DeepSpeed's: HF's RuntimeError.
    kwargs = dict(output_dir=str(tmp_path / "ds"), accelerator_config={"use_configured_state": True}, use_cpu=True,
                  deepspeed={"train_micro_batch_size_per_gpu": "auto"})
    with pytest.raises(RuntimeError, match="was not initialized for DeepSpeed") as ours_error:
        hf_lightning.TrainingArguments(**kwargs)
    with pytest.raises(RuntimeError) as hf_error:
        transformers.TrainingArguments(**kwargs)
    assert str(ours_error.value) == str(hf_error.value)


def test_use_configured_state_accepts_an_initialised_process_group(tmp_path):
    import torch.distributed as dist

    import hf_lightning

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        args = hf_lightning.TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True,
                                              accelerator_config={"use_configured_state": True})
    finally:
        dist.destroy_process_group()
    assert "use_configured_state" not in args.accelerator_config
