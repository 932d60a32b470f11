"""HF's FSDP checkpoint layout (FULL_STATE_DICT and SHARDED_STATE_DICT), both ways, on 2 CPU processes (gloo).

HF's Trainer under FSDP writes and reads the model and optimizer of a ``checkpoint-N`` through accelerate's
``save_fsdp_model`` / ``save_fsdp_optimizer`` / ``load_fsdp_model`` / ``load_fsdp_optimizer`` (transformers 5.23
``_save_checkpoint``, ``_load_from_checkpoint``, ``_load_optimizer_and_scheduler``). ``fsdp_layout_script.py``
calls those functions directly on a ``fully_shard``-ed model (see its docstring): accelerate reads our folders, and
our FSDP2 run resumes the folders accelerate writes. HF's whole FSDP2 run (accelerate's GPU-only gate lifted)
writing and resuming these folders is checked in test_fsdp.py.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.torchrun import launch_env

SCRIPT = Path(__file__).with_name("fsdp_layout_script.py")
ROOT = Path(__file__).resolve().parents[2]

# What HF's FSDP run leaves in a checkpoint besides the trainer's own files, by state_dict_type.
MODEL_FILES = {
    "SHARDED": ["optimizer_0/", "pytorch_model_fsdp_0/"],
    "FULL": ["model.safetensors", "optimizer.bin", "pytorch_model_fsdp.bin"],
}
COMMON_FILES = ["config.json", "rng_state_0.pth", "rng_state_1.pth", "scheduler.pt", "trainer_state.json",
                "training_args.bin", "training_args.json"]


def _launch(tmp_path, layout):
    env = launch_env()
    result = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(SCRIPT), str(tmp_path / "work"), str(result), layout],
                          capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(result.read_text())[layout]


def _check(result, layout):
    files = sorted(COMMON_FILES + MODEL_FILES[layout] + (["generation_config.json"] if layout == "FULL" else []))
    assert result["files"] == files
    assert "optimizer.pt" not in result["files"]  # HF's FSDP run writes optimizer.bin / optimizer_0/ instead
    if layout == "SHARDED":
        # Each process wrote its own shard; `.metadata` makes the folder complete.
        for name in ("pytorch_model_fsdp_0", "optimizer_0"):
            assert result["dcp_files"][name] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        assert result["theirs_files"] == result["files"]  # accelerate wrote the same layout
    # accelerate's load_fsdp_model / load_fsdp_optimizer read our folder into a fresh sharded model: the full
    # weights and optimizer state equal the folder's (read by hf_lightning into another fresh model).
    assert result["fresh_differs"]
    assert result["accelerate_model_equal"] == result["weight_names"]
    assert result["accelerate_optimizer_equal"]
    assert result["optimizer_step"] == 2.0
    assert [group["weight_decay"] for group in result["optimizer_groups"]] == [0.1, 0.0]
    # save_model() writes the full weights (also with SHARDED_STATE_DICT), which from_pretrained reads.
    assert result["from_pretrained_equal"] == result["weight_names"]
    # Our FSDP2 run resumed accelerate's folder and ended bit-identical to the uninterrupted run.
    assert result["weights_equal_after_resume"] == result["weight_names"]
    assert result["resumed_loss_at_4"] == result["loss_at_4"]


def test_sharded_state_dict_checkpoints_interchange_with_accelerates_fsdp_functions(tmp_path):
    _check(_launch(tmp_path, "SHARDED"), "SHARDED")


@pytest.mark.slow
def test_full_state_dict_checkpoints_interchange_with_accelerates_fsdp_functions(tmp_path):
    _check(_launch(tmp_path, "FULL"), "FULL")
