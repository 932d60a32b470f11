"""Gradient-accumulation windows: one Lightning batch = one HF optimizer step.

HF 5.x fetches a whole accumulation window before the first forward so that ``num_items_in_batch`` can be
summed over the window. Lightning hands ``training_step`` one item per batch, so this wrapper makes each item a
list of up to ``GA`` collated micro-batches, cut per epoch exactly like HF (the last window of an epoch holds
``L % GA`` batches, or ``GA`` when that is 0).
"""

from __future__ import annotations

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

    def __iter__(self) -> Iterator[list]:
        skip, self.skip_windows = self.skip_windows, 0
        ga = self.gradient_accumulation_steps
        window: list = []
        index = 0
        for batch in self.loader:
            window.append(batch)
            if len(window) == ga:
                if index >= skip:
                    yield window
                index += 1
                window = []
        if window and index >= skip:
            yield window
