"""Seeding and determinism, as ``transformers.set_seed`` / ``enable_full_determinism`` do it.

The same seed gives the same ``random``, ``numpy`` and ``torch`` draws as HF's ``set_seed``, which is what
makes a run here comparable with one under HF's Trainer.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator

import numpy as np
import torch

__all__ = ["enable_full_determinism", "set_seed", "without_lightning_reseed"]

# Accelerator backends besides CUDA that keep their own generators; seeded only when present and usable.
_EXTRA_DEVICE_BACKENDS = ("mlu", "musa", "npu", "hpu", "xpu")

_MAX_SEED = 2**32 - 1


def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed Python's ``random``, NumPy, torch (CPU) and every available accelerator.

    Args:
        seed: Integer (Python or NumPy) in ``[0, 2**32 - 1]`` (NumPy's limit).
        deterministic: Also call ``torch.use_deterministic_algorithms(True)``; can slow training down.

    Raises:
        TypeError: ``seed`` is not an integer.
        ValueError: ``seed`` is outside ``[0, 2**32 - 1]``.
    """
    seed = _check_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    # Safe without CUDA: the call is queued until CUDA is initialised.
    torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
    for name in _EXTRA_DEVICE_BACKENDS:
        backend = getattr(torch, name, None)
        is_available = getattr(backend, "is_available", None)
        if is_available is not None and is_available():
            backend.manual_seed_all(seed)


def enable_full_determinism(seed: int, warn_only: bool = False) -> None:
    """Seed everything and switch torch to deterministic algorithms, for reproducible (distributed) runs.

    Sets the environment variables CUDA, cuBLAS, Ascend NPUs and flash-attention need for deterministic kernels
    (``CUDA_LAUNCH_BLOCKING``, ``CUBLAS_WORKSPACE_CONFIG``, ``ASCEND_LAUNCH_BLOCKING``, ``HCCL_DETERMINISTIC``,
    ``FLASH_ATTENTION_DETERMINISTIC``), enables ``torch.use_deterministic_algorithms`` and makes cuDNN
    deterministic with benchmarking off.

    Args:
        seed: Integer in ``[0, 2**32 - 1]``.
        warn_only: Warn instead of raising when an operation has no deterministic implementation.

    Raises:
        TypeError: ``seed`` is not an integer.
        ValueError: ``seed`` is outside ``[0, 2**32 - 1]``.
    """
    set_seed(seed)
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"
    os.environ["ASCEND_LAUNCH_BLOCKING"] = "1"
    os.environ["HCCL_DETERMINISTIC"] = "1"
    os.environ["FLASH_ATTENTION_DETERMINISTIC"] = "1"
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__} {seed!r}; pass e.g. seed=42.")
    if not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed must be in [0, 2**32 - 1] (NumPy's limit), got {seed}; pick a seed in that range.")
    # NumPy integers are fine for numpy and torch but not for Python's `random`.
    return int(seed)


#: What ``lightning.seed_everything`` leaves in the environment; Lightning's distributed strategies seed every process
#: with it again when they set up (``reset_seed``), and its child processes inherit it.
_LIGHTNING_SEED_VARIABLES = ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")


@contextlib.contextmanager
def without_lightning_reseed() -> Iterator[None]:
    """Keep the random state HF's ``Trainer`` gives a run while Lightning runs it.

    An earlier ``lightning.seed_everything`` in the process (the user's, or any Lightning code's) leaves
    ``PL_GLOBAL_SEED`` set; a distributed strategy then seeds every process with it when the fit sets up, after HF's
    seeding, so the dropout masks (and a random collator's draws) would not be HF's. HF's Trainer does no such thing;
    the variables are hidden for the call and put back after it.
    """
    saved = {name: os.environ.pop(name) for name in _LIGHTNING_SEED_VARIABLES if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)
