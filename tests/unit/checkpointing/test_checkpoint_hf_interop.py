"""Checkpoints written by us load into `transformers.Trainer`, and checkpoints HF wrote load with ours."""

import json
import os
from pathlib import Path

import pytest
import safetensors.torch
import torch

from hf_lightning.checkpointing.completeness import is_complete_checkpoint
from hf_lightning.checkpointing.layout import TRAINING_ARGS_JSON_NAME
from hf_lightning.checkpointing.reader import load_model_weights, load_optimizer_and_scheduler
from hf_lightning.checkpointing.safe_load import load_training_args
from hf_lightning.checkpointing.writer import write_checkpoint
from hf_lightning.checkpointing.rng import restore_rng_state
from hf_lightning.state import TrainerState

from ckpt_helpers import hf_trainer, rng_snapshot, scramble_rng, tiny_gpt2

GOLDEN = json.loads(Path("/work/shared/reference/golden/checkpoints.json").read_text())


def _assert_same_tensors(actual: dict, expected: dict):
    assert actual.keys() == expected.keys()
    for name in expected:
        assert torch.equal(actual[name], expected[name]), name


def _assert_same_optimizer_state(actual: dict, expected: dict):
    assert actual["param_groups"] == expected["param_groups"]
    assert actual["state"].keys() == expected["state"].keys()
    for index, values in expected["state"].items():
        assert actual["state"][index].keys() == values.keys()
        for key, value in values.items():
            assert torch.equal(torch.as_tensor(actual["state"][index][key]), torch.as_tensor(value)), (index, key)


def _one_training_step(trainer):
    """Take one optimizer + scheduler step with HF's own optimizer and scheduler objects."""
    trainer.create_optimizer_and_scheduler(num_training_steps=4)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    trainer.model(**batch).loss.backward()
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    trainer.optimizer.zero_grad()


@pytest.fixture
def our_checkpoint(tmp_path):
    """A checkpoint written by `write_checkpoint` after one step of the tiny GPT-2 with HF's optimizer."""
    trainer = hf_trainer(tmp_path / "ours")
    _one_training_step(trainer)
    state = TrainerState(global_step=1, max_steps=4, epoch=0.25, best_global_step=1, best_metric=1.0)
    rng_before = rng_snapshot()
    path = write_checkpoint(
        tmp_path / "ours", 1, model=trainer.model, optimizer=trainer.optimizer, scheduler=trainer.lr_scheduler,
        state=state, args=trainer.args,
    )
    return trainer, path, rng_before


def test_our_checkpoint_has_hf_file_set(our_checkpoint):
    _, path, _ = our_checkpoint
    assert path.endswith(os.path.join("ours", "checkpoint-1"))
    expected = set(GOLDEN["files_per_checkpoint"]["checkpoint-12"]) | {TRAINING_ARGS_JSON_NAME}
    assert set(os.listdir(path)) == expected
    assert os.listdir(os.path.dirname(path)) == ["checkpoint-1"]  # no temporary folder left behind
    assert is_complete_checkpoint(path)


def test_our_checkpoint_loads_into_hf_trainer(our_checkpoint, tmp_path):
    from transformers.trainer_callback import TrainerState as HFTrainerState

    trained, path, rng_before = our_checkpoint
    fresh = hf_trainer(tmp_path / "fresh", model=tiny_gpt2(seed=7))

    fresh._load_from_checkpoint(path)
    _assert_same_tensors(fresh.model.state_dict(), trained.model.state_dict())

    fresh.create_optimizer_and_scheduler(num_training_steps=4)
    fresh._load_optimizer_and_scheduler(path)
    _assert_same_optimizer_state(fresh.optimizer.state_dict(), trained.optimizer.state_dict())
    assert fresh.lr_scheduler.state_dict() == trained.lr_scheduler.state_dict()

    scramble_rng()
    fresh._load_rng_state(path)
    assert rng_snapshot() == rng_before

    hf_state = HFTrainerState.load_from_json(os.path.join(path, "trainer_state.json"))
    assert hf_state.global_step == 1
    # Set as HF does: the best step's folder (here the one being written) exists.
    assert hf_state.best_model_checkpoint == path


def test_our_weights_read_with_plain_safetensors(our_checkpoint):
    trained, path, _ = our_checkpoint
    stored = safetensors.torch.load_file(os.path.join(path, "model.safetensors"))
    expected = trained.model.state_dict()
    for name, tensor in stored.items():
        assert torch.equal(tensor, expected[name]), name
    # save_pretrained does not store the tied lm_head twice.
    assert "lm_head.weight" not in stored


def test_hf_checkpoint_weights_load_with_ours(hf_run, caplog):
    model = tiny_gpt2(seed=7)
    with caplog.at_level("WARNING"):
        result = load_model_weights(model, hf_run.checkpoint)
    assert result.missing_keys == ["lm_head.weight"]
    assert result.unexpected_keys == []
    assert "missing" not in caplog.text  # the tied lm_head is loaded through wte, so nothing is reported
    _assert_same_tensors(model.state_dict(), hf_run.trainer.model.state_dict())


def test_hf_checkpoint_optimizer_and_scheduler_load_with_ours(hf_run, tmp_path):
    fresh = hf_trainer(tmp_path / "fresh", model=tiny_gpt2(seed=7))
    fresh.create_optimizer_and_scheduler(num_training_steps=2)

    assert load_optimizer_and_scheduler(fresh.optimizer, fresh.lr_scheduler, hf_run.checkpoint) is True

    _assert_same_optimizer_state(fresh.optimizer.state_dict(), hf_run.trainer.optimizer.state_dict())
    assert fresh.lr_scheduler.state_dict() == hf_run.trainer.lr_scheduler.state_dict()


def test_hf_checkpoint_rng_restores_like_hf(hf_run):
    scramble_rng()
    hf_run.trainer._load_rng_state(hf_run.checkpoint)
    expected = rng_snapshot()
    scramble_rng()

    assert restore_rng_state(hf_run.checkpoint) is True

    assert rng_snapshot() == expected


def test_hf_training_args_bin_read_without_unpickling(hf_run):
    values = load_training_args(hf_run.checkpoint)
    expected = json.loads(hf_run.trainer.args.to_json_string())
    assert {key: values[key] for key in expected} == expected


def test_hf_checkpoints_are_complete(hf_run):
    assert is_complete_checkpoint(hf_run.checkpoint)
    assert is_complete_checkpoint(os.path.join(hf_run.output_dir, "checkpoint-1"))


def test_missing_weights_error_matches_hf(tmp_path):
    empty = tmp_path / "checkpoint-3"
    empty.mkdir()
    with pytest.raises(ValueError) as hf_error:
        hf_trainer(tmp_path / "hf")._load_from_checkpoint(str(empty))
    with pytest.raises(ValueError, match="Can't find a valid checkpoint at") as our_error:
        load_model_weights(tiny_gpt2(), str(empty))
    assert str(our_error.value) == str(hf_error.value)


def test_sharded_hf_weights_load_with_ours(tmp_path):
    source = tiny_gpt2(seed=3)
    source.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()

    target = tiny_gpt2(seed=4)
    result = load_model_weights(target, tmp_path / "sharded")

    assert result.unexpected_keys == []
    _assert_same_tensors(target.state_dict(), source.state_dict())
