"""Optimizers that live in another package, built as HF 5.23 builds them.

schedule-free, GrokAdamW, StableAdamW (torch-optimi), GaLore, APOLLO, LOMO, torchao's low-bit AdamW and the
bitsandbytes optimizers. Each builder imports its package only when called, so hf_lightning imports without any of
them; a missing package is reported by :func:`check_optimizer_package` before any work (the preflight in
``HFLightningModule.setup("fit")`` calls it) with the ``pip install`` that fixes it. The keyword arguments, their
order and HF's quirks are those of ``transformers.trainer_optimizer`` (5.23). What the training loop does besides
``step()`` is done by the module: schedule-free's ``train()`` / ``eval()`` modes (:func:`set_optimizer_mode`) and
LOMO's ``fused_backward`` (:func:`uses_fused_backward`); GaLore / APOLLO's groups and layer-wise hooks are in
``optim/low_rank.py``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from hf_lightning.optim.low_rank import low_rank_optimizer

if TYPE_CHECKING:
    from hf_lightning.optim.optimizers import OptimizerRequest

__all__ = [
    "OPTIMIZER_PACKAGES",
    "PACKAGED_OPTIMIZERS",
    "OptimizerPackage",
    "check_optimizer_package",
    "keep_embeddings_32bit",
    "set_optimizer_mode",
    "uses_fused_backward",
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
    requirement = package.requirement
    if package.min_version is not None:
        requirement = f"{requirement}>={package.min_version}"
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


# --------------------------------------------------------------------------------------------------- GaLore / APOLLO
def _galore(request: OptimizerRequest) -> tuple[type, dict[str, Any]]:
    galore = _import(request)
    classes = {"galore_adamw": galore.GaLoreAdamW, "galore_adamw_8bit": galore.GaLoreAdamW8bit,
               "galore_adafactor": galore.GaLoreAdafactor}
    cls = classes[request.name.removesuffix("_layerwise")]
    group = {
        "rank": _int(request, "rank", 128),
        "update_proj_gap": _int(request, "update_proj_gap", 200),
        "scale": _float(request, "scale", 0.25),
        "proj_type": request.optim_args.get("proj_type", "std"),
    }
    cls, kwargs = low_rank_optimizer(request.args, request.model, request.name, cls, group, request.base_kwargs())
    if request.name == "galore_adafactor":
        # HF sets these for the plain variant only: its layer-wise Adafactor fails in GaLore's own check.
        kwargs.update({"scale_parameter": False, "relative_step": False})
    return cls, kwargs


def _apollo(request: OptimizerRequest) -> tuple[type, dict[str, Any]]:
    apollo = _import(request)
    group = {
        "rank": _int(request, "rank", 128),
        "proj": request.optim_args.get("proj", "random"),
        "scale_type": request.optim_args.get("scale_type", "channel"),
        "update_proj_gap": _int(request, "update_proj_gap", 200),
        "scale": _float(request, "scale", 1.0),
        "proj_type": request.optim_args.get("proj_type", "std"),
        **request.adam_kwargs(),
    }
    return low_rank_optimizer(request.args, request.model, request.name, apollo.APOLLOAdamW, group,
                              request.base_kwargs())


def _int(request: OptimizerRequest, key: str, default: int) -> int:
    value = request.optim_args.get(key, default)
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"TrainingArguments.optim_args: {key}={value!r} is not an integer.") from None


# --------------------------------------------------------------------------------------------------- LOMO
def _lomo(request: OptimizerRequest) -> tuple[type, dict[str, Any]]:
    lomo_optim = _import(request)
    if request.model is None:
        raise ValueError("You need to pass a `model` in order to correctly initialize a LOMO optimizer.")
    base = lomo_optim.AdaLomo if request.name == "adalomo" else lomo_optim.Lomo
    return _stepless(base), {**request.base_kwargs(), "model": request.model}


_STEPLESS: dict[type, type] = {}


def _stepless(base: type) -> type:
    """``base`` with a ``step`` that only runs Lightning's closure (clipping, ``on_pre_optimizer_step``).

    LOMO updates the weights inside its ``fused_backward``; HF's accelerate skips ``step()`` for it, and the
    class's own ``step`` is torch's ``NotImplementedError``. Lightning counts optimizer steps in ``step()``, so the
    loop calls it; this one updates nothing.
    """
    if base not in _STEPLESS:
        def step(self: Any, closure: Any = None) -> Any:
            return closure() if closure is not None else None

        _STEPLESS[base] = type(base.__name__, (base,), {"step": step, "__module__": __name__})
    return _STEPLESS[base]


def uses_fused_backward(optimizer: Any) -> bool:
    """Whether ``optimizer`` (a LOMO one) does its backward and update in ``fused_backward(loss, lr)``."""
    return type(optimizer) in _STEPLESS.values()


# --------------------------------------------------------------------------------------------------- torchao
def _torchao(request: OptimizerRequest) -> tuple[type, dict[str, Any]]:
    _import(request)
    new_home = _version_tuple(importlib.metadata.version("torchao")) >= (0, 11)
    torchao_optim = importlib.import_module("torchao.optim" if new_home else "torchao.prototype.low_bit_optim")
    cls = torchao_optim.AdamW4bit if request.name == "adamw_torch_4bit" else torchao_optim.AdamW8bit
    kwargs = request.base_kwargs()
    # HF passes an optim_args block_size on as the string it is.
    kwargs["block_size"] = request.optim_args.get("block_size", 256)
    kwargs["bf16_stochastic_round"] = _strtobool(request.optim_args.get("bf16_stochastic_round", "False"),
                                                 "bf16_stochastic_round")
    kwargs.update(request.adam_kwargs())
    return cls, kwargs


def _strtobool(value: str, key: str) -> int:
    lowered = value.lower()
    if lowered in {"y", "yes", "t", "true", "on", "1"}:
        return 1
    if lowered in {"n", "no", "f", "false", "off", "0"}:
        return 0
    raise ValueError(f"TrainingArguments.optim_args: {key}={value!r} is not a truth value (true/false).")


# --------------------------------------------------------------------------------------------------- bitsandbytes
def _bitsandbytes(request: OptimizerRequest) -> tuple[type, dict[str, Any]]:
    _import(request)
    bnb_optim = importlib.import_module("bitsandbytes.optim")
    name, args, options = request.name, request.args, request.optim_args
    # HF's order of tests: "adam" first, so the AdEMAMix names (no "adam" in them) reach the last branch.
    if "adam" in name:
        cls, extra = bnb_optim.AdamW, request.adam_kwargs()
    elif "lion" in name:
        cls, extra = bnb_optim.Lion, {"betas": (args.adam_beta1, args.adam_beta2)}
    elif "rmsprop" in name:
        # HF passes optim_args on as strings.
        cls, extra = bnb_optim.RMSprop, dict(options)
    else:
        cls = bnb_optim.AdEMAMix
        extra = {
            "betas": (float(options.get("beta1", args.adam_beta1)), float(options.get("beta2", args.adam_beta2)),
                      float(options.get("beta3", 0.9999))),
            "alpha": float(options.get("alpha", 5.0)),
            "eps": float(options.get("eps", args.adam_epsilon)),
        }
        for key in ("t_alpha", "t_beta3"):
            if key in options:
                extra[key] = _int(request, key, 0)
    kwargs = {**request.base_kwargs(), **extra, "optim_bits": 8 if "8bit" in name else 32}
    if "rmsprop" not in name:
        kwargs["is_paged"] = "paged" in name
    return cls, kwargs


def keep_embeddings_32bit(optimizer_cls: type, kwargs: dict[str, Any], model: Any) -> None:
    """HF's rule for bitsandbytes' 8-bit optimizers: the embeddings' weights keep 32-bit optimizer state."""
    if "bitsandbytes" not in str(optimizer_cls) or kwargs.get("optim_bits") != 8:
        return
    import torch.nn as nn

    manager = importlib.import_module("bitsandbytes.optim").GlobalOptimManager.get_instance()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            manager.register_module_override(module, "weight", {"optim_bits": 32})


_SCHEDULE_FREE = OptimizerPackage("schedulefree", "schedulefree")
_BITSANDBYTES = OptimizerPackage("bitsandbytes", "bitsandbytes")
_BITSANDBYTES_NAMES = (
    "adamw_bnb_8bit adamw_8bit ademamix ademamix_8bit lion_8bit lion_32bit paged_adamw_32bit paged_adamw_8bit "
    "paged_ademamix_32bit paged_ademamix_8bit paged_lion_32bit paged_lion_8bit rmsprop_bnb rmsprop_bnb_8bit "
    "rmsprop_bnb_32bit"
).split()
_GALORE_NAMES = ("galore_adamw", "galore_adamw_8bit", "galore_adafactor", "galore_adamw_layerwise",
                 "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise")

#: ``optim`` value -> the package it needs.
OPTIMIZER_PACKAGES: dict[str, OptimizerPackage] = {
    "schedule_free_radam": OptimizerPackage("schedulefree", "schedulefree", min_version="1.4.0"),
    "schedule_free_adamw": _SCHEDULE_FREE,
    "schedule_free_sgd": _SCHEDULE_FREE,
    "grokadamw": OptimizerPackage("grokadamw", "grokadamw"),
    "stable_adamw": OptimizerPackage("optimi", "torch-optimi"),
    # GaLore and APOLLO import bitsandbytes (and transformers) themselves.
    **dict.fromkeys(_GALORE_NAMES, OptimizerPackage("galore_torch", "galore-torch")),
    "apollo_adamw": OptimizerPackage("apollo_torch", "apollo-torch"),
    "apollo_adamw_layerwise": OptimizerPackage("apollo_torch", "apollo-torch"),
    "lomo": OptimizerPackage("lomo_optim", "lomo-optim"),
    "adalomo": OptimizerPackage("lomo_optim", "lomo-optim"),
    "adamw_torch_4bit": OptimizerPackage("torchao", "torchao", min_version="0.4.0"),
    "adamw_torch_8bit": OptimizerPackage("torchao", "torchao", min_version="0.4.0"),
    **dict.fromkeys(_BITSANDBYTES_NAMES, _BITSANDBYTES),
}

#: ``optim`` value -> builder, merged into ``OPTIMIZER_REGISTRY``.
PACKAGED_OPTIMIZERS = {
    "schedule_free_radam": _schedule_free,
    "schedule_free_adamw": _schedule_free,
    "schedule_free_sgd": _schedule_free,
    "grokadamw": _grokadamw,
    "stable_adamw": _stable_adamw,
    **dict.fromkeys(_GALORE_NAMES, _galore),
    "apollo_adamw": _apollo,
    "apollo_adamw_layerwise": _apollo,
    "lomo": _lomo,
    "adalomo": _lomo,
    "adamw_torch_4bit": _torchao,
    "adamw_torch_8bit": _torchao,
    **dict.fromkeys(_BITSANDBYTES_NAMES, _bitsandbytes),
}
