"""HF's logs in Lightning's metric system: ``callback_metrics``, ``logged_metrics``, the progress bar, the loggers.

Every time HF's ``log`` runs (a training log, an evaluation, the end-of-training summary) its numbers are handed
to Lightning at once, so a Lightning callback that runs later in the same hook sees them:

- ``trainer.callback_metrics`` gets every number under HF's own key (``loss``, ``grad_norm``, ``learning_rate``,
  ``epoch``, ``eval_loss``, ``eval_<metric>``, ``eval_runtime``, ``train_loss``, ...), as a float64 tensor equal to
  the value in ``state.log_history``. These are the names ``ModelCheckpoint(monitor=...)``,
  ``EarlyStopping(monitor=...)`` and ``metric_for_best_model`` use; they contain no ``/``, so a ``ModelCheckpoint``
  filename such as ``"{step}-{eval_loss:.4f}"`` stays one file name (a ``/`` in a metric name would make a folder).
- The loggers (``report_to``'s and any the user gives the trainer) get the numbers under the names HF's
  ``TensorBoardCallback`` writes (``eval_x`` → ``eval/x``, ``test_x`` → ``test/x``, anything else ``train/x``) at
  ``state.global_step``, on rank 0; ``trainer.logged_metrics`` records what they got, as Lightning's own does.
- ``trainer.progress_bar_metrics`` gets ``loss``, ``learning_rate`` (as text in ``.3g``, which reads the same in
  the TQDM and the Rich bar) and ``eval_loss``.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from hf_lightning import _compat

#: The logged keys shown on Lightning's progress bar, in this order.
PROGRESS_BAR_KEYS = ("loss", "learning_rate", "eval_loss")


def numeric_logs(logs: dict[str, Any]) -> dict[str, float]:
    """The numbers of one HF log (booleans, strings and ``None`` are left out, as HF's TensorBoard callback does)."""
    return {k: v for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def tensorboard_names(scalars: dict[str, float]) -> dict[str, float]:
    """HF's ``TensorBoardCallback`` tags: ``eval_x`` → ``eval/x``, ``test_x`` → ``test/x``, others ``train/x``."""
    named = {}
    for key, value in scalars.items():
        for prefix in ("eval_", "test_"):
            if key.startswith(prefix):
                named[f"{prefix[:-1]}/{key[len(prefix):]}"] = value
                break
        else:
            named[f"train/{key}"] = value
    return named


def progress_bar_view(scalars: dict[str, float]) -> dict[str, float | str]:
    """What the progress bar shows of one log: the loss, the learning rate (as ``.3g`` text) and the eval loss."""
    view: dict[str, float | str] = {}
    for key in PROGRESS_BAR_KEYS:
        if key in scalars:
            # Rich formats numbers with ".3f" by default, which shows a 5e-05 learning rate as 0.000.
            view[key] = f"{scalars[key]:.3g}" if key == "learning_rate" else float(scalars[key])
    return view


def publish(trainer: pl.Trainer | None, logs: dict[str, Any], step: int) -> None:
    """Hand one HF log to the trainer's metric dicts and loggers (see the module docstring).

    Args:
        trainer: the ``lightning.Trainer`` of the fit the log belongs to; ``None`` (no fit yet) does nothing.
        logs: the values HF logged (``log_history``'s entry without ``step``).
        step: ``state.global_step``, the step the loggers record.
    """
    if trainer is None:
        return
    scalars = numeric_logs(logs)
    if not scalars:
        return
    named = tensorboard_names(scalars)
    _compat.publish_metrics(
        trainer,
        callback={k: torch.tensor(v, dtype=torch.float64) for k, v in scalars.items()},
        # Lightning records in logged_metrics only what reached a logger.
        logged={k: torch.tensor(v, dtype=torch.float64) for k, v in named.items()} if trainer.loggers else {},
        progress_bar=progress_bar_view(scalars),
    )
    if trainer.global_rank != 0:
        return
    for logger in trainer.loggers:
        logger.log_metrics(named, step=step)
