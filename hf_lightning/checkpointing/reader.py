"""Reading a checkpoint folder back: the model's weights (through its model state), optimizer, scheduler and scaler.

Every file is read the safe way (:mod:`hf_lightning.checkpointing.safe_load`); when and where a resume applies
these is the flow callback's and the module's business, not this module's. The training arguments are read by
:func:`~hf_lightning.checkpointing.safe_load.load_training_args`, the RNG states by
:func:`~hf_lightning.checkpointing.rng.restore_rng_state`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from hf_lightning.checkpointing.layout import FSDP_OPTIMIZER_NAME, FSDP_SHARDED_OPTIMIZER_DIR, OPTIMIZER_NAME
from hf_lightning.checkpointing.layout import SCALER_NAME, SCHEDULER_NAME
from hf_lightning.checkpointing.model_state import ModelState, WeightsLoadResult, apply_optimizer_state
from hf_lightning.checkpointing.model_state import load_optimizer_files, model_state_for
from hf_lightning.checkpointing.safe_load import safe_torch_load

__all__ = ["load_model_weights", "load_optimizer_and_scheduler", "load_scaler"]

logger = logging.getLogger(__name__)


def load_model_weights(
    model: torch.nn.Module,
    checkpoint_dir: str | os.PathLike,
    strict: bool = False,
    *,
    model_state: ModelState | None = None,
) -> WeightsLoadResult:
    """Load a checkpoint's weights into ``model`` (on CPU first), as HF's ``_load_from_checkpoint`` does.

    For the default plain kind (:class:`~hf_lightning.checkpointing.model_state.PlainModelState`) looks for, in
    order: ``model.safetensors``, ``pytorch_model.bin`` (read with ``weights_only=True``), then a sharded
    ``model.safetensors.index.json`` or ``pytorch_model.bin.index.json``. Missing / unexpected keys are logged as
    warnings (a tied weight that is not stored, such as GPT-2's ``lm_head.weight``, is not reported).

    Args:
        model: The model, possibly wrapped under ``.module``.
        checkpoint_dir: A checkpoint folder or a ``save_model`` output folder.
        strict: Raise when keys do not match, as ``load_state_dict(strict=True)``.
        model_state: How the model's state was saved; when None, the one
            :func:`~hf_lightning.checkpointing.model_state.model_state_for` chooses (PEFT adapters for a PEFT model).

    Returns:
        The missing and unexpected keys.

    Raises:
        ValueError: ``Can't find a valid checkpoint at {checkpoint_dir}`` when no weight file exists (HF's
            message).
        CheckpointLoadError: A weight file is truncated, corrupt or tampered with.
        ValueError: Not one stored tensor is a parameter of ``model`` (the weights of another model; HF warns and
            goes on with the model's initial weights).
        RuntimeError: ``strict=True`` and the keys do not match, or a tensor's shape differs (names the file).
    """
    return (model_state or model_state_for(model)).load(model, os.fspath(checkpoint_dir), strict)


def load_optimizer_and_scheduler(optimizer: Any, scheduler: Any, checkpoint_dir: str | os.PathLike, *,
                                 model: torch.nn.Module | None = None, model_state: ModelState | None = None) -> bool:
    """Restore optimizer and scheduler states from ``optimizer.pt`` and ``scheduler.pt``, as HF does on resume.

    Both files must exist, else neither is loaded (a ``save_only_model`` checkpoint has none). Both are read
    before either is applied, so a damaged file leaves both objects untouched. A folder in HF's FSDP layout has
    ``optimizer_0/`` (sharded) or ``optimizer.bin`` (full, keyed by parameter name) instead of ``optimizer.pt``:
    that is loaded through ``model`` (sharded by FSDP2 or not; on every process).

    Args:
        optimizer: A ``torch.optim.Optimizer`` (state is moved to its parameters' devices on load).
        scheduler: An LR scheduler with ``load_state_dict``.
        checkpoint_dir: A checkpoint folder.
        model: The model the optimizer trains; with ``model_state``, the optimizer state is loaded through it
            (a sharded optimizer keeps its shard of the full state).
        model_state: How the model's state is saved (:func:`model_state_for`); ``None``: ``load_state_dict``.

    Returns:
        True when both states were loaded, False when a file is missing.

    Raises:
        CheckpointLoadError: A file is truncated, corrupt or tampered with.
    """
    checkpoint_dir = os.fspath(checkpoint_dir)
    optimizer_file = os.path.join(checkpoint_dir, OPTIMIZER_NAME)
    scheduler_file = os.path.join(checkpoint_dir, SCHEDULER_NAME)
    # HF's FSDP layout: `optimizer_0/` (SHARDED_STATE_DICT) or `optimizer.bin` (FULL_STATE_DICT), as HF looks.
    fsdp_layout = os.path.isdir(os.path.join(checkpoint_dir, FSDP_SHARDED_OPTIMIZER_DIR)) or \
        os.path.isfile(os.path.join(checkpoint_dir, FSDP_OPTIMIZER_NAME))
    if not ((fsdp_layout or os.path.isfile(optimizer_file)) and os.path.isfile(scheduler_file)):
        logger.info(
            "%s lacks %s or %s; optimizer and scheduler start fresh.", checkpoint_dir, OPTIMIZER_NAME, SCHEDULER_NAME
        )
        return False
    scheduler_state = safe_torch_load(scheduler_file)
    if fsdp_layout:
        if model is None:
            raise ValueError(
                f"load_optimizer_and_scheduler({checkpoint_dir!r}): the folder holds HF's FSDP optimizer files, "
                "which are keyed by parameter name; pass model=... (the model the optimizer trains)."
            )
        load_optimizer_files(model, optimizer, checkpoint_dir)
        scheduler.load_state_dict(scheduler_state)
        return True
    optimizer_state = safe_torch_load(optimizer_file)
    if model_state is not None and model is not None:
        apply_optimizer_state(model_state, model, optimizer, optimizer_state)
    else:
        optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(scheduler_state)
    return True


def load_scaler(scaler: Any, checkpoint_dir: str | os.PathLike) -> bool:
    """Restore a gradient scaler from ``scaler.pt`` when the checkpoint has one.

    Args:
        scaler: A ``torch.amp.GradScaler``.
        checkpoint_dir: A checkpoint folder.

    Returns:
        True when loaded, False when there is no ``scaler.pt``.

    Raises:
        CheckpointLoadError: The file is truncated, corrupt or tampered with.
    """
    path = os.path.join(checkpoint_dir, SCALER_NAME)
    if not os.path.isfile(path):
        return False
    scaler.load_state_dict(safe_torch_load(path))
    return True
