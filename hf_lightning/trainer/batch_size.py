"""``auto_find_batch_size``: which errors mean "too big", and the next batch size to try.

HF's ``Trainer.train()`` runs its training loop through accelerate's ``find_executable_batch_size``: after an
out-of-memory error it frees memory and runs the whole loop again with ``int(0.9 * batch_size)``, until a run
finishes or the size reaches zero. The facade does the same around Lightning's ``fit`` (one ``fit`` per attempt).
These are the rules it follows, with no Lightning and no accelerate.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from hf_lightning.checkpointing.layout import TRAINER_STATE_NAME
from hf_lightning.state import TrainerState

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments

__all__ = [
    "EVAL_OUT_OF_MEMORY",
    "NO_BATCH_SIZE_LEFT",
    "next_batch_size",
    "release_device_memory",
    "saved_train_batch_size",
    "should_reduce_batch_size",
    "training_batch_size",
]

NO_BATCH_SIZE_LEFT = "No executable batch size found, reached zero."
EVAL_OUT_OF_MEMORY = (
    "Evaluation hit an out-of-memory error. `auto_find_batch_size` only adjusts the training batch size, "
    "reduce `per_device_eval_batch_size` instead."
)

# The words of the errors accelerate retries on: CUDA/HIP/XPU, MPS, cuDNN, CPU and HPU allocation failures.
_OUT_OF_MEMORY_WORDS = (
    " out of memory.",
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",
)


def should_reduce_batch_size(error: BaseException) -> bool:
    """Whether ``error`` is one accelerate retries with a smaller batch.

    Only a ``RuntimeError`` (``torch.OutOfMemoryError`` is one) with a single message argument holding one of
    the allocators' out-of-memory phrases counts, so ``torch.OutOfMemoryError("boom")`` does not.
    """
    if not isinstance(error, RuntimeError) or len(error.args) != 1 or not isinstance(error.args[0], str):
        return False
    return any(words in error.args[0] for words in _OUT_OF_MEMORY_WORDS)


def next_batch_size(batch_size: int) -> int:
    """accelerate's reduction: 90% of the size, rounded down (8 → 7 → 6 → 5 → 4 → 3 → 2 → 1 → 0)."""
    return int(batch_size * 0.9)


def release_device_memory() -> None:
    """Collect garbage and return the accelerator's cached blocks, between attempts (as accelerate does)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextmanager
def training_batch_size(args: TrainingArguments, batch_size: int) -> Iterator[None]:
    """Train with ``batch_size`` as ``args.train_batch_size`` (HF's ``Trainer._train_batch_size``), then put the
    arguments back as they were.

    Everything that sizes the training batches (the loader, the plan, ``state.train_batch_size``) reads
    ``args.train_batch_size``, so the per-device size is changed for the attempt.
    """
    original = args.per_device_train_batch_size
    args.per_device_train_batch_size = batch_size // max(1, args.n_gpu)
    try:
        yield
    finally:
        args.per_device_train_batch_size = original


def saved_train_batch_size(checkpoint: str | None) -> int | None:
    """The ``train_batch_size`` a checkpoint's ``trainer_state.json`` recorded, or None.

    With ``auto_find_batch_size``, HF resumes at the size the interrupted run had found.
    """
    path = os.path.join(checkpoint, TRAINER_STATE_NAME) if checkpoint else None
    if path is None or not os.path.isfile(path):
        return None
    return TrainerState.load_from_json(path).train_batch_size


def search_batch_size(args: TrainingArguments, checkpoint: str | None, attempt: Callable[[], Any],
                      after_failure: Callable[[], None]) -> Any:
    """HF's ``find_executable_batch_size`` around a whole training: ``attempt()`` again with a smaller batch.

    The first attempt uses the batch size a resumed checkpoint recorded, else ``args.train_batch_size``; after an
    out-of-memory error (:func:`should_reduce_batch_size`) ``after_failure()`` undoes what the failed attempt left on
    the model, device memory is released and the next size is tried (accelerate's 0.9x step).

    Returns:
        What the first successful ``attempt()`` returns.

    Raises:
        RuntimeError: HF's "reached zero" error when no size fits; any error that is not an out-of-memory one.
    """
    batch_size = saved_train_batch_size(checkpoint) or args.train_batch_size
    release_device_memory()
    while batch_size > 0:
        try:
            with training_batch_size(args, batch_size):
                return attempt()
        except RuntimeError as error:
            if not should_reduce_batch_size(error):
                raise
        after_failure()
        release_device_memory()
        batch_size = next_batch_size(batch_size)
    raise RuntimeError(NO_BATCH_SIZE_LEFT)
