"""The names inside an output directory: ``checkpoint-N`` folders and the files a checkpoint folder holds.

Every file and folder name of HF's checkpoint layout is spelled here once, together with the one pattern that
tells a ``checkpoint-N`` folder by its name. Nothing here touches the disk or imports torch.
"""

from __future__ import annotations

import re

__all__ = [
    "ADAPTER_SAFE_WEIGHTS_NAME",
    "ADAPTER_WEIGHTS_NAME",
    "CONFIG_NAME",
    "DCP_METADATA_NAME",
    "DEEPSPEED_TAG_FILE",
    "FSDP_FULL_WEIGHTS_NAME",
    "FSDP_MODEL_PREFIX",
    "FSDP_OPTIMIZER_NAME",
    "FSDP_SHARDED_MODEL_DIR",
    "FSDP_SHARDED_OPTIMIZER_DIR",
    "JIT_LOGGING_WINDOW_KEY",
    "OPTIMIZER_NAME",
    "PREFIX_CHECKPOINT_DIR",
    "RNG_STATE_PREFIX",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "SUPERSEDED_CHECKPOINT_PREFIX",
    "TEMPORARY_CHECKPOINT_PREFIX",
    "TRAINER_STATE_NAME",
    "TRAINING_ARGS_JSON_NAME",
    "TRAINING_ARGS_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "checkpoint_folder_name",
    "checkpoint_step",
    "rng_file_name",
]

PREFIX_CHECKPOINT_DIR = "checkpoint"

CONFIG_NAME = "config.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_NAME = "pytorch_model.bin"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
ADAPTER_SAFE_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_WEIGHTS_NAME = "adapter_model.bin"
# FSDP writes its model as `pytorch_model_fsdp*` (file or folder), DeepSpeed as a `latest` tag plus a folder.
FSDP_MODEL_PREFIX = "pytorch_model_fsdp"
# HF's FSDP checkpoints (accelerate's save_fsdp_model / save_fsdp_optimizer): FULL_STATE_DICT adds the full weights
# (torch.save) and the full optimizer state keyed by parameter name; SHARDED_STATE_DICT writes two
# torch.distributed.checkpoint folders, each complete once its `.metadata` exists (written last, by rank 0).
FSDP_FULL_WEIGHTS_NAME = f"{FSDP_MODEL_PREFIX}.bin"
FSDP_OPTIMIZER_NAME = "optimizer.bin"
FSDP_SHARDED_MODEL_DIR = f"{FSDP_MODEL_PREFIX}_0"
FSDP_SHARDED_OPTIMIZER_DIR = "optimizer_0"
DCP_METADATA_NAME = ".metadata"
DEEPSPEED_TAG_FILE = "latest"

OPTIMIZER_NAME = "optimizer.pt"
SCHEDULER_NAME = "scheduler.pt"
SCALER_NAME = "scaler.pt"
RNG_STATE_PREFIX = "rng_state"
TRAINER_STATE_NAME = "trainer_state.json"
TRAINING_ARGS_NAME = "training_args.bin"
TRAINING_ARGS_JSON_NAME = "training_args.json"
# The `stateful_callbacks` entry of `trainer_state.json` in which a SIGTERM (`enable_jit_checkpoint`) checkpoint
# keeps the training-loss sums of the current logging window, so a resume logs the same loss as a run never stopped.
JIT_LOGGING_WINDOW_KEY = "JITCheckpointLoggingWindow"

# A save in progress, or a deletion, happens under this prefix, which resume and rotation never pick up.
TEMPORARY_CHECKPOINT_PREFIX = ".tmp-checkpoint-"
# An earlier run's `checkpoint-N` that a new run writes over is kept under this prefix. The name starts with neither
# `checkpoint-` (HF's rotation glob) nor `.tmp-checkpoint-` (stale-folder cleanup).
SUPERSEDED_CHECKPOINT_PREFIX = "superseded-"

# Exactly `checkpoint-<digits>`: HF globs `checkpoint-*`, which would take `checkpoint-5-old` for a checkpoint too.
_CHECKPOINT_FOLDER = re.compile(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)")


def checkpoint_folder_name(global_step: int) -> str:
    """Return the folder name HF uses for the checkpoint taken at ``global_step``, e.g. ``checkpoint-500``."""
    return f"{PREFIX_CHECKPOINT_DIR}-{global_step}"


def checkpoint_step(name: str) -> int | None:
    """Return the step a ``checkpoint-N`` folder name stands for, or None for any other name.

    Args:
        name: A folder name (not a path), e.g. ``"checkpoint-500"``.

    Returns:
        ``N`` when ``name`` is exactly ``checkpoint-<digits>``; None for ``checkpoint-5-old``, ``checkpoint-x``,
        ``.tmp-checkpoint-5-123`` and the like.
    """
    match = _CHECKPOINT_FOLDER.fullmatch(name)
    return int(match.group(1)) if match else None


def rng_file_name(process_index: int = 0, world_size: int = 1) -> str:
    """Return the RNG file name HF uses for one process.

    Args:
        process_index: Global rank of the process.
        world_size: Number of processes in the run.

    Returns:
        ``"rng_state.pth"`` when ``world_size <= 1``, else ``"rng_state_{process_index}.pth"``.
    """
    return f"{RNG_STATE_PREFIX}.pth" if world_size <= 1 else f"{RNG_STATE_PREFIX}_{process_index}.pth"
