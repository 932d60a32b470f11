"""Training and evaluation samplers that draw the same indices as HF's Trainer (transformers 5.23 + accelerate).

- :class:`SeedableRandomSampler`: accelerate's replacement for ``RandomSampler`` -- epoch ``e`` is
  ``torch.randperm(n)`` from a generator seeded with ``seed + e``, independent of the global RNG.
- :class:`LengthGroupedSampler` / :func:`get_length_grouped_indices`: ``train_sampling_strategy=
  "group_by_length"`` (4.x ``group_by_length=True``), shuffling with the global torch RNG unless given a
  generator; :func:`eval_length_grouped_sampler` is the seeded variant HF builds for evaluation.
- :class:`ShardedBatchSampler`: accelerate's round-robin of training batches over processes.
- :class:`EvalShardBatchSampler`: one process's share of an evaluation set (no repeats, unlike HF's).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

__all__ = [
    "EvalShardBatchSampler",
    "LengthGroupedSampler",
    "SeedableRandomSampler",
    "ShardedBatchSampler",
    "eval_length_grouped_sampler",
    "get_length_grouped_indices",
]


class SeedableRandomSampler(Sampler[int]):
    """A shuffling sampler whose order depends only on ``seed`` and the epoch (accelerate's sampler).

    Each pass yields ``torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))``. The epoch
    is read when iteration starts, so ``set_epoch`` may be called any time before. A pass that runs to the end
    moves to the next epoch by itself (as accelerate's does), so iterating twice without ``set_epoch`` gives
    epochs 0 and 1; Lightning and HF's Trainer call ``set_epoch`` before every epoch anyway.

    Args:
        data_source_or_len: The dataset (anything with ``len``) or its length.
        seed: Base seed. ``None`` takes ``torch.initial_seed()`` now, as accelerate does with no ``data_seed``
            (which is ``args.seed`` after HF's ``set_seed``).

    Example:
        >>> sampler = SeedableRandomSampler(4, seed=42)
        >>> sampler.set_epoch(1)
        >>> list(sampler) == torch.randperm(4, generator=torch.Generator().manual_seed(43)).tolist()
        True
    """

    def __init__(self, data_source_or_len: Sized | int, seed: int | None = None) -> None:
        if isinstance(data_source_or_len, bool) or not isinstance(data_source_or_len, (int, Sized)):
            raise TypeError(
                f"SeedableRandomSampler needs a dataset with __len__ or an int length, got "
                f"{type(data_source_or_len).__name__}."
            )
        self.num_samples = data_source_or_len if isinstance(data_source_or_len, int) else len(data_source_or_len)
        if self.num_samples < 0:
            raise ValueError(f"SeedableRandomSampler length must be >= 0, got {self.num_samples}.")
        self.seed = torch.initial_seed() if seed is None else int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next pass yields."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        # A generator function: nothing runs (and the epoch is not read) until the DataLoader starts the pass.
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.num_samples, generator=generator).tolist()
        self.epoch += 1

    def __len__(self) -> int:
        return self.num_samples


def get_length_grouped_indices(
    lengths: Sequence[int],
    batch_size: int,
    mega_batch_mult: int | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Shuffle indices so that each run of ``batch_size`` holds items of similar length (HF's grouping).

    The indices are shuffled with ``torch.randperm`` (global RNG when ``generator`` is None), cut into
    mega-batches of ``mega_batch_mult * batch_size`` (default ``min(len // (4 * batch_size), 50)``, at least 1),
    each sorted by decreasing length; finally the longest item overall is swapped to the very front so an
    out-of-memory error shows up on the first batch.

    Args:
        lengths: Length of each item.
        batch_size: Items per batch.
        mega_batch_mult: Batches per mega-batch.
        generator: Generator for the shuffle.

    Returns:
        A permutation of ``range(len(lengths))``.
    """
    if mega_batch_mult is None:
        mega_batch_mult = max(min(len(lengths) // (batch_size * 4), 50), 1)
    order = torch.randperm(len(lengths), generator=generator)
    size = mega_batch_mult * batch_size
    chunks = [order[start : start + size].tolist() for start in range(0, len(lengths), size)]
    # `sorted` is stable, so equal lengths keep their shuffled order, exactly as in HF.
    chunks = [sorted(chunk, key=lambda i: lengths[i], reverse=True) for chunk in chunks]
    heads = torch.tensor([lengths[chunk[0]] for chunk in chunks])
    longest = int(torch.argmax(heads).item())
    chunks[0][0], chunks[longest][0] = chunks[longest][0], chunks[0][0]
    return [index for chunk in chunks for index in chunk]


def _lengths_from_dataset(dataset: Any, model_input_name: str | None) -> list[int]:
    name = model_input_name if model_input_name is not None else "input_ids"
    first = dataset[0] if len(dataset) > 0 else None
    if not isinstance(first, Mapping) or name not in first:
        raise ValueError(
            f"Cannot infer lengths: the dataset's items must be dicts holding {name!r}. Pass `lengths=` "
            "(or a `length` column via length_column_name), or set model_input_name to the key holding the inputs."
        )
    return [len(item[name]) for item in dataset]


class LengthGroupedSampler(Sampler[int]):
    """Shuffle while keeping items of similar length together (HF's ``LengthGroupedSampler``).

    Every pass calls :func:`get_length_grouped_indices` again, drawing from ``generator`` (or the global torch
    RNG when it is None, exactly as HF's training sampler does).

    Args:
        batch_size: Items per batch; HF passes ``train_batch_size * gradient_accumulation_steps``.
        dataset: Dataset of dicts to read lengths from (``len(item[model_input_name])``), when no ``lengths``.
        lengths: Length of each item (a list or a 1-D tensor).
        model_input_name: Key holding the inputs, default ``"input_ids"``.
        generator: Generator for the shuffle.

    Raises:
        ValueError: Neither ``dataset`` nor ``lengths``, a non-positive ``batch_size``, or items without the
            input key.
    """

    def __init__(
        self,
        batch_size: int,
        dataset: Any | None = None,
        lengths: Sequence[int] | torch.Tensor | None = None,
        model_input_name: str | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if dataset is None and lengths is None:
            raise ValueError("LengthGroupedSampler needs `dataset` or `lengths`; pass one of them.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"LengthGroupedSampler batch_size must be a positive int, got {batch_size!r}.")
        self.batch_size = batch_size
        if lengths is None:
            lengths = _lengths_from_dataset(dataset, model_input_name)
        elif isinstance(lengths, torch.Tensor):
            lengths = lengths.tolist()
        self.lengths = list(lengths)
        self.generator = generator

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        return iter(get_length_grouped_indices(self.lengths, self.batch_size, generator=self.generator))


def eval_length_grouped_sampler(
    batch_size: int,
    seed: int,
    dataset: Any | None = None,
    lengths: Sequence[int] | torch.Tensor | None = None,
    model_input_name: str | None = None,
) -> LengthGroupedSampler:
    """The length-grouped sampler HF builds for evaluation when training groups by length.

    HF makes a new one, with a fresh generator seeded ``args.data_seed`` (or ``args.seed``), every time it
    builds an eval dataloader; so each evaluation sees the same order. Reusing one sampler for several passes
    continues its generator instead.

    Args:
        batch_size: ``args.eval_batch_size``.
        seed: ``args.data_seed`` if set, else ``args.seed``.
        dataset: See :class:`LengthGroupedSampler`.
        lengths: See :class:`LengthGroupedSampler`.
        model_input_name: See :class:`LengthGroupedSampler`.

    Returns:
        A :class:`LengthGroupedSampler` with its own seeded generator.
    """
    return LengthGroupedSampler(
        batch_size,
        dataset=dataset,
        lengths=lengths,
        model_input_name=model_input_name,
        generator=torch.Generator().manual_seed(seed),
    )


class ShardedBatchSampler:
    """Deal a batch sampler's batches round-robin over processes, as HF's Trainer does through accelerate.

    Batch ``i`` of the (identical on every process) batch sequence goes to process ``i % num_processes``.
    With ``even_batches`` (accelerate's default) and ``drop_last=False`` every process gets the same number of
    full batches: the last, incomplete round is completed with indices cycled from the start of the sequence
    (evaluation later drops those duplicates). With ``drop_last=True`` an incomplete last round is dropped.

    Args:
        batch_sampler: yields lists of indices of ``batch_size`` (the last one may be shorter).
        num_processes: data-parallel world size.
        process_index: this process's rank.
        even_batches: complete the last round so that every process gets the same number of batches.
    """

    def __init__(self, batch_sampler: Any, num_processes: int, process_index: int, even_batches: bool = True,
                 split_batches: bool = False) -> None:
        if not 0 <= process_index < num_processes:
            raise ValueError(f"process_index must be in [0, {num_processes}), got {process_index}.")
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.even_batches = even_batches
        self.split_batches = split_batches
        self.batch_size = batch_sampler.batch_size
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False))
        if split_batches and self.batch_size % num_processes:
            raise ValueError(
                f"accelerator_config['split_batches']=True splits each batch of per_device_train_batch_size="
                f"{self.batch_size} over {num_processes} processes: make the batch size a multiple of {num_processes}."
            )

    @property
    def sampler(self) -> Any:
        # Lightning's set_epoch reaches the shuffling sampler through dl.batch_sampler.sampler.
        return getattr(self.batch_sampler, "sampler", None)

    def __len__(self) -> int:
        total, world = len(self.batch_sampler), self.num_processes
        if self.split_batches:
            return total
        if total % world == 0 or self.drop_last:
            return total // world
        if self.even_batches:
            return total // world + 1
        return total // world + (1 if self.process_index < total % world else 0)

    def __iter__(self) -> Iterator[list[int]]:
        if self.split_batches:
            yield from self._split()
            return
        world, rank, size = self.num_processes, self.process_index, self.batch_size
        head: list[int] = []  # indices of the first round, reused to complete the last one
        mine = None
        idx = -1
        batch: list[int] = []
        for idx, batch in enumerate(self.batch_sampler):
            if not self.drop_last and idx < world:
                head += batch
            if idx % world == rank:
                mine = batch
            if idx % world == world - 1 and len(batch) == size:
                yield mine
                mine = None
        if self.drop_last or not head:
            return
        if not self.even_batches:
            if mine:
                yield mine
            return
        if mine and len(mine) == size:
            yield mine
        while len(head) < world * size:
            head += head
        if len(batch) == size:
            batch = []
            idx += 1
        cursor = 0
        while idx % world != 0 or batch:
            end = cursor + size - len(batch)
            batch = batch + head[cursor:end]
            if idx % world == rank:
                yield batch
            cursor = end
            batch = []
            idx += 1

    def _split(self) -> Iterator[list[int]]:
        # accelerate's split_batches: every process walks the same batches and takes its 1/world slice of each.
        # An incomplete last batch is completed from the first batch (even_batches), handed out as far as it goes
        # (not even), or dropped (drop_last).
        size, piece = self.batch_size, self.batch_size // self.num_processes
        lo, hi = piece * self.process_index, piece * (self.process_index + 1)
        first: list[int] = []
        last: list[int] = []
        for i, batch in enumerate(self.batch_sampler):
            if i == 0:
                first = list(batch)
            last = list(batch)
            if len(batch) == size:
                yield last[lo:hi]
        if self.drop_last or not first or len(last) == size:
            return
        if not self.even_batches:
            if len(last) > lo:
                yield last[lo:hi]
            return
        filler = first
        while len(filler) < size:
            filler = filler + filler
        yield (last + filler)[lo:hi]

class EvalShardBatchSampler:
    """One process's share of an evaluation set, cut into batches where one process would cut them.

    The positions of ``sampler``'s sequence (after ``drop_last`` drops an incomplete last batch) are split into
    ``num_processes`` contiguous runs, the first ``n % num_processes`` one position longer, so no process gets more
    than ``ceil(n / num_processes)`` examples and none is repeated (HF's accelerate instead completes the last
    round with examples from the start). Each run is cut at the multiples of ``batch_size``: every batch is a
    one-process batch or, where a run starts or ends inside one, a part of it. Concatenating the processes'
    results in rank order gives the one-process order.

    Args:
        sampler: the evaluation sampler (its order is the order results come back in).
        batch_size: the per-device evaluation batch size.
        drop_last: drop the incomplete last batch of the whole set, as one process would.
        num_processes: data-parallel world size.
        process_index: this process's rank.

    Example:
        >>> [list(EvalShardBatchSampler(range(10), 4, False, 2, rank)) for rank in (0, 1)]
        [[[0, 1, 2, 3], [4]], [[5, 6, 7], [8, 9]]]
    """

    def __init__(self, sampler: Any, batch_size: int, drop_last: bool, num_processes: int,
                 process_index: int) -> None:
        if not 0 <= process_index < num_processes:
            raise ValueError(f"process_index must be in [0, {num_processes}), got {process_index}.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index

    def num_positions(self) -> int:
        """How many examples the whole evaluation covers (over all processes)."""
        n = len(self.sampler)
        return n - n % self.batch_size if self.drop_last else n

    def batch_bounds(self, rank: int) -> list[tuple[int, int]]:
        """``(start, stop)`` positions of each batch of process ``rank``."""
        base, extra = divmod(self.num_positions(), self.num_processes)
        start = rank * base + min(rank, extra)
        stop = start + base + (1 if rank < extra else 0)
        bounds = []
        while start < stop:
            end = min(stop, (start // self.batch_size + 1) * self.batch_size)
            bounds.append((start, end))
            start = end
        return bounds

    def batch_ids(self, rank: int) -> list[int]:
        """The one-process batch each of process ``rank``'s batches belongs to (or is a part of)."""
        return [start // self.batch_size for start, _ in self.batch_bounds(rank)]

    def __len__(self) -> int:
        return len(self.batch_bounds(self.process_index))

    def __iter__(self) -> Iterator[list[int]]:
        bounds = self.batch_bounds(self.process_index)
        if not bounds:
            return
        first, last = bounds[0][0], bounds[-1][1]
        # Only this process's run of the sequence is kept (the sampler is read up to its end, no further).
        mine = list(itertools.islice(iter(self.sampler), first, last))
        for start, stop in bounds:
            yield mine[start - first: stop - first]
