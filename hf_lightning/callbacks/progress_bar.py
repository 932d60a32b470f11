"""Lightning's progress bar (TQDM or Rich) on an HF run: one tick per optimizer step, ending at the real total.

One Lightning batch is one HF optimizer step (a gradient-accumulation window), so Lightning's training bar already
counts optimizer steps. Its total, though, is the epoch's full length (``trainer.num_training_batches``) unless
``max_epochs == -1``, so a run that ``max_steps`` ends mid-epoch stopped at "4/16", and a mid-epoch resume counted
the skipped windows too. :func:`set_train_bar_total` gives the bar the steps this epoch really runs; the flow
callback calls it at the epoch's first batch, after the bar has set up its epoch. The loss and learning rate on the
bar come from ``trainer.progress_bar_metrics`` (:mod:`hf_lightning.callbacks.lightning_metrics`).
"""

from __future__ import annotations

import math

import lightning.pytorch as pl
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar


def steps_this_epoch(trainer: pl.Trainer, windows_done: int) -> float:
    """Optimizer steps the current epoch runs from now: the windows left in it, capped by ``max_steps``.

    Args:
        trainer: the fitting trainer (at the epoch's first batch, ``global_step`` is the steps done before it).
        windows_done: windows of this epoch a mid-epoch resume skipped (0 otherwise).

    Returns:
        The count, or ``inf`` for an iterable dataset run without ``max_steps``.
    """
    total = float(trainer.num_training_batches) - windows_done
    if trainer.max_steps is not None and trainer.max_steps > 0:
        total = min(total, trainer.max_steps - trainer.global_step)
    return max(total, 0)


def set_train_bar_total(trainer: pl.Trainer, total: float) -> None:
    """Give the trainer's TQDM or Rich training bar ``total`` steps for the current epoch (other bars: no-op)."""
    if math.isinf(total):
        return
    bar = trainer.progress_bar_callback
    if bar is None or not bar.is_enabled:
        return
    total = int(total)
    if isinstance(bar, TQDMProgressBar):
        tqdm_bar = bar.train_progress_bar
        tqdm_bar.total = total
        tqdm_bar.refresh()
    elif isinstance(bar, RichProgressBar) and bar.progress is not None and bar.train_progress_bar_id is not None:
        bar.progress.update(bar.train_progress_bar_id, total=total)
