"""Iterable data under several processes (``data/dispatch.py``), without processes: process 0's broadcasts are
recorded and replayed to the others."""

import pytest
import torch

from hf_lightning.data.dispatch import DispatchedLoader, IterableShard


class CountingLoader:
    """Batches of ``{"x": rows}`` (rows numbered from 0); counts iterators created and batches read."""

    def __init__(self, sizes):
        self.sizes, self.iterators, self.reads = sizes, 0, 0

    def __iter__(self):
        self.iterators += 1
        return self._batches()

    def _batches(self):
        start = 0
        for size in self.sizes:
            self.reads += 1
            yield {"x": torch.arange(start, start + size)}
            start += size


def dispatched(sizes, world, **kwargs):
    """Every process's batches (as lists of row numbers) and each process's loader."""
    sent = []

    def record(obj):
        sent.append(obj)
        return obj

    loaders = [CountingLoader(sizes) for _ in range(world)]
    out = [[b["x"].tolist() for b in DispatchedLoader(loaders[0], record, 0, world, **kwargs)]]
    for rank in range(1, world):
        replay = iter(sent)
        out.append([b["x"].tolist() for b in DispatchedLoader(loaders[rank], lambda _: next(replay), rank, world,
                                                               **kwargs)])
    return out, loaders


@pytest.mark.parametrize(("sizes", "expected"), [
    # 19 rows, batch 2: rounds of 4 rows, the last one 3 rows, completed with the first round's first row.
    ([2] * 9 + [1], [[[0, 1], [4, 5], [8, 9], [12, 13], [16, 17]], [[2, 3], [6, 7], [10, 11], [14, 15], [18, 0]]]),
    # The last round is one short batch of 2: split evenly, nothing added.
    ([2, 2, 2], [[[0, 1], [4]], [[2, 3], [5]]]),
    # The data ends with a whole round: nothing added.
    ([2, 2, 2, 2], [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]),
    # A last round of 3 + 1 rows... (batch 3): 4 rows, 2 each.
    ([3, 3, 3, 1], [[[0, 1, 2], [6, 7]], [[3, 4, 5], [8, 9]]]),
    # A single short batch of 1: completed with its own first row.
    ([1], [[[0]], [[0]]]),
])
def test_process_0_reads_and_each_process_gets_its_slice(sizes, expected):
    out, loaders = dispatched(sizes, 2)
    assert out == expected
    # Every process creates the loader's iterator (a DataLoader draws its base seed there); only process 0 reads.
    assert [loader.iterators for loader in loaders] == [1, 1]
    assert loaders[1].reads == 0


def test_split_batches_and_whole_batches():
    out, _ = dispatched([4, 4, 3], 2, split_batches=True)
    assert out == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [10, 0]]]
    out, _ = dispatched([2, 2, 1], 2, whole=True)
    assert out == [[[0, 1], [2, 3], [4]]] * 2


def test_batches_of_different_shapes_cannot_be_joined():
    class Ragged:
        def __iter__(self):
            yield {"x": torch.zeros(2, 3)}
            yield {"x": torch.zeros(2, 5)}

    with pytest.raises(RuntimeError, match="dispatch_batches"):
        list(DispatchedLoader(Ragged(), lambda obj: obj, 0, 2))


@pytest.mark.parametrize(("n", "batch", "split"), [(19, 2, False), (16, 2, False), (7, 4, True), (3, 2, False)])
def test_iterable_shard_is_accelerates(n, batch, split):
    from accelerate.data_loader import IterableDatasetShard

    rows = list(range(n))
    for rank in range(2):
        ours = list(IterableShard(rows, batch, 2, rank, split_batches=split))
        theirs = list(IterableDatasetShard(rows, batch_size=batch, num_processes=2, process_index=rank,
                                           split_batches=split))
        assert ours == theirs


class EpochStream(torch.utils.data.IterableDataset):
    """Rows that depend on the epoch last passed to ``set_epoch`` (a shuffled ``datasets`` stream does so)."""

    def __init__(self):
        self.epochs = []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __iter__(self):
        yield from ({"x": torch.tensor([10 * self.epochs[-1] + i])} for i in range(3))


def test_each_pass_hands_the_dataset_its_number():
    stream = EpochStream()
    loader = DispatchedLoader(torch.utils.data.DataLoader(stream, batch_size=1), lambda obj: obj, 0, 2)
    passes = [[b["x"].tolist() for b in loader] for _ in range(2)]
    assert passes == [[[[0]], [[2]]], [[[10]], [[12]]]]
    shard_stream = EpochStream()
    shard = IterableShard(shard_stream, 1, 2, 1)
    assert [[row["x"].item() for row in shard] for _ in range(2)] == [[1, 0], [11, 10]]
    assert stream.epochs == shard_stream.epochs == [0, 1]
