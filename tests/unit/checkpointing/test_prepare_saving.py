"""``prepare_model_saving``: transformers' one-time conversion table built before training, output unchanged."""

import hashlib
import os

import pytest
import torch
from ckpt_helpers import TinyLMData, tiny_gpt2

import hf_lightning
from hf_lightning.checkpointing.model_state import prepare_model_saving

conversion_mapping = pytest.importorskip("transformers.conversion_mapping")


@pytest.fixture
def cold_table(monkeypatch):
    """A process whose transformers has not built its conversion table yet (restored afterwards)."""
    monkeypatch.setattr(conversion_mapping, "_checkpoint_conversion_mapping_cache", None)


def _digests(folder):
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(folder))}


def test_builds_the_table_and_save_pretrained_writes_the_same_files(tmp_path, monkeypatch, cold_table):
    model = tiny_gpt2()
    model.save_pretrained(tmp_path / "cold")  # the save builds the table itself
    assert conversion_mapping._checkpoint_conversion_mapping_cache is not None

    monkeypatch.setattr(conversion_mapping, "_checkpoint_conversion_mapping_cache", None)
    prepare_model_saving(model)
    assert conversion_mapping._checkpoint_conversion_mapping_cache is not None
    model.save_pretrained(tmp_path / "prepared")
    assert _digests(tmp_path / "prepared") == _digests(tmp_path / "cold")


def test_models_without_save_pretrained_are_left_alone(cold_table):
    prepare_model_saving(torch.nn.Linear(2, 2))
    assert conversion_mapping._checkpoint_conversion_mapping_cache is None


class _SeesTable(hf_lightning.TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        self.built_at_train_begin = conversion_mapping._checkpoint_conversion_mapping_cache is not None


@pytest.mark.parametrize("save_strategy, built", [("steps", True), ("no", False)])
def test_trainer_builds_the_table_before_training_when_it_will_save(tmp_path, cold_table, save_strategy, built):
    sees = _SeesTable()
    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1, save_strategy=save_strategy,
        save_steps=1, report_to="none", use_cpu=True, disable_tqdm=True,
    )
    hf_lightning.Trainer(model=tiny_gpt2(), args=args, train_dataset=TinyLMData(), callbacks=[sees]).train()
    assert sees.built_at_train_begin is built
    assert os.path.isdir(tmp_path / "checkpoint-1") is built
