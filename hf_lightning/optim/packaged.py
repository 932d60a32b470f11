"""Optimizers that live in another package (schedule-free, GrokAdamW, StableAdamW, ...), built as HF 5.23 builds them.

Each builder imports its package only when called, so hf_lightning imports without any of them; a missing package is
reported by :func:`check_optimizer_package` before any work (``HFLightningModule.setup("fit")`` calls it) with the
``pip install`` that fixes it. The keyword arguments, their order and HF's quirks are those of
``transformers.trainer_optimizer`` (5.23); what the training loop must do besides ``step()`` (schedule-free's
``train()`` / ``eval()`` modes) is done by the module (:func:`set_optimizer_mode`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hf_lightning.optim.optimizers import OptimizerRequest

__all__ = [
    "OPTIMIZER_PACKAGES",
    "PACKAGED_OPTIMIZERS",
    "OptimizerPackage",
    "check_optimizer_package",
    "set_optimizer_mode",
]


@dataclass(frozen=True)
class OptimizerPackage:
    """The package an ``optim`` value needs.

    Attributes:
        module: The module to import.
        requirement: What to ``pip install`` (a PyPI requirement).
        min_version: The lowest version HF accepts for this optimizer, if any.
    """

    module: str
    requirement: str
    min_version: str | None = None

    def missing(self) -> str | None:
        """Why the package cannot be used (not installed, too old), or None when it can."""
        if importlib.util.find_spec(self.module) is None:
            return "is not installed"
        if self.min_version is not None:
            installed = importlib.metadata.version(self.requirement.split(">")[0].split("=")[0])
            if _version_tuple(installed) < _version_tuple(self.min_version):
                return f"is version {installed}; this optimizer needs {self.min_version} or newer"
        return None


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _import(request: OptimizerRequest) -> ModuleType:
    package = OPTIMIZER_PACKAGES[request.name]
    problem = package.missing()
    if problem is not None:
        raise ImportError(_missing_message(request.name, package, problem))
    return importlib.import_module(package.module)


def _missing_message(name: str, package: OptimizerPackage, problem: str) -> str:
    requirement = package.requirement if package.min_version is None else f"{package.requirement}>={package.min_version}"
    return (
        f"TrainingArguments.optim={name!r} needs the `{package.module}` package, which {problem}: "
        f"`pip install \"{requirement}\"` (or choose another optim)."
    )


def check_optimizer_package(args: Any) -> None:
    """Refuse an ``optim`` whose package is missing, before any work (HF finds out when it builds the optimizer).

    Args:
        args: Training arguments (read: ``optim``).

    Raises:
        ImportError: The package ``optim`` needs is not installed or too old; the message gives the ``pip install``.
    """
    name = str(getattr(args.optim, "value", args.optim))
    package = OPTIMIZER_PACKAGES.get(name)
    if package is None:
        return
    problem = package.missing()
    if problem is not None:
        raise ImportError(_missing_message(name, package, problem))


def set_optimizer_mode(optimizer: Any, mode: str) -> None:
    """Call ``optimizer.train()`` or ``optimizer.eval()`` when the optimizer has it, as HF's Trainer does.

    HF calls ``train()`` at every training micro-batch and ``eval()`` at the start of every evaluation loop (during
    training, ``evaluate()``, ``predict()``); schedule-free optimizers swap the parameters between their two
    sequences there. Optimizers without the method are left alone.
    """
    method = getattr(optimizer, mode, None)
    if callable(method):
        method()


# --------------------------------------------------------------------------------------------------- schedule-free
def _schedule_free(request: OptimizerRequest) -> tuple[type, dict[str, Any]]:
    schedulefree = _import(request)
    kwargs = request.base_kwargs()
    warmup = True
    if request.name == "schedule_free_radam":
        cls, warmup = schedulefree.RAdamScheduleFree, False
        kwargs.update(request.adam_kwargs())
    elif request.name == "schedule_free_adamw":
        cls = schedulefree.AdamWScheduleFree
        kwargs.update(request.adam_kwargs())
    else:
        cls = schedulefree.SGDScheduleFree
    kwargs["weight_decay"] = request.args.weight_decay
    if warmup:
        # HF passes the field as it is: a ratio below 1 is not turned into a step count here.
        kwargs["warmup_steps"] = request.args.warmup_steps
    kwargs["weight_lr_power"] = _float(request, "weight_lr_power", 2.0)
    kwargs["r"] = _float(request, "r", 0.0)
    return cls, kwargs


def _float(request: OptimizerRequest, key: str, default: float) -> float:
    if key not in request.optim_args:
        return float(default)
    kwargs: dict[str, Any] = {}
    request.float_options(kwargs, (key,))
    return kwargs[key]


# --------------------------------------------------------------------------------------------------- GrokAdamW
def _grokadamw(request: OptimizerRequest) -> tuple[type, dict[str, Any]]:
    grokadamw = _import(request)
    # HF passes neither betas nor eps: GrokAdamW keeps its own defaults.
    kwargs = request.base_kwargs()
    for key, default in (("alpha_init", 0.98), ("lamb", 2.0), ("gamma", 0.1), ("grokking_signal_decay_rate", 0.1),
                         ("gradient_clipping", 1.0)):
        kwargs[key] = _float(request, key, default)
    return grokadamw.GrokAdamW, kwargs


# --------------------------------------------------------------------------------------------------- StableAdamW
def _stable_adamw(request: OptimizerRequest) -> tuple[type, dict[str, Any]]:
    optimi = _import(request)
    kwargs = {**request.base_kwargs(), **request.adam_kwargs(), "weight_decay": request.args.weight_decay}
    max_lr = request.optim_args.get("max_lr")
    kahan_sum = request.optim_args.get("kahan_sum")
    # HF quirk: the flags are `bool(<the string>)`, so any value given, "False" included, turns them on.
    kwargs["decouple_lr"] = bool(request.optim_args.get("decouple_lr", False))
    kwargs["max_lr"] = None if max_lr is None else _float(request, "max_lr", 0.0)
    kwargs["kahan_sum"] = None if kahan_sum is None else bool(kahan_sum)
    return optimi.StableAdamW, kwargs


_SCHEDULE_FREE = OptimizerPackage("schedulefree", "schedulefree")

#: ``optim`` value -> the package it needs.
OPTIMIZER_PACKAGES: dict[str, OptimizerPackage] = {
    "schedule_free_radam": OptimizerPackage("schedulefree", "schedulefree", min_version="1.4.0"),
    "schedule_free_adamw": _SCHEDULE_FREE,
    "schedule_free_sgd": _SCHEDULE_FREE,
    "grokadamw": OptimizerPackage("grokadamw", "grokadamw"),
    "stable_adamw": OptimizerPackage("optimi", "torch-optimi"),
}

#: ``optim`` value -> builder, merged into ``OPTIMIZER_REGISTRY``.
PACKAGED_OPTIMIZERS = {
    "schedule_free_radam": _schedule_free,
    "schedule_free_adamw": _schedule_free,
    "schedule_free_sgd": _schedule_free,
    "grokadamw": _grokadamw,
    "stable_adamw": _stable_adamw,
}
