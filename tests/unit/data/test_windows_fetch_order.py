"""The window loader fetches micro-batches in the order of HF's loader (accelerate's ``DataLoaderShard``, one
micro-batch ahead, pulled a window at a time by ``Trainer.get_batch_samples``)."""

from __future__ import annotations

import pytest
import torch

from hf_lightning.data.windows import WindowedLoader


def _loader(log: list, n: int = 10, batch_size: int = 2) -> torch.utils.data.DataLoader:
    def collate(rows):
        log.append(f"fetch {rows[0] // batch_size}")
        return rows

    return torch.utils.data.DataLoader(list(range(n)), batch_size=batch_size, collate_fn=collate)


def _hf_order(ga: int) -> list[str]:
    """What HF 5.23 does: one epoch of ``get_batch_samples`` windows over a prepared ``DataLoaderShard``."""
    from accelerate.data_loader import DataLoaderShard

    log: list[str] = []
    base = _loader(log)
    shard = DataLoaderShard(base.dataset, batch_size=2, collate_fn=base.collate_fn)
    iterator = iter(shard)
    windows = -(-len(shard) // ga)
    for w in range(windows):
        size = ga if w < windows - 1 else len(shard) - ga * (windows - 1)
        batches = [next(iterator) for _ in range(size)]
        log.append(f"step {len(batches)}")
    return log


@pytest.mark.parametrize("ga", [1, 2, 3])
def test_windows_fetch_like_accelerate(ga):
    log: list[str] = []
    for window in WindowedLoader(_loader(log), ga):
        log.append(f"step {len(window)}")
    assert log == _hf_order(ga)
    # The look-ahead: the first step runs after the next window's first micro-batch was fetched (5 batches).
    assert log.index(f"fetch {ga}") < log.index(f"step {min(ga, 5)}")
