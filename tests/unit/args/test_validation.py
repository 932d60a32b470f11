"""The argument rules of hf_lightning.args.validation, called directly (no Trainer, no Lightning)."""

import math

import pytest
import torch

from hf_lightning import TrainingArguments
from hf_lightning.args import validation


def _args(tmp_path, **kw):
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)


class _Sized(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"x": torch.zeros(1)}


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield {"x": torch.zeros(1)}


@pytest.mark.parametrize("args_kw, inputs, message", [
    (dict(eval_strategy="steps", eval_steps=2), dict(), r"didn't pass an `eval_dataset`"),
    (dict(save_strategy="best"), dict(), r"metric_for_best_model` must be provided"),
    (dict(batch_eval_metrics=True), dict(compute_metrics=lambda p: {}), r"must take a `compute_result`"),
    (dict(), dict(train_dataset=_Stream()), r"does not implement __len__, max_steps has to be specified"),
    (dict(max_steps=3, train_sampling_strategy="group_by_length"), dict(train_dataset=_Stream()),
     r"group_by_length.*IterableDataset"),
])
def test_trainer_inputs_are_refused_naming_the_argument(tmp_path, args_kw, inputs, message):
    with pytest.raises(ValueError, match=message):
        validation.check_trainer_inputs(_args(tmp_path, **args_kw), **inputs)


def test_trainer_inputs_that_fit_pass(tmp_path):
    validation.check_trainer_inputs(_args(tmp_path, eval_strategy="epoch", batch_eval_metrics=True),
                                    train_dataset=_Sized(), eval_dataset=_Sized(),
                                    compute_metrics=lambda p, compute_result: {})


@pytest.mark.parametrize("field, value", [
    ("per_device_train_batch_size", 0),
    ("gradient_accumulation_steps", 0),
    ("learning_rate", -1.0),
    ("learning_rate", math.nan),
    ("label_smoothing_factor", 1.0),
    ("dataloader_num_workers", -1),
])
def test_untrainable_values_name_the_field(tmp_path, field, value):
    args = _args(tmp_path)
    setattr(args, field, value)  # a dataclass field changed after construction: HF only fails inside torch
    with pytest.raises(ValueError, match=rf"TrainingArguments\.{field}=.*cannot train.*Change `{field}`"):
        validation.check_trainable(args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the rule is about runs without CUDA")
def test_half_precision_that_needs_a_gpu_is_refused_on_the_cpu(tmp_path):
    args = _args(tmp_path)
    args.fp16 = True
    with pytest.raises(ValueError, match=r"fp16=True needs a CUDA GPU.*bf16=True"):
        validation.check_precision(args)
    args = _args(tmp_path, fp16_full_eval=True)
    with pytest.raises(ValueError, match=r"fp16_full_eval=True .* needs a CUDA GPU.*bf16_full_eval"):
        validation.check_full_eval_precision(args)
    # Training refuses it only when it would evaluate during training.
    validation.check_trainable(args)
    args = _args(tmp_path, fp16_full_eval=True, eval_strategy="epoch")
    with pytest.raises(ValueError, match="fp16_full_eval"):
        validation.check_trainable(args)


def test_construction_runs_the_rules(tmp_path):
    with pytest.raises(ValueError, match="At most one of fp16 and bf16"):
        _args(tmp_path, fp16=True, bf16=True)
    with pytest.raises(ValueError, match=r"log_level='loud' is not valid"):
        _args(tmp_path, log_level="loud")
    with pytest.raises(ValueError, match=r"`push_to_hub=True` is not supported by hf_lightning"):
        _args(tmp_path, push_to_hub=True)
