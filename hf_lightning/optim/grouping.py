"""Weight-decay parameter groups, split the way HF's Trainer splits them (transformers 5.23).

A parameter is *not* decayed when it lives inside an ``nn.LayerNorm`` (checked by type, at any depth)
or when its dotted name, lower-cased, matches one of :data:`NO_DECAY_NAME_PATTERNS`.
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn

from hf_lightning._compat import registered_parameter_names

__all__ = ["NO_DECAY_MODULE_TYPES", "NO_DECAY_NAME_PATTERNS", "build_param_groups", "get_decay_parameter_names"]

#: Module types whose parameters are never decayed (``isinstance`` check, so subclasses count too).
NO_DECAY_MODULE_TYPES: tuple[type[nn.Module], ...] = (nn.LayerNorm,)

#: Regexes searched in the lower-cased dotted parameter name; a hit means "no weight decay".
NO_DECAY_NAME_PATTERNS: tuple[str, ...] = (
    r"bias",
    r"layernorm",
    r"rmsnorm",
    r"(?:^|\.)norm(?:$|\.)",
    r"_norm(?:$|\.)",
)

_COMPILED_PATTERNS = tuple(re.compile(p) for p in NO_DECAY_NAME_PATTERNS)


def _excluded_by_name(name: str) -> bool:
    lowered = name.lower()
    return any(pattern.search(lowered) for pattern in _COMPILED_PATTERNS)


def _decay_names(module: nn.Module) -> list[str]:
    names: list[str] = []
    for child_name, child in module.named_children():
        if isinstance(child, NO_DECAY_MODULE_TYPES):
            continue
        names.extend(
            f"{child_name}.{sub}" for sub in _decay_names(child) if not _excluded_by_name(f"{child_name}.{sub}")
        )
    # Names registered as None are listed too, exactly as HF lists them; such names never reach an optimizer
    # because `named_parameters()` skips them.
    # The root module's own parameters are filtered by name only: HF never checks the root's type.
    names.extend(name for name in registered_parameter_names(module) if not _excluded_by_name(name))
    return names


def get_decay_parameter_names(model: nn.Module) -> list[str]:
    """Return the names of the parameters that weight decay applies to.

    Same list, in the same order, as ``transformers.Trainer.get_decay_parameter_names`` (5.23): children
    first (depth first, in registration order), then the module's own parameters.

    Args:
        model: Any ``nn.Module``.

    Returns:
        Dotted parameter names (as in ``model.named_parameters()``) that should be decayed.

    Example:
        >>> import torch
        >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
        >>> get_decay_parameter_names(m)
        ['0.weight']
    """
    return _decay_names(model)


def build_param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Split a model's trainable parameters into HF's two weight-decay groups.

    Args:
        model: The model whose parameters are optimized.
        weight_decay: Decay for group 0 (``TrainingArguments.weight_decay``).

    Returns:
        ``[{"params": decayed, "weight_decay": weight_decay}, {"params": others, "weight_decay": 0.0}]``.
        Both groups are always present (possibly empty); only parameters with ``requires_grad`` are kept,
        in ``model.named_parameters()`` order (tied parameters appear once).
    """
    decay = set(get_decay_parameter_names(model))
    decayed, others = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decayed if name in decay else others).append(param)
    return [
        {"params": decayed, "weight_decay": weight_decay},
        {"params": others, "weight_decay": 0.0},
    ]
