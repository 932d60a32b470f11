"""The one rule for "this checkpoint folder was fully written", used by resume and rotation alike.

A folder is complete when (checked in this order):

1. it has ``trainer_state.json``, the last file both HF's Trainer and our writer write, so a save killed before
   the end lacks it;
2. that file parses (a kill while HF wrote it leaves it cut short);
3. it holds model weights in a layout HF can resume from (:func:`has_model_weights`), and each of HF's FSDP
   sharded folders (``pytorch_model_fsdp_0/``, ``optimizer_0/``) has its ``.metadata``, which
   torch.distributed.checkpoint writes last;
4. no file is truncated: every file is non-empty, every ``.safetensors`` file as long as its header says and every
   zip-format torch file (``.pt``/``.pth``/``.bin``) ends with its zip directory. A folder renamed just before a
   power cut (see :mod:`hf_lightning.checkpointing.durability`) can come back like that. The checks read a few
   bytes per file.

:func:`~hf_lightning.checkpointing.paths.get_last_checkpoint` skips an incomplete folder (resuming from the
previous one) and :mod:`~hf_lightning.checkpointing.rotation` neither counts nor deletes one. Nothing here imports
torch.
"""

from __future__ import annotations

import json
import os

from hf_lightning.checkpointing.layout import (
    ADAPTER_SAFE_WEIGHTS_NAME,
    ADAPTER_WEIGHTS_NAME,
    DCP_METADATA_NAME,
    DEEPSPEED_TAG_FILE,
    FSDP_MODEL_PREFIX,
    FSDP_SHARDED_OPTIMIZER_DIR,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    TRAINER_STATE_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)

__all__ = ["has_model_weights", "incomplete_reason", "is_complete_checkpoint"]

# Weight files that make a folder loadable as a model: full/sharded weights and PEFT adapters (as HF accepts).
_WEIGHT_FILES = (
    SAFE_WEIGHTS_NAME,
    WEIGHTS_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    WEIGHTS_INDEX_NAME,
    ADAPTER_SAFE_WEIGHTS_NAME,
    ADAPTER_WEIGHTS_NAME,
)
_ADAPTER_FILES = (ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME)
# Names of HF's FSDP torch.distributed.checkpoint folders (`pytorch_model_fsdp_0/`, `optimizer_0/`).
_DCP_FOLDER_PREFIXES = (FSDP_MODEL_PREFIX, FSDP_SHARDED_OPTIMIZER_DIR[:-1])


def has_model_weights(path: str | os.PathLike) -> bool:
    """Tell whether a folder holds model weights HF's Trainer can resume from.

    Args:
        path: A checkpoint folder.

    Returns:
        True when it has ``model.safetensors``, ``pytorch_model.bin``, a sharded index of either, PEFT adapter
        weights (at the top or one sub-folder per adapter), an FSDP model (``pytorch_model_fsdp.bin``, or a
        ``pytorch_model_fsdp_*`` folder with its ``.metadata``) or a DeepSpeed ``latest`` tag.
    """
    if not os.path.isdir(path):
        return False
    names = os.listdir(path)
    if any(os.path.isfile(os.path.join(path, name)) for name in _WEIGHT_FILES if name in names):
        return True
    if DEEPSPEED_TAG_FILE in names:
        return True
    # HF's FSDP weights: `pytorch_model_fsdp.bin`, or a torch.distributed.checkpoint folder such as
    # `pytorch_model_fsdp_0/`, which holds weights only once its `.metadata` (written last) exists.
    if any(name.startswith(FSDP_MODEL_PREFIX) and (os.path.isfile(os.path.join(path, name))
                                                   or _dcp_complete(os.path.join(path, name))) for name in names):
        return True
    # Several PEFT adapters are saved in one sub-folder each.
    return any(
        os.path.isfile(os.path.join(path, name, adapter))
        for name in names
        if os.path.isdir(os.path.join(path, name))
        for adapter in _ADAPTER_FILES
    )


def incomplete_reason(path: str | os.PathLike) -> str | None:
    """Why a checkpoint folder is not complete (see the module docstring for the rule), or None when it is.

    Args:
        path: A checkpoint folder.

    Returns:
        A short reason: ``"no trainer_state.json"``, ``"trainer_state.json does not parse"``, ``"no model
        weights"``, ``"model.safetensors is truncated"``, ``"<file> cannot be read (...)"``; or None.
    """
    state_file = os.path.join(path, TRAINER_STATE_NAME)
    if not os.path.isfile(state_file):
        return f"no {TRAINER_STATE_NAME}"
    try:
        with open(state_file, encoding="utf-8") as f:
            json.load(f)
    except (OSError, ValueError):
        return f"{TRAINER_STATE_NAME} does not parse"
    if not has_model_weights(path):
        return "no model weights"
    for name in sorted(os.listdir(path)):
        # HF's FSDP SHARDED_STATE_DICT folders (`pytorch_model_fsdp_0/`, `optimizer_0/`): complete with `.metadata`.
        if name.startswith(_DCP_FOLDER_PREFIXES) and \
                os.path.isdir(os.path.join(path, name)) and not _dcp_complete(os.path.join(path, name)):
            return f"{name}/ has no {DCP_METADATA_NAME}"
    for root, _, files in os.walk(path):
        for name in files:
            file = os.path.join(root, name)
            try:
                if _truncated(file):
                    return f"{os.path.relpath(file, path)} is truncated"
            except OSError as err:
                return f"{os.path.relpath(file, path)} cannot be read ({err.strerror or err})"
    return None


def _dcp_complete(folder: str) -> bool:
    """Whether ``folder`` is a torch.distributed.checkpoint folder whose save finished (its ``.metadata`` exists)."""
    return os.path.isfile(os.path.join(folder, DCP_METADATA_NAME))


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """Tell whether a checkpoint folder was fully written (see :func:`incomplete_reason`).

    Args:
        path: A checkpoint folder.

    Returns:
        True for a directory with a ``trainer_state.json`` that parses, model weights and no truncated file.
    """
    return incomplete_reason(path) is None


_ZIP_LOCAL_HEADER = b"PK\x03\x04"
_ZIP_END_OF_DIRECTORY = b"PK\x05\x06"
# The end-of-directory record is 22 bytes plus a comment of at most 65535 bytes.
_ZIP_TAIL = 22 + 65535


def _truncated(file: str) -> bool:
    size = os.path.getsize(file)
    if size == 0:
        return True
    if file.endswith(".safetensors"):
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return True
            header_len = int.from_bytes(head, "little")
            if 8 + header_len > size:
                return True
            try:
                header = json.loads(f.read(header_len))
            except ValueError:
                return True
        ends = [entry["data_offsets"][1] for key, entry in header.items()
                if key != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry]
        return 8 + header_len + max(ends, default=0) > size
    if file.endswith((".pt", ".pth", ".bin")):
        with open(file, "rb") as f:
            if f.read(4) != _ZIP_LOCAL_HEADER:
                return False  # a legacy (non-zip) pickle: nothing cheap to check
            f.seek(max(0, size - _ZIP_TAIL))
            return _ZIP_END_OF_DIRECTORY not in f.read()
    return False
