"""``report_to`` → Lightning loggers or HF's own reporting callbacks, resolved through two registries.

HF drives experiment trackers from reporting callbacks. hf_lightning hands the names Lightning has a logger for
(``LOGGER_REGISTRY``: tensorboard, csv, wandb, mlflow, comet_ml) to Lightning's loggers; the flow callback sends
every HF log (each ``on_log``) to them with HF's TensorBoard tag names (``loss`` → ``train/loss``, ``eval_loss`` →
``eval/loss``, ``test_x`` → ``test/x``) at ``state.global_step``. Every other name HF knows
(``CALLBACK_REGISTRY``: azure_ml, clearml, codecarbon, dagshub, dvclive, flyte, kubeflow, neptune, swanlab,
trackio) runs transformers' own integration callback, imported from ``transformers`` only when ``report_to``
names it, and driven by the callback bridge like any user ``TrainerCallback`` (right after
``DefaultFlowCallback``, where HF puts it). Where such a callback reaches for a ``transformers.Trainer`` (DVCLive's
``HF_DVCLIVE_LOG_MODEL=true`` save at train end), a subclass does that part through hf_lightning instead.

This module is the one place that knows which name needs which package: an unknown name, or one whose package
(or ``transformers``) is missing, is a ``ValueError`` with the install command, raised at ``Trainer(...)`` /
``build_lightning_trainer`` / the module's first hook, before any work.
"""

from __future__ import annotations

import functools
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
from hf_lightning.args.training_args import in_kubeflow_trainjob
from hf_lightning.checkpointing.model_state import model_state_for
from hf_lightning.checkpointing.writer import save_model_files
from hf_lightning.seed import enable_full_determinism, set_seed


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
}


def _env_true(name: str) -> bool:
    return os.getenv(name, "FALSE").upper() == "TRUE"


@dataclass(frozen=True)
class CallbackSpec:
    """One ``report_to`` name served by transformers' own integration callback.

    Attributes:
        class_name: the callback's name in ``transformers.integrations.integration_utils``.
        modules: import names that must all be installed (HF's ``is_*_available`` test).
        install: the packages to ``pip install`` besides ``transformers``.
        in_all: whether ``report_to="all"`` picks it when available (HF's ``"all"`` has no ``flyte``).
        available: HF's extra condition for ``"all"`` (an environment variable, another package).
        adapt: ``fn(hf_class) -> subclass`` run in its place, for a callback that needs HF's ``Trainer`` somewhere.
    """

    class_name: str
    modules: tuple[str, ...]
    install: str
    in_all: bool = True
    available: Callable[[], bool] = lambda: True
    adapt: Callable[[type], type] | None = None

    def installed(self) -> bool:
        return all(_module_installed(m) for m in self.modules)


def _mlflow_available() -> bool:
    return _module_installed("mlflow") and not _env_true("DISABLE_MLFLOW_INTEGRATION")


def _module_installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a dotted name whose parent is missing
        return False


@functools.cache
def _dvclive_callback(base: type) -> type:
    """HF's ``DVCLiveCallback`` (``base``) with the ``HF_DVCLIVE_LOG_MODEL=true`` model save done by hf_lightning.

    HF's ``on_train_end`` builds a throwaway ``transformers.Trainer`` from the arguments only to call its
    ``save_model``, which needs HF's own ``TrainingArguments``. The subclass does what that does, then lets HF's
    method do the rest (``live.end()``). Cached, so every run gets the same class.
    """

    class DVCLiveCallback(base):  # type: ignore[misc, valid-type]
        __doc__ = base.__doc__

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if self._log_model is not True or not self._initialized:
                return super().on_train_end(args, state, control, **kwargs)
            name = "best" if args.load_best_model_at_end else "last"
            output_dir = os.path.join(args.output_dir, name)
            model = kwargs.get("model")
            model_state = model_state_for(model)
            # Every process takes part in gathering a sharded model (FSDP2, tensor parallel), as in save_model();
            # HF's callback saves on the main process alone, which then waits forever for the others.
            gathered = model_state.gather(model, output_dir)
            if not state.is_world_process_zero:
                return super().on_train_end(args, state, control, **kwargs)
            # The throwaway Trainer's __init__ reseeds, as Trainer(...) does.
            (enable_full_determinism if args.full_determinism else set_seed)(args.seed)
            # Its save_model: the model (the best one, already loaded, with load_best_model_at_end), its
            # processing class and the arguments. Its collator is the default one, so no collator's tokenizer.
            save_model_files(model, output_dir, processing_class=kwargs.get("processing_class"), args=args,
                             model_state=model_state, gathered=gathered)
            self.live.log_artifact(output_dir, name=name, type="model", copy=True)
            log_model, self._log_model = self._log_model, False
            try:
                return super().on_train_end(args, state, control, **kwargs)
            finally:
                self._log_model = log_model

    DVCLiveCallback.__module__, DVCLiveCallback.__qualname__ = __name__, "DVCLiveCallback"
    return DVCLiveCallback


CALLBACK_REGISTRY: dict[str, CallbackSpec] = {
    # HF's "all" leaves azure_ml out when mlflow is available.
    "azure_ml": CallbackSpec("AzureMLCallback", ("azureml.core.run",), "azureml-sdk",
                             available=lambda: not _mlflow_available()),
    "clearml": CallbackSpec("ClearMLCallback", ("clearml",), "clearml"),
    "codecarbon": CallbackSpec("CodeCarbonCallback", ("codecarbon",), "codecarbon"),
    "dagshub": CallbackSpec("DagsHubCallback", ("dagshub", "mlflow"), "dagshub mlflow"),
    "dvclive": CallbackSpec("DVCLiveCallback", ("dvclive",), "dvclive", adapt=_dvclive_callback),
    "flyte": CallbackSpec("FlyteCallback", ("flytekit",), "flytekit flytekitplugins-deck-standard", in_all=False),
    "kubeflow": CallbackSpec("KubeflowCallback", (), "", available=in_kubeflow_trainjob),
    "neptune": CallbackSpec("NeptuneCallback", ("neptune",), "neptune"),
    "swanlab": CallbackSpec("SwanLabCallback", ("swanlab",), "swanlab"),
    "trackio": CallbackSpec("TrackioCallback", ("trackio",), "trackio"),
}

# HF's order for "all" (``get_available_reporting_integrations``); the callbacks follow report_to's order.
_ALL_ORDER = ("azure_ml", "comet_ml", "dagshub", "dvclive", "mlflow", "neptune", "tensorboard", "wandb",
              "codecarbon", "clearml", "swanlab", "trackio", "kubeflow")


def available_report_to() -> list[str]:
    """The ``report_to`` names ``"all"`` stands for, in HF's order: every Lightning logger whose package is
    installed, and every HF integration callback whose package and ``transformers`` are installed."""
    names = []
    for name in _ALL_ORDER:
        if name in LOGGER_REGISTRY:
            spec = LOGGER_REGISTRY[name]
            if spec.in_all and spec.installed() and (name != "mlflow" or _mlflow_available()):
                names.append(name)
        elif _module_installed("transformers"):
            cb_spec = CALLBACK_REGISTRY[name]
            if cb_spec.in_all and cb_spec.installed() and cb_spec.available():
                names.append(name)
    return names


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
    for name in _checked_names(args):
        spec = LOGGER_REGISTRY.get(name)
        if spec is not None:
            loggers.append(spec.factory(args))
    return loggers


def reporting_callbacks(args: Any) -> list[type]:
    """transformers' integration callback classes for the ``report_to`` names no Lightning logger serves.

    HF instantiates them without arguments and puts them right after ``DefaultFlowCallback``; so does the flow
    callback. ``transformers`` is imported here, only when such a name is asked for.

    Args:
        args: a ``TrainingArguments``.

    Returns:
        The classes (HF's own, or the registry's subclass of one), in ``report_to``'s order (empty when every
        name is a Lightning logger).

    Raises:
        ValueError: as :func:`build_loggers`, and when ``transformers`` is not installed (naming the integration
            and the install command).
    """
    classes = []
    for name in _checked_names(args):
        spec = CALLBACK_REGISTRY.get(name)
        if spec is not None:
            from transformers.integrations import integration_utils

            hf_class = getattr(integration_utils, spec.class_name)
            classes.append(hf_class if spec.adapt is None else spec.adapt(hf_class))
    return classes


def _checked_names(args: Any) -> list[str]:
    """``report_to``'s names, each known and with its packages installed (else a ``ValueError``)."""
    names = _names(getattr(args, "report_to", None))
    for name in names:
        if name in LOGGER_REGISTRY:
            spec = LOGGER_REGISTRY[name]
            if not spec.installed():
                raise ValueError(
                    f"report_to contains {name!r}, but its package is not installed. Run `{spec.install}`, or "
                    f"remove {name!r} from report_to."
                )
            continue
        cb_spec = CALLBACK_REGISTRY.get(name)
        if cb_spec is None:
            raise ValueError(
                f"report_to={name!r} is not supported by hf_lightning (nor by HF). Supported: "
                f"{sorted([*LOGGER_REGISTRY, *CALLBACK_REGISTRY])} (or pass any Lightning logger to "
                "build_lightning_trainer(..., logger=...))."
            )
        missing = [m.partition(".")[0] for m in ("transformers", *cb_spec.modules) if not _module_installed(m)]
        if missing:
            install = " ".join(dict.fromkeys(["transformers", *cb_spec.install.split()]))
            raise ValueError(
                f"report_to contains {name!r}: hf_lightning runs transformers' own {cb_spec.class_name} for it, "
                f"and {', '.join(dict.fromkeys(missing))} is not installed. Run `pip install {install}`, or remove "
                f"{name!r} from report_to."
            )
    return names
