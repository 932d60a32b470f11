"""Random number generator states in a checkpoint (``rng_state.pth`` / ``rng_state_{rank}.pth``).

The file holds the same dict HF's Trainer writes: ``python`` (``random.getstate()``), ``numpy``
(``np.random.get_state()``), ``cpu`` (torch's CPU generator) and, when present, one entry per accelerator
(``cuda``, ``npu``, ``hpu``, ``mlu``, ``musa``). Files written by HF load here and the other way round.

Loading never unpickles arbitrary objects: the file is read with ``torch.load(weights_only=True)``, widened by
exactly the NumPy globals a ``np.random.get_state()`` tuple needs
(:func:`~hf_lightning.checkpointing.safe_load.rng_safe_globals`), so files written with NumPy 1.x or 2.x load with
either.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import numpy as np
import torch

from hf_lightning.checkpointing.errors import CheckpointLoadError
from hf_lightning.checkpointing.layout import rng_file_name
from hf_lightning.checkpointing.safe_load import rng_safe_globals, safe_torch_load

__all__ = ["apply_rng_state", "capture_rng_state", "restore_rng_state"]

logger = logging.getLogger(__name__)

# Accelerators besides CUDA whose generators HF also stores, under these keys.
_EXTRA_DEVICE_KEYS = ("npu", "hpu", "mlu", "musa")


def _device_modules() -> dict[str, Any]:
    """Map each available accelerator key to its torch module (``torch.cuda``, ``torch.npu``, ...)."""
    modules: dict[str, Any] = {}
    if torch.cuda.is_available():
        modules["cuda"] = torch.cuda
    for key in _EXTRA_DEVICE_KEYS:
        module = getattr(torch, key, None)
        is_available = getattr(module, "is_available", None)
        if is_available is not None and is_available():
            modules[key] = module
    return modules


def capture_rng_state(distributed: bool = False) -> dict[str, Any]:
    """Collect the current generator states, as HF's Trainer stores them.

    Args:
        distributed: Store every visible device's generator (``get_rng_state_all``), as HF does under
            distributed training; otherwise only the current device's.

    Returns:
        ``{"python", "numpy", "cpu"}`` plus one key per available accelerator (``"cuda"``, ...).
    """
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    for key, module in _device_modules().items():
        generator = getattr(module, "random", module)
        states[key] = generator.get_rng_state_all() if distributed else generator.get_rng_state()
    return states


def apply_rng_state(states: dict[str, Any]) -> None:
    """Set the generators from a dict made by :func:`capture_rng_state` (or read from an HF checkpoint).

    Accelerator states are restored best effort, as HF does: a device that cannot take the stored state (e.g. a
    different GPU count) gets an error log, not an exception, since training can go on, only not bit-identically.

    Args:
        states: The RNG dict; ``python``, ``numpy`` and ``cpu`` are required.

    Raises:
        KeyError: A required key is missing.
    """
    missing = [key for key in ("python", "numpy", "cpu") if key not in states]
    if missing:
        raise KeyError(f"RNG state is missing {missing}; expected the dict HF's Trainer writes to rng_state.pth.")
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    for key, module in _device_modules().items():
        if key not in states:
            continue
        generator = getattr(module, "random", module)
        stored = states[key]
        try:
            # A list means one state per device, written by a distributed run.
            if isinstance(stored, (list, tuple)):
                generator.set_rng_state_all(stored)
            else:
                generator.set_rng_state(stored)
        except Exception as err:  # noqa: BLE001 - any failure only costs bit-exactness, so log it and go on
            logger.error(
                "Could not restore the %s RNG state (%s); training continues but will not reproduce an "
                "uninterrupted run exactly.",
                key.upper(),
                err,
            )


def restore_rng_state(checkpoint_dir: str | os.PathLike, process_index: int = 0, world_size: int = 1) -> bool:
    """Restore the generators from a checkpoint's RNG file, as HF does on resume.

    Args:
        checkpoint_dir: A ``checkpoint-N`` folder.
        process_index: Global rank of this process (picks ``rng_state_{process_index}.pth`` when
            ``world_size > 1``).
        world_size: Number of processes in the resumed run.

    Returns:
        True when a file was found and applied; False (with an info log, as HF) when there is none, e.g. the
        checkpoint was written with ``save_only_model=True`` or with another number of processes.

    Raises:
        CheckpointLoadError: The file exists but is truncated, corrupt or holds objects other than RNG states.
    """
    path = os.path.join(checkpoint_dir, rng_file_name(process_index, world_size))
    if not os.path.isfile(path):
        logger.info(
            "No %s in %s: RNG states are not restored, so the resumed run will not reproduce an uninterrupted "
            "one exactly (was the checkpoint written with another number of processes, or with "
            "save_only_model=True?).",
            os.path.basename(path),
            checkpoint_dir,
        )
        return False
    states = safe_torch_load(path, extra_safe_globals=rng_safe_globals())
    if not isinstance(states, dict) or not {"python", "numpy", "cpu"} <= set(states):
        raise CheckpointLoadError(path, "it does not hold the python / numpy / cpu RNG states HF writes")
    apply_rng_state(states)
    return True
