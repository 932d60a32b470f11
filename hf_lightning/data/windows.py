"""Gradient-accumulation windows: one Lightning batch = one HF optimizer step.

HF 5.x fetches a whole accumulation window before the first forward so that ``num_items_in_batch`` can be
summed over the window. Lightning hands ``training_step`` one item per batch, so this wrapper makes each item a
list of up to ``GA`` collated micro-batches, cut per epoch exactly like HF (the last window of an epoch holds
``L % GA`` batches, or ``GA`` when that is 0).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from typing import Any


class WindowedLoader:
    """Iterable of gradient-accumulation windows over a per-micro-batch loader.

    Args:
        loader: the per-micro-batch iterable (usually a ``torch.utils.data.DataLoader``).
        gradient_accumulation_steps: micro-batches per window.
        skip_windows: windows to skip at the start of the *next* iteration only (mid-epoch resume). The skipped
            windows' batches are fetched and dropped so that the sampler order stays HF's.
    """

    def __init__(self, loader: Iterable, gradient_accumulation_steps: int, skip_windows: int = 0) -> None:
        if gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}.")
        self.loader = loader
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.skip_windows = skip_windows

    # Lightning calls ``set_epoch`` on ``dl.sampler`` / ``dl.batch_sampler.sampler`` of the object it iterates
    # (``_set_sampler_epoch``); exposing the inner loader's makes the seeded shuffle follow the epoch.
    @property
    def sampler(self) -> Any:
        return getattr(self.loader, "sampler", None)

    @property
    def batch_sampler(self) -> Any:
        return getattr(self.loader, "batch_sampler", None)

    @property
    def dataset(self) -> Any:
        return getattr(self.loader, "dataset", None)

    def micro_batches(self) -> int | None:
        """``len(loader)``, or ``None`` when the loader has no length."""
        try:
            return len(self.loader)  # type: ignore[arg-type]
        except TypeError:
            return None

    def __len__(self) -> int:
        n = self.micro_batches()
        if n is None:
            # Lightning's ``sized_len`` treats a TypeError as "no length" (an iterable dataset).
            raise TypeError("the wrapped loader has no length")
        return max(math.ceil(n / self.gradient_accumulation_steps), 1) if n else 0

    def state_dict(self) -> dict:
        # Lightning treats a loader with state_dict/load_state_dict as resumable (no mid-epoch warning); the
        # resume position itself comes from the HF checkpoint through ``skip_windows``.
        return {"skip_windows": self.skip_windows}

    def load_state_dict(self, state: dict) -> None:
        self.skip_windows = int(state.get("skip_windows", 0))

    def __iter__(self) -> Iterator[list | PendingWindow]:
        # A generator: nothing below runs (no sampler epoch read, no iterator created) until the first window
        # is requested, after Lightning has called set_epoch.
        skip, self.skip_windows = self.skip_windows, 0
        ga = self.gradient_accumulation_steps
        source, dropped = _skip_windows(self.loader, skip, ga)
        if self.micro_batches() is None:
            yield from _pending_windows(source, ga, dropped)
            return
        window: list = []
        index = 0
        for batch in one_batch_ahead(source):
            window.append(batch)
            if len(window) == ga:
                if index >= dropped:
                    yield window
                index += 1
                window = []
        if window and index >= dropped:
            yield window


class PendingWindow:
    """A window of an unsized loader whose micro-batches are loaded only when :meth:`load` is called.

    Lightning reads a loader without a length one item ahead, to know which batch is the last. With ready-made
    windows that would load (and collate, and draw random numbers for) window ``k + 1`` before window ``k``'s
    forwards run, which HF never does. So an unsized loader hands out these handles and the datamodule's
    ``on_before_batch_transfer`` loads each one just before its step, where HF's ``get_batch_samples`` loads it.
    The last handle of an epoch may turn out empty: the data ended exactly at a window boundary.
    """

    def __init__(self, reader: _WindowReader) -> None:
        self._reader = reader
        self._batches: list | None = None

    @property
    def loaded(self) -> bool:
        return self._batches is not None

    def load(self) -> list:
        """The window's micro-batches (up to ``GA``; fewer at the end of the data, possibly none)."""
        if self._batches is None:
            self._batches = self._reader.next_window()
        return self._batches


class _WindowReader:
    """Reads consecutive windows from a one-ahead micro-batch iterator, dropping the first ``drop`` windows."""

    def __init__(self, source: Iterable, ga: int, drop: int) -> None:
        self._batches = one_batch_ahead(source)
        self._ga = ga
        self._drop = drop
        self.exhausted = False

    def next_window(self) -> list:
        while not self.exhausted:
            window = list(itertools.islice(self._batches, self._ga))
            self.exhausted = len(window) < self._ga
            if self._drop and window:
                self._drop -= 1
                continue
            return window
        return []


def _pending_windows(source: Iterable, ga: int, drop: int) -> Iterator[PendingWindow]:
    # Lightning asks for handle k + 1 before window k is loaded, so whether the data ends is known only one
    # handle late: the handle after the last window loads empty (the module steps nothing for it).
    reader = _WindowReader(source, ga, drop)
    while not reader.exhausted:
        yield PendingWindow(reader)


def load_window(batch: Any) -> Any:
    """``batch`` itself, or the micro-batches of a :class:`PendingWindow` (loaded now)."""
    return batch.load() if isinstance(batch, PendingWindow) else batch


def one_batch_ahead(loader: Iterable) -> Iterator:
    """``loader``'s batches, each handed out only once the next one is loaded (accelerate's ``DataLoaderShard``).

    HF's loader looks one micro-batch ahead to know which batch is the last, so a collator or dataset transform
    that draws random numbers draws for batch ``i + 1`` before batch ``i``'s forward (and its dropout) runs.
    Fetching in that order keeps every draw where HF makes it; the iterator is created on the first request.
    """
    iterator = iter(loader)
    try:
        current = next(iterator)
    except StopIteration:
        return
    for upcoming in iterator:
        yield current
        current = upcoming
    yield current


class _SkipBatchSampler:
    """Yields a batch sampler's index lists after the first ``skip`` (HF's ``skip_first_batches``)."""

    def __init__(self, batch_sampler: Any, skip: int) -> None:
        self.batch_sampler = batch_sampler
        self.skip = skip

    @property
    def sampler(self) -> Any:
        return getattr(self.batch_sampler, "sampler", None)

    def __iter__(self):
        for i, batch in enumerate(self.batch_sampler):
            if i >= self.skip:
                yield batch

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip, 0)


def _skip_windows(loader: Iterable, windows: int, ga: int) -> tuple[Iterable, int]:
    """The loader resumed ``windows`` windows in, and how many windows the caller must still drop.

    A map-style ``DataLoader`` skips by index (the skipped rows are never loaded or collated, so a collator that
    draws random numbers is not advanced); anything else is fetched and dropped window by window.
    """
    if windows == 0:
        return loader, 0
    from torch.utils.data import DataLoader, IterableDataset

    batch_sampler = getattr(loader, "batch_sampler", None)
    # A DataLoader over an IterableDataset has a batch sampler too, of no use for skipping.
    if isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset) \
            and batch_sampler is not None and hasattr(batch_sampler, "__len__"):
        kwargs = dict(
            batch_sampler=_SkipBatchSampler(batch_sampler, windows * ga),
            collate_fn=loader.collate_fn,
            num_workers=loader.num_workers,
            pin_memory=loader.pin_memory,
            worker_init_fn=loader.worker_init_fn,
            generator=loader.generator,
        )
        if loader.num_workers > 0:
            kwargs.update(persistent_workers=loader.persistent_workers, prefetch_factor=loader.prefetch_factor)
        return DataLoader(loader.dataset, **kwargs), 0
    return loader, windows
