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
