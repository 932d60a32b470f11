"""``report_to`` → Lightning loggers, resolved through one registry.

HF drives experiment trackers from reporting callbacks; hf_lightning hands the same ``report_to`` names to
Lightning's loggers. The flow callback sends every HF log (each ``on_log``) to them with HF's TensorBoard tag
names (``loss`` → ``train/loss``, ``eval_loss`` → ``eval/loss``, ``test_x`` → ``test/x``) at ``state.global_step``.

This module is the one place that knows which logger needs which package: a name whose package is missing is a
``ValueError`` with the install command, raised when the Lightning trainer is built, before any work.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from hf_lightning import _compat
from hf_lightning._utils import enum_value, unwrap_model


def _tensorboard_dir(args: Any) -> str:
    # HF 5.x: env TENSORBOARD_LOGGING_DIR, else output_dir/runs/<Mon DD_HH-MM-SS>_<host>; 4.x's logging_dir wins.
    explicit = getattr(args, "logging_dir", None) or os.environ.get("TENSORBOARD_LOGGING_DIR")
    if explicit:
        return os.path.expanduser(explicit)
    stamp = datetime.now().strftime("%b%d_%H-%M-%S")
    return os.path.join(args.output_dir, "runs", f"{stamp}_{socket.gethostname()}")


class HFTensorBoardLogger(TensorBoardLogger):
    """Lightning's TensorBoard logger writing what HF's ``TensorBoardCallback`` writes.

    - The folder is HF's: ``logging_dir`` (4.x name), else ``$TENSORBOARD_LOGGING_DIR``, else
      ``output_dir/runs/<%b%d_%H-%M-%S>_<hostname>``; event files only (no ``hparams.yaml``).
    - When a fit starts: the text summaries ``args`` (``args.to_json_string()``) and ``model_config`` (the model's
      ``config.to_json_string()``), and no hparams table.
    - Scalars are flushed on every log call, as HF flushes after each ``on_log``, so the event file is complete
      while training runs and after a later ``evaluate()``.

    Args:
        args: the ``TrainingArguments`` of the run.
    """

    def __init__(self, args: Any) -> None:
        super().__init__(save_dir=_tensorboard_dir(args), name="", version="", default_hp_metric=False)
        self._training_args = args

    @rank_zero_only
    def log_hyperparams(self, params: Any, metrics: Any = None, step: int | None = None) -> None:
        # HF records the arguments as a text summary (see log_graph), never as an hparams table.
        return None

    @rank_zero_only
    def log_graph(self, model: Any, input_array: Any = None) -> None:
        # Lightning calls this right after log_hyperparams at the start of every run; HF writes its text
        # summaries at on_train_begin only, so evaluation runs add nothing.
        trainer = _compat.attached_trainer(model)
        if trainer is None or enum_value(trainer.state.fn) != "fit":
            return
        args_json = getattr(self._training_args, "to_json_string", None)
        self.experiment.add_text(
            "args", args_json() if callable(args_json) else json.dumps(vars(self._training_args), default=str)
        )
        wrapped = getattr(model, "model", None)
        config = getattr(unwrap_model(wrapped), "config", None)
        if config is not None and hasattr(config, "to_json_string"):
            self.experiment.add_text("model_config", config.to_json_string())

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics, step)
        self.experiment.flush()

    @rank_zero_only
    def save(self) -> None:
        if self._experiment is not None:
            self.experiment.flush()


def _tensorboard(args: Any) -> Logger:
    return HFTensorBoardLogger(args)


def _csv(args: Any) -> Logger:
    from lightning.pytorch.loggers import CSVLogger

    # Written on every log call, so logs sent after a run ended (a later evaluate()) reach the file too.
    return CSVLogger(save_dir=os.path.join(args.output_dir, "csv_logs"), name=getattr(args, "run_name", None) or "",
                     version="", flush_logs_every_n_steps=1)


def _wandb(args: Any) -> Logger:
    from lightning.pytorch.loggers import WandbLogger

    # HF's WandbCallback: project from $WANDB_PROJECT (default "huggingface"), run name from run_name.
    return WandbLogger(name=getattr(args, "run_name", None), project=os.getenv("WANDB_PROJECT", "huggingface"),
                       save_dir=args.output_dir)


def _mlflow(args: Any) -> Logger:
    from lightning.pytorch.loggers import MLFlowLogger

    # HF's MLflowCallback: experiment from $MLFLOW_EXPERIMENT_NAME, tracking URI from $MLFLOW_TRACKING_URI.
    return MLFlowLogger(experiment_name=os.getenv("MLFLOW_EXPERIMENT_NAME") or "Default",
                        run_name=getattr(args, "run_name", None), tracking_uri=os.getenv("MLFLOW_TRACKING_URI"))


def _comet(args: Any) -> Logger:
    from lightning.pytorch.loggers import CometLogger

    kwargs: dict[str, Any] = {"project": os.getenv("COMET_PROJECT_NAME"), "workspace": os.getenv("COMET_WORKSPACE")}
    if getattr(args, "run_name", None):
        kwargs["name"] = args.run_name
    return CometLogger(**kwargs)


def _neptune(args: Any) -> Logger:
    raise ValueError(
        "report_to contains 'neptune', but Lightning 2.6 no longer ships a Neptune logger (Neptune has been sunset). "
        "Remove 'neptune' from report_to, or pass another Lightning logger to "
        "build_lightning_trainer(..., logger=...)."
    )


@dataclass(frozen=True)
class LoggerSpec:
    """How to build one ``report_to`` logger.

    Attributes:
        factory: ``fn(args) -> Logger``.
        modules: import names of which at least one must be installed (empty: always available).
        install: the command that installs the package.
        in_all: whether ``report_to="all"`` picks it when installed (HF's ``"all"`` has no ``csv``).
    """

    factory: Callable[[Any], Logger]
    modules: tuple[str, ...] = ()
    install: str = ""
    in_all: bool = True

    def installed(self) -> bool:
        return not self.modules or any(importlib.util.find_spec(m) is not None for m in self.modules)


LOGGER_REGISTRY: dict[str, LoggerSpec] = {
    "tensorboard": LoggerSpec(_tensorboard, ("tensorboard", "tensorboardX"), "pip install tensorboard"),
    "csv": LoggerSpec(_csv, in_all=False),
    "wandb": LoggerSpec(_wandb, ("wandb",), "pip install wandb"),
    "mlflow": LoggerSpec(_mlflow, ("mlflow",), "pip install mlflow"),
    "comet_ml": LoggerSpec(_comet, ("comet_ml",), "pip install comet-ml"),
    "neptune": LoggerSpec(_neptune, in_all=False),
}


def available_report_to() -> list[str]:
    """The ``report_to`` names ``"all"`` stands for: every registered logger whose package is installed."""
    return [name for name, spec in LOGGER_REGISTRY.items() if spec.in_all and spec.installed()]


def _names(report_to: Any) -> list[str]:
    if report_to is None or report_to in ("none", ["none"]):
        return []
    if report_to in ("all", ["all"]):
        return available_report_to()
    return [report_to] if isinstance(report_to, str) else [n for n in report_to if n not in (None, "none")]


def build_loggers(args: Any) -> list[Logger]:
    """Lightning loggers for ``args.report_to`` (a list, ``"all"`` or ``"none"``).

    Args:
        args: a ``TrainingArguments`` (``report_to``, ``run_name``, ``output_dir``, ``logging_dir``).

    Returns:
        One logger per name, in ``report_to``'s order.

    Raises:
        ValueError: for a name hf_lightning has no logger for (listing the supported ones), or whose package is
            not installed (naming the install command).

    Example:
        >>> from types import SimpleNamespace
        >>> [type(lg).__name__ for lg in build_loggers(SimpleNamespace(report_to=["csv"], output_dir="out"))]
        ['CSVLogger']
    """
    loggers = []
    for name in _names(getattr(args, "report_to", None)):
        spec = LOGGER_REGISTRY.get(name)
        if spec is None:
            raise ValueError(
                f"report_to={name!r} is not supported by hf_lightning. Supported: {sorted(LOGGER_REGISTRY)} "
                "(or pass any Lightning logger to build_lightning_trainer(..., logger=...))."
            )
        if not spec.installed():
            raise ValueError(
                f"report_to contains {name!r}, but its package is not installed. Run `{spec.install}`, or remove "
                f"{name!r} from report_to."
            )
        loggers.append(spec.factory(args))
    return loggers
