"""Smaller public Trainer methods give HF's answers."""

import math

import pytest
import torch

from tests.helpers.models import lm_data, tiny_gpt2


def _pair(tmp_path, **kw):
    import transformers

    import hf_lightning

    train, _ = lm_data(n_train=20)
    out = []
    for lib in (transformers, hf_lightning):
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), report_to="none", use_cpu=True,
                                     disable_tqdm=True, per_device_train_batch_size=4, max_steps=2,
                                     save_strategy="no", **kw)
        trainer = lib.Trainer(model=tiny_gpt2(), args=args, train_dataset=train)
        out.append(trainer)
    return out


def test_helpers_match_hf(tmp_path):
    hf, ours = _pair(tmp_path, gradient_accumulation_steps=2, num_train_epochs=1.5)
    assert ours.get_num_trainable_parameters() == hf.get_num_trainable_parameters()
    assert ours.get_decay_parameter_names(ours.model) == hf.get_decay_parameter_names(hf.model)
    assert ours.get_total_train_batch_size(ours.args) == hf.get_total_train_batch_size(hf.args)
    loader_hf, loader_ours = hf.get_train_dataloader(), ours.get_train_dataloader()
    assert ours.num_examples(loader_ours) == hf.num_examples(loader_hf)
    ours_values = ours.set_initial_training_values(ours.args, loader_ours)
    hf_values = hf.set_initial_training_values(hf.args, loader_hf)
    assert ours_values == hf_values
    inputs = next(iter(loader_ours))
    assert ours.floating_point_ops(inputs) == hf.floating_point_ops(inputs)
    metrics = {"train_runtime": 3725.5, "train_loss": 1.234567, "total_flos": 3 * 2**30}
    from transformers.trainer_pt_utils import metrics_format

    # HF's Trainer.metrics_format is the plain function (calling it on an instance fails in HF).
    assert ours.metrics_format(metrics) == metrics_format(metrics)
    hf.train()
    ours.train()
    assert ours.get_learning_rates() == pytest.approx(hf.get_learning_rates())
    assert ours.get_optimizer_cls_and_kwargs(ours.args)[0] is hf.get_optimizer_cls_and_kwargs(hf.args)[0]


def test_hub_methods_are_refused(tmp_path):
    _, ours = _pair(tmp_path)
    for name in ("push_to_hub", "init_hf_repo"):
        with pytest.raises(ValueError, match="not supported"):
            getattr(ours, name)()


def test_call_model_init_passes_the_trial(tmp_path):
    import hf_lightning

    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    seen = []
    trainer = hf_lightning.Trainer(model_init=lambda trial: seen.append(trial) or tiny_gpt2(), args=args)
    seen.clear()
    trainer.call_model_init("T")
    assert seen == ["T"]
