"""The one completeness rule: each way a folder can be unfinished has its reason, and resume and rotation agree."""

import io
import os

import pytest
import safetensors.torch
import torch

from hf_lightning.checkpointing.completeness import has_model_weights, incomplete_reason, is_complete_checkpoint
from hf_lightning.checkpointing.paths import get_last_checkpoint
from hf_lightning.checkpointing.rotation import rotate_checkpoints, sort_checkpoints

STATE = b'{"global_step": 1}'
# The smallest valid safetensors file (no tensors): an 8-byte header length and the header "{}".
EMPTY_SAFETENSORS = (2).to_bytes(8, "little") + b"{}"
TENSORS = safetensors.torch.save({"w": torch.ones(8)})
LEGACY_PICKLE = b"\x80\x02}q\x00."  # an empty dict pickled the pre-zip way: nothing cheap to check, so accepted


def _zip_file():
    buffer = io.BytesIO()
    torch.save({"step": 1}, buffer)
    return buffer.getvalue()


ZIP = _zip_file()
WEIGHTS = {"model.safetensors": EMPTY_SAFETENSORS}


@pytest.mark.parametrize("files,reason", [
    ({"trainer_state.json": STATE, **WEIGHTS}, None),
    ({"trainer_state.json": STATE, "pytorch_model.bin": LEGACY_PICKLE}, None),
    ({"trainer_state.json": STATE, "model.safetensors.index.json": b'{"weight_map": {}}'}, None),
    ({"trainer_state.json": STATE, "pytorch_model.bin.index.json": b'{"weight_map": {}}'}, None),
    ({"trainer_state.json": STATE, "adapter_model.safetensors": EMPTY_SAFETENSORS}, None),
    ({"trainer_state.json": STATE, "adapter_model.bin": ZIP}, None),
    ({"trainer_state.json": STATE, "first/adapter_model.safetensors": EMPTY_SAFETENSORS}, None),
    ({"trainer_state.json": STATE, "pytorch_model_fsdp.bin": ZIP}, None),
    ({"trainer_state.json": STATE, "pytorch_model_fsdp_0/__0_0.distcp": b"x", "pytorch_model_fsdp_0/.metadata": b"m",
      "optimizer_0/__0_0.distcp": b"x", "optimizer_0/.metadata": b"m"}, None),
    # HF's SHARDED_STATE_DICT folders are complete only once torch.distributed.checkpoint wrote `.metadata` (last).
    ({"trainer_state.json": STATE, "pytorch_model_fsdp_0/__0_0.distcp": b"x"}, "no model weights"),
    ({"trainer_state.json": STATE, "pytorch_model_fsdp_0/__0_0.distcp": b"x", "pytorch_model_fsdp_0/.metadata": b"m",
      "optimizer_0/__0_0.distcp": b"x"}, "optimizer_0/ has no .metadata"),
    ({"trainer_state.json": STATE, "pytorch_model_fsdp.bin": ZIP, "pytorch_model_fsdp_1/__0_0.distcp": b"x"},
     "pytorch_model_fsdp_1/ has no .metadata"),
    ({"trainer_state.json": STATE, "latest": b"global_step1"}, None),
    ({"trainer_state.json": STATE, "model.safetensors": TENSORS, "optimizer.pt": ZIP}, None),
    ({}, "no trainer_state.json"),
    ({**WEIGHTS, "optimizer.pt": ZIP}, "no trainer_state.json"),
    ({"trainer_state.json": b'{"global_st', **WEIGHTS}, "trainer_state.json does not parse"),
    ({"trainer_state.json": b"", **WEIGHTS}, "trainer_state.json does not parse"),
    ({"trainer_state.json": STATE, "optimizer.pt": ZIP}, "no model weights"),
    ({"trainer_state.json": STATE, "first/adapter_config.json": b"{}"}, "no model weights"),
    ({"trainer_state.json": STATE, "model.safetensors": b""}, "model.safetensors is truncated"),
    ({"trainer_state.json": STATE, "model.safetensors": TENSORS[:-5]}, "model.safetensors is truncated"),
    ({"trainer_state.json": STATE, **WEIGHTS, "optimizer.pt": ZIP[:-30]}, "optimizer.pt is truncated"),
    ({"trainer_state.json": STATE, **WEIGHTS, "tokenizer.json": b""}, "tokenizer.json is truncated"),
], ids=lambda value: None if isinstance(value, dict) else str(value))
def test_incomplete_reason(tmp_path, files, reason):
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    assert incomplete_reason(tmp_path) == reason
    assert is_complete_checkpoint(tmp_path) is (reason is None)


def test_missing_folder_is_incomplete(tmp_path):
    assert incomplete_reason(tmp_path / "checkpoint-1") == "no trainer_state.json"
    assert not has_model_weights(tmp_path / "checkpoint-1")


def test_resume_and_rotation_use_the_same_rule(tmp_path):
    """A folder resume would skip is one rotation neither counts nor deletes (not even a truncated one)."""
    folders = {
        "checkpoint-2": {"trainer_state.json": STATE, **WEIGHTS},
        "checkpoint-4": {"trainer_state.json": STATE, "model.safetensors": TENSORS[:-5]},
        "checkpoint-6": {"trainer_state.json": STATE, "optimizer.pt": ZIP},
        "checkpoint-8": {**WEIGHTS},
    }
    for folder, files in folders.items():
        os.mkdir(tmp_path / folder)
        for name, data in files.items():
            (tmp_path / folder / name).write_bytes(data)

    assert get_last_checkpoint(tmp_path) == os.path.join(tmp_path, "checkpoint-2")
    assert sort_checkpoints(tmp_path) == [str(tmp_path / "checkpoint-2")]
    assert rotate_checkpoints(tmp_path, save_total_limit=1) == []
    assert sorted(os.listdir(tmp_path)) == sorted(folders)
