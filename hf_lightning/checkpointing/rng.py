"""Random number generator states in a checkpoint (``rng_state.pth`` / ``rng_state_{rank}.pth``).

The file holds the same dict HF's Trainer writes: ``python`` (``random.getstate()``), ``numpy``
(``np.random.get_state()``), ``cpu`` (torch's CPU generator) and, when present, one entry per accelerator
(``cuda``, ``npu``, ``hpu``, ``mlu``, ``musa``). Files written by HF load here and the other way round.

Loading never unpickles arbitrary objects: the file is read with ``torch.load(weights_only=True)``, widened by
exactly the NumPy globals a ``np.random.get_state()`` tuple needs (the array rebuild function, ``ndarray``,
``dtype`` and the ``uint32`` dtype class), under both their NumPy 1.x and 2.x import paths so files written
with either NumPy load with the other.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng_state", "rng_file_name", "restore_rng_state", "apply_rng_state", "rng_safe_globals"]

logger = logging.getLogger(__name__)

# Accelerators besides CUDA whose generators HF also stores, under these keys.
_EXTRA_DEVICE_KEYS = ("npu", "hpu", "mlu", "musa")


def rng_file_name(process_index: int = 0, world_size: int = 1) -> str:
    """Return the RNG file name HF uses for one process.

    Args:
        process_index: Global rank of the process.
        world_size: Number of processes in the run.

    Returns:
        ``"rng_state.pth"`` when ``world_size <= 1``, else ``"rng_state_{process_index}.pth"``.
    """
    return "rng_state.pth" if world_size <= 1 else f"rng_state_{process_index}.pth"


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


def rng_safe_globals() -> list[Any]:
    """Return the NumPy globals ``torch.load(weights_only=True)`` must accept to read an RNG file.

    Returns:
        A list for ``torch.serialization.safe_globals``: NumPy's array rebuild function under its NumPy 1.x and
        2.x names, ``np.ndarray``, ``np.dtype`` and the ``uint32`` dtype class (MT19937 keys are uint32).
    """
    core = getattr(np, "_core", None) or np.core
    reconstruct = core.multiarray._reconstruct
    allowed: list[Any] = [np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    # The pickle names the function by the path of the NumPy that wrote it; accept both spellings.
    for path in ("numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct"):
        allowed.append((reconstruct, path))
    return allowed


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
    # Imported here because format.py imports this module to write RNG files.
    from hf_lightning.checkpointing.format import CheckpointLoadError, safe_torch_load

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
