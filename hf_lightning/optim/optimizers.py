"""Optimizer creation from HF ``TrainingArguments`` fields, through one name -> builder registry.

Reads ``optim``, ``optim_args``, ``learning_rate``, ``weight_decay``, ``adam_beta1``, ``adam_beta2`` and
``adam_epsilon`` by attribute name, so HF's ``TrainingArguments`` and ours both work. Every optimizer that pure
torch can provide is built exactly as ``transformers.Trainer.get_optimizer_cls_and_kwargs`` (5.23) builds it, and
so is each one whose package runs on a CPU (``optim/packaged.py``, imported only when chosen); the names that need
CUDA, XLA or NPU are refused with a clear error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hf_lightning.optim.adafactor import Adafactor
from hf_lightning.optim.grouping import build_param_groups
from hf_lightning.optim.packaged import PACKAGED_OPTIMIZERS, keep_embeddings_32bit

__all__ = [
    "OPTIMIZER_REGISTRY",
    "UNSUPPORTED_OPTIMIZERS",
    "OptimizerRequest",
    "create_optimizer",
    "get_optimizer_cls_and_kwargs",
    "parse_optim_args",
]


@dataclass(frozen=True)
class OptimizerRequest:
    """What an optimizer builder may read.

    Attributes:
        name: The normalised ``optim`` value (a plain ``str``).
        args: The training arguments (read by attribute name).
        model: The model being trained, when known.
        optim_args: ``args.optim_args`` parsed into a ``str -> str`` dict.
    """

    name: str
    args: Any
    model: nn.Module | None
    optim_args: dict[str, str]

    def base_kwargs(self) -> dict[str, Any]:
        """``{"lr": learning_rate}``: what every optimizer gets."""
        return {"lr": self.args.learning_rate}

    def adam_kwargs(self) -> dict[str, Any]:
        """``betas`` and ``eps`` from ``adam_beta1``, ``adam_beta2``, ``adam_epsilon``."""
        return {"betas": (self.args.adam_beta1, self.args.adam_beta2), "eps": self.args.adam_epsilon}

    def float_options(self, kwargs: dict[str, Any], keys: tuple[str, ...]) -> None:
        """Copy those of ``keys`` present in ``optim_args`` into ``kwargs`` as floats."""
        for key in keys:
            if key in self.optim_args:
                kwargs[key] = _as_float(self.optim_args[key], key)

    def bool_option(self, kwargs: dict[str, Any], key: str) -> None:
        """Copy ``key`` from ``optim_args`` into ``kwargs`` as a bool ("true", "1", "yes" are True)."""
        if key in self.optim_args:
            kwargs[key] = self.optim_args[key].lower() in ("true", "1", "yes")


OptimizerBuilder = Callable[[OptimizerRequest], tuple[type, dict[str, Any]]]


def _as_float(value: str, key: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"TrainingArguments.optim_args: {key}={value!r} is not a number.") from None


def parse_optim_args(optim_args: str | None) -> dict[str, str]:
    """Parse HF's ``optim_args`` string ``"key=value,key2=value2"`` (spaces ignored) into a dict of strings.

    Args:
        optim_args: The string, or None / empty.

    Returns:
        The pairs, values left as strings (each optimizer converts the keys it knows).

    Raises:
        ValueError: A comma-separated item is not exactly ``key=value``.

    Example:
        >>> parse_optim_args("momentum=0.9, nesterov=True")
        {'momentum': '0.9', 'nesterov': 'True'}
    """
    if not optim_args:
        return {}
    parsed: dict[str, str] = {}
    for item in optim_args.replace(" ", "").split(","):
        parts = item.split("=")
        if len(parts) != 2:
            raise ValueError(
                f"TrainingArguments.optim_args={optim_args!r}: item {item!r} is not of the form key=value; "
                "write it as 'key=value,key2=value2'."
            )
        parsed[parts[0]] = parts[1]
    return parsed


def _adamw(request: OptimizerRequest) -> tuple[type, dict[str, Any]]:
    return torch.optim.AdamW, {**request.base_kwargs(), **request.adam_kwargs()}


def _adamw_fused(request: OptimizerRequest) -> tuple[type, dict[str, Any]]:
    # HF 5.x's default; the fused kernel also runs on CPU and rounds differently from the for-each one,
    # so it must be used for bit parity with HF.
    cls, kwargs = _adamw(request)
    return cls, {**kwargs, "fused": True}


def _adafactor(request: OptimizerRequest) -> tuple[type, dict[str, Any]]:
    # The Trainer drives the learning rate with its scheduler, hence no relative step and no scaling.
    return Adafactor, {**request.base_kwargs(), "scale_parameter": False, "relative_step": False}


def _sgd(request: OptimizerRequest) -> tuple[type, dict[str, Any]]:
    kwargs = request.base_kwargs()
    request.float_options(kwargs, ("momentum", "dampening", "weight_decay"))
    request.bool_option(kwargs, "nesterov")
    return torch.optim.SGD, kwargs


def _adagrad(request: OptimizerRequest) -> tuple[type, dict[str, Any]]:
    kwargs = request.base_kwargs()
    request.float_options(kwargs, ("lr_decay", "weight_decay", "eps"))
    return torch.optim.Adagrad, kwargs


def _rmsprop(request: OptimizerRequest) -> tuple[type, dict[str, Any]]:
    kwargs = request.base_kwargs()
    request.float_options(kwargs, ("momentum", "alpha", "eps", "weight_decay"))
    request.bool_option(kwargs, "centered")
    return torch.optim.RMSprop, kwargs


#: ``optim`` name -> builder returning ``(optimizer_cls, kwargs)``; the class is called as ``cls(groups, **kwargs)``.
OPTIMIZER_REGISTRY: dict[str, OptimizerBuilder] = {
    "adamw_torch": _adamw,
    "adamw_torch_fused": _adamw_fused,
    "adafactor": _adafactor,
    "sgd": _sgd,
    "adagrad": _adagrad,
    "rmsprop": _rmsprop,
    **PACKAGED_OPTIMIZERS,
}

#: HF ``OptimizerNames`` values hf_lightning does not build -> the package they need. Each needs hardware that
#: HF's own Trainer needs for it too (an XLA device, an Ascend NPU) or a package not on PyPI (torchdistx).
UNSUPPORTED_OPTIMIZERS: dict[str, str] = {
    "adamw_torch_xla": "torch_xla",
    "adamw_torch_npu_fused": "torch_npu",
    "adamw_anyprecision": "torchdistx",
}


def get_optimizer_cls_and_kwargs(args: Any, model: nn.Module | None = None) -> tuple[type, dict[str, Any]]:
    """Return the optimizer class and keyword arguments that ``args.optim`` names, as HF's Trainer does.

    Args:
        args: Training arguments (HF's or ours); reads ``optim``, ``optim_args``, ``learning_rate``,
            ``adam_beta1``, ``adam_beta2``, ``adam_epsilon``.
        model: The model, for builders that need it (GaLore, APOLLO, LOMO).

    Returns:
        ``(optimizer_cls, kwargs)``, equal to ``transformers.Trainer.get_optimizer_cls_and_kwargs(args)``
        (with our :class:`~hf_lightning.optim.adafactor.Adafactor` in place of HF's).

    Raises:
        ValueError: ``optim`` is unknown, or needs a package hf_lightning does not drive.
        ImportError: ``optim`` needs a package that is not installed (the message gives the ``pip install``).
    """
    name = getattr(args.optim, "value", args.optim)
    builder = OPTIMIZER_REGISTRY.get(name)
    if builder is None:
        supported = ", ".join(sorted(OPTIMIZER_REGISTRY))
        if name in UNSUPPORTED_OPTIMIZERS:
            raise ValueError(
                f"TrainingArguments.optim={name!r} needs the {UNSUPPORTED_OPTIMIZERS[name]} package, which "
                f"hf_lightning does not support. Use one of: {supported}; or pass "
                "optimizer_cls_and_kwargs=(cls, kwargs) / optimizers=(optimizer, scheduler) to bring your own."
            )
        raise ValueError(f"TrainingArguments.optim={name!r} is not a known optimizer. Use one of: {supported}.")
    request = OptimizerRequest(name=name, args=args, model=model, optim_args=parse_optim_args(args.optim_args))
    return builder(request)


def _is_optimizer_class(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer)


def create_optimizer(
    model: nn.Module,
    args: Any,
    optimizer_cls_and_kwargs: tuple[Any, dict[str, Any]] | None = None,
) -> torch.optim.Optimizer:
    """Build the optimizer HF's ``Trainer.create_optimizer`` would build.

    Parameters are split into HF's two weight-decay groups (see
    :func:`~hf_lightning.optim.grouping.build_param_groups`) and handed to the class that ``args.optim``
    names, or to ``optimizer_cls_and_kwargs`` when given.

    Args:
        model: The model to optimize.
        args: Training arguments (HF's or ours), read by attribute name; ``weight_decay`` sets group 0's decay.
        optimizer_cls_and_kwargs: ``(cls, kwargs)`` replacing ``optim``/``optim_args``: called as
            ``cls(groups, **kwargs)``. As in HF, a ``"params"`` entry in ``kwargs`` replaces the groups, and a
            ``cls`` that is not a ``torch.optim.Optimizer`` subclass is treated as a factory:
            ``cls()(model, **kwargs)``.

    Returns:
        The optimizer.

    Raises:
        ValueError: ``args.optim`` is unknown or unsupported (see :func:`get_optimizer_cls_and_kwargs`).
    """
    groups: Any = build_param_groups(model, args.weight_decay)
    if optimizer_cls_and_kwargs is not None:
        optimizer_cls, kwargs = optimizer_cls_and_kwargs
    else:
        optimizer_cls, kwargs = get_optimizer_cls_and_kwargs(args, model)
    # A copy: HF pops from the caller's dict, which breaks a second `create_optimizer` call.
    kwargs = dict(kwargs)
    if not _is_optimizer_class(optimizer_cls):
        return optimizer_cls()(model, **kwargs)
    # As HF, in this order: GaLore / APOLLO give their own groups, LOMO takes the model, a layer-wise optimizer
    # its per-parameter optimizers, each in place of the groups.
    for key in ("params", "model", "optimizer_dict"):
        if key in kwargs:
            groups = kwargs.pop(key)
    optimizer = optimizer_cls(groups, **kwargs)
    keep_embeddings_32bit(optimizer_cls, kwargs, model)
    return optimizer
