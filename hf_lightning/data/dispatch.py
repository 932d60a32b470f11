"""Iterable data under several processes, as HF's accelerate reads it: process 0 loads, every process gets its part.

With an ``IterableDataset`` HF (accelerate's ``dispatch_batches``, its default for iterable data) lets process 0
alone iterate the loader: it collates ``world`` batches per round, joins them, and sends the result to every
process, which keeps its own slice. So a collator or a streaming dataset that draws random numbers draws on process
0 only; the other processes' global RNG is touched by nothing but the loader's iterator, which every process
creates (a ``DataLoader`` iterator draws its base seed). The last, short round is completed with the first rows of
the first round so that every process gets the same number of rows (or dropped with ``dataloader_drop_last``).

With ``dispatch_batches=False`` every process reads the whole stream itself and keeps its share of every
``world * batch_size`` rows (:class:`IterableShard`, HF's ``IterableDatasetShard``), collating its own batches.

No Lightning: the collective is passed in (``obj -> process 0's obj``; :func:`broadcast_from_first`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import IterableDataset

from hf_lightning.evaluation import find_batch_size

__all__ = ["DispatchedLoader", "IterableShard", "broadcast_from_first"]


def broadcast_from_first(obj: Any) -> Any:
    """Process 0's ``obj`` on every process, over the default process group (which every strategy sets up)."""
    holder = [obj]
    torch.distributed.broadcast_object_list(holder, src=0)
    return holder[0]


def _join(batches: list[Any]) -> Any:
    first = batches[0]
    if isinstance(first, torch.Tensor):
        try:
            return torch.cat(batches, dim=0)
        except RuntimeError as error:
            raise RuntimeError(
                "An IterableDataset under several processes is read by process 0, which joins one batch per "
                "process: its batches must have the same shape beyond the first dimension (got "
                f"{[tuple(b.shape) for b in batches]}). Pad to a fixed length in the collator, or set "
                "accelerator_config={'dispatch_batches': False} so that each process collates its own batches."
            ) from error
    if isinstance(first, Mapping):
        return type(first)({key: _join([b[key] for b in batches]) for key in first})
    if isinstance(first, (list, tuple)):
        return type(first)(_join(list(parts)) for parts in zip(*batches))
    raise TypeError(f"Cannot send a {type(first).__name__} batch to other processes: a collated batch must hold "
                    "tensors (in dicts, lists or tuples).")


def _slice(batch: Any, start: int, stop: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, Mapping):
        return type(batch)({key: _slice(value, start, stop) for key, value in batch.items()})
    if isinstance(batch, (list, tuple)):
        return type(batch)(_slice(value, start, stop) for value in batch)
    return batch


class DispatchedLoader:
    """One process's batches of a loader that process 0 alone iterates (accelerate's ``DataLoaderDispatcher``).

    No length: the loader is an iterable one. Nothing is read ahead: the caller's one-batch look-ahead
    (:func:`~hf_lightning.data.windows.one_batch_ahead`) makes process 0 load round ``k + 1`` before round ``k``'s
    forward, where accelerate loads it.

    Args:
        loader: the per-batch loader (``batch_size`` = the per-device batch size); iterated on process 0 only.
        broadcast: ``obj -> process 0's obj`` on every process.
        rank: this process's index.
        world: the number of processes.
        drop_last: drop the short last round instead of completing it from the first round.
        split_batches: process 0 sends one batch per round, split between the processes (its size must be a
            multiple of ``world``), instead of ``world`` batches.
        whole: every process gets every batch as it is (HF's dispatched evaluation gives each one its slice and
            gathers them back; keeping the whole batch on every process gives the one-process numbers directly).
    """

    def __init__(self, loader: Iterable, broadcast: Callable[[Any], Any], rank: int, world: int,
                 drop_last: bool = False, split_batches: bool = False, whole: bool = False) -> None:
        self.loader = loader
        self.broadcast = broadcast
        self.rank = rank
        self.world = world
        self.drop_last = drop_last
        self.split_batches = split_batches
        self.whole = whole
        self.iteration = 0

    @property
    def dataset(self) -> Any:
        return getattr(self.loader, "dataset", None)

    def _set_dataset_epoch(self) -> None:
        # accelerate hands the pass number to a dataset that takes one (a shuffled ``datasets`` stream reshuffles).
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.iteration)

    def _fetch(self, iterator: Iterator) -> tuple[Any, bool] | None:
        """Process 0: the next round joined, and whether the data ended in it (``None``: nothing left)."""
        wanted = 1 if (self.whole or self.split_batches) else self.world
        batches = list(itertools.islice(iterator, wanted))
        ended = len(batches) < wanted
        if not batches or (ended and self.drop_last):
            return None
        return (batches[0] if len(batches) == 1 else _join(batches)), ended

    def __iter__(self) -> Iterator[Any]:
        self._set_dataset_epoch()
        # Every process creates the loader's iterator (as accelerate does since torch 2.0.1): a DataLoader draws
        # its base seed from the global RNG there, on each process.
        iterator = iter(self.loader)
        first_rows = None
        while True:
            payload = self.broadcast(self._fetch(iterator) if self.rank == 0 else None)
            if payload is None:
                break
            batch, ended = payload
            if self.whole:
                yield batch
                continue
            rows = find_batch_size(batch)
            if first_rows is None and not self.drop_last:
                first_rows = _slice(batch, 0, self.world)
            size = rows // self.world
            if rows % self.world and not self.drop_last:
                # accelerate completes the last round with the first round's first rows.
                batch = _join([batch, first_rows])
                size += 1
            yield _slice(batch, self.rank * size, (self.rank + 1) * size)
            if ended:
                break
        self.iteration += 1


class IterableShard(IterableDataset):
    """One process's rows of an iterable dataset every process reads whole (HF's ``IterableDatasetShard``).

    The stream is cut into runs of ``batch_size * world`` rows (``batch_size`` with ``split_batches``); process
    ``rank`` keeps the ``rank``-th ``batch_size`` (``batch_size / world``) of each. A short last run is completed
    by repeating the first run's rows, or dropped with ``drop_last``.
    """

    def __init__(self, dataset: Iterable, batch_size: int, world: int, rank: int, drop_last: bool = False,
                 split_batches: bool = False) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.world = world
        self.rank = rank
        self.drop_last = drop_last
        self.split_batches = split_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        # Inside a plain DataLoader nothing calls set_epoch: count the passes, as accelerate's loader does for it.
        self.set_epoch(self.epoch)
        generator = getattr(self.dataset, "generator", None)
        if not hasattr(self.dataset, "set_epoch") and isinstance(generator, torch.Generator):
            generator.manual_seed(self.epoch)  # as accelerate: every process reads the same stream
        run = self.batch_size if self.split_batches else self.batch_size * self.world
        share = run // self.world if self.split_batches else self.batch_size
        mine = range(self.rank * share, (self.rank + 1) * share)
        first: list | None = None
        current: list = []
        for row in self.dataset:
            current.append(row)
            if len(current) == run:
                yield from (current[i] for i in mine)
                if first is None:
                    first = list(current)
                current = []
        if current and not self.drop_last:
            first = list(current) if first is None else first
            while len(current) < run:
                current += first
            yield from (current[i] for i in mine)
        self.epoch += 1
