"""Small HF behaviours at ``Trainer()`` and around evaluation: ``label_smoother`` and its multi-label warning, a
dict as ``train_dataset``, and the per-dataset eval DataLoader cache with persistent workers."""

from __future__ import annotations

import warnings

import pytest
import transformers

import hf_lightning
from tests.helpers.models import classification_data, tiny_bert_classifier


def _args(lib, tmp_path, **kwargs):
    return lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), report_to="none", use_cpu=True,
                                 disable_tqdm=True, **kwargs)


@pytest.mark.parametrize("factor", [0.0, 0.1])
def test_label_smoother_attribute_as_hf(tmp_path, factor):
    smoothers = {}
    for lib in (transformers, hf_lightning):
        trainer = lib.Trainer(model=tiny_bert_classifier(), args=_args(lib, tmp_path, label_smoothing_factor=factor))
        smoothers[lib.__name__] = trainer.label_smoother
    if factor == 0.0:
        assert smoothers["hf_lightning"] is None and smoothers["transformers"] is None
    else:
        assert isinstance(smoothers["hf_lightning"], hf_lightning.LabelSmoother)
        assert smoothers["hf_lightning"].epsilon == smoothers["transformers"].epsilon == factor


def test_label_smoothing_with_multi_label_warns_at_trainer_as_hf(tmp_path):
    messages = {}
    for lib in (transformers, hf_lightning):
        model = tiny_bert_classifier()
        model.config.problem_type = "multi_label_classification"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = lib.Trainer(model=model, args=_args(lib, tmp_path, label_smoothing_factor=0.1))
        assert trainer.label_smoother is None
        messages[lib.__name__] = [str(w.message) for w in caught
                                  if issubclass(w.category, UserWarning) and "Label smoothing" in str(w.message)]
    assert messages["hf_lightning"] == messages["transformers"]
    assert len(messages["hf_lightning"]) == 1


def test_a_dict_train_dataset_is_refused_at_trainer(tmp_path):
    train = classification_data(n=8)
    with pytest.raises(ValueError, match=r"train_dataset is a dict.*'train', 'validation'.*dataset\[\"train\"\]"):
        hf_lightning.Trainer(model=tiny_bert_classifier(), args=_args(hf_lightning, tmp_path),
                             train_dataset={"train": train, "validation": train})


def test_eval_dataloader_cached_per_dataset_with_persistent_workers(tmp_path):
    eval_ds = classification_data(n=8)
    other = list(eval_ds)[:4]
    args = _args(hf_lightning, tmp_path, dataloader_num_workers=1, dataloader_persistent_workers=True)
    trainer = hf_lightning.Trainer(model=tiny_bert_classifier(), args=args, eval_dataset={"a": eval_ds, "b": other})
    first = trainer.get_eval_dataloader("a")
    assert trainer.get_eval_dataloader("a") is first
    assert trainer.get_eval_dataloader("b") is not first
    assert set(trainer._eval_dataloaders) == {"a", "b"}
    assert trainer.evaluate()["eval_a_loss"] == pytest.approx(trainer.evaluate()["eval_a_loss"])
    assert trainer.get_eval_dataloader("a") is first and set(trainer._eval_dataloaders) == {"a", "b"}
    # A dataset that is not the trainer's is not cached (HF would hand back the "eval" loader for it).
    assert trainer.get_eval_dataloader(other[:2]) is not trainer.get_eval_dataloader(other[:2])

    plain = hf_lightning.Trainer(model=tiny_bert_classifier(), args=_args(hf_lightning, tmp_path / "p"),
                                 eval_dataset=eval_ds)
    assert plain.get_eval_dataloader() is not plain.get_eval_dataloader()
