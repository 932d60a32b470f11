"""``report_to`` → Lightning loggers, resolved through one registry."""

from __future__ import annotations

import os
import socket
from datetime import datetime
from typing import Any, Callable

from lightning.pytorch.loggers import Logger


def _tensorboard_dir(args: Any) -> str:
    # HF 5.x: env TENSORBOARD_LOGGING_DIR, else output_dir/runs/<Mon DD_HH-MM-SS>_<host>; 4.x's logging_dir wins.
    explicit = getattr(args, "logging_dir", None) or os.environ.get("TENSORBOARD_LOGGING_DIR")
    if explicit:
        return explicit
    stamp = datetime.now().strftime("%b%d_%H-%M-%S")
    return os.path.join(args.output_dir, "runs", f"{stamp}_{socket.gethostname()}")


def _tensorboard(args: Any) -> Logger:
    from lightning.pytorch.loggers import TensorBoardLogger

    return TensorBoardLogger(save_dir=_tensorboard_dir(args), name="", version="", default_hp_metric=False)


def _csv(args: Any) -> Logger:
    from lightning.pytorch.loggers import CSVLogger

    return CSVLogger(save_dir=os.path.join(args.output_dir, "csv_logs"), name="", version="")


LOGGER_REGISTRY: dict[str, Callable[[Any], Logger]] = {
    "tensorboard": _tensorboard,
    "csv": _csv,
}


def build_loggers(args: Any) -> list[Logger]:
    """Lightning loggers for ``args.report_to`` (a list after ``TrainingArguments.__post_init__``).

    Raises:
        ValueError: for a name hf_lightning has no logger for, listing the supported names.
    """
    names = getattr(args, "report_to", None) or []
    if isinstance(names, str):
        names = [] if names == "none" else [names]
    loggers = []
    for name in names:
        if name == "none":
            continue
        factory = LOGGER_REGISTRY.get(name)
        if factory is None:
            raise ValueError(
                f"report_to={name!r} is not supported by hf_lightning. Supported: {sorted(LOGGER_REGISTRY)} "
                "(or pass any Lightning logger to build_lightning_trainer(..., logger=...))."
            )
        loggers.append(factory(args))
    return loggers
