"""``trainer/batch_size.py`` against accelerate's rules, which HF's ``auto_find_batch_size`` uses."""

from __future__ import annotations

import pytest
import torch
from accelerate.utils import memory

from hf_lightning.trainer.batch_size import next_batch_size, should_reduce_batch_size

ERRORS = [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"),
    torch.OutOfMemoryError("out of memory"),
    torch.OutOfMemoryError("boom"),
    RuntimeError("HIP out of memory. Tried to allocate 1 GiB"),
    RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"),
    RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if ..."),
    RuntimeError("[enforce fail at alloc_cpu.cpp:114] DefaultCPUAllocator: can't allocate memory: you tried"),
    RuntimeError("FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed"),
    RuntimeError("CUDA out of memory.", "two arguments"),
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    MemoryError("out of memory."),
    ValueError("CUDA out of memory."),
]


@pytest.mark.parametrize("error", ERRORS, ids=repr)
def test_should_reduce_batch_size_matches_accelerate(error):
    assert should_reduce_batch_size(error) == memory.should_reduce_batch_size(error)


def test_next_batch_size_matches_accelerate(monkeypatch):
    # accelerate runs gc.collect() between attempts: seconds in a test process; the sizes do not depend on it.
    monkeypatch.setattr(memory, "clear_device_cache", lambda *args, **kwargs: None)
    sizes, size = [], 64

    @memory.find_executable_batch_size(starting_batch_size=64)
    def record(batch_size):
        sizes.append(batch_size)
        raise torch.OutOfMemoryError("CUDA out of memory.")

    with pytest.raises(RuntimeError, match="No executable batch size found, reached zero."):
        record()
    ours = [size]
    while (size := next_batch_size(size)) > 0:
        ours.append(size)
    assert ours == sizes
