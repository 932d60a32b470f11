"""GaLore / APOLLO parameter selection (``optim_target_modules``) and the layer-wise variants, with HF 5.23's rules.

The low-rank optimizers act on the weights of the ``nn.Linear`` modules that ``optim_target_modules`` names; every
other parameter goes into a plain group. The ``*_layerwise`` variants give each parameter its own optimizer (and
stepped by a hook as soon as that parameter's gradient is accumulated during the backward; the optimizer the loop
sees is a stand-in (:class:`LayerWiseDummyOptimizer`) whose ``step()`` changes nothing, as in HF.

HF quirk kept: its Trainer builds the scheduler on accelerate's wrapper of the stand-in, so ``get_scheduler``'s
per-parameter branch never runs: the schedule moves the stand-in's rate (the logged ``learning_rate``) while every
parameter's own optimizer keeps ``learning_rate`` unchanged.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable

import torch
from torch import nn

__all__ = [
    "LayerWiseDummyOptimizer",
    "low_rank_optimizer",
    "target_module_match",
]

logger = logging.getLogger(__name__)


def target_module_match(targets: str | list[str], name: str) -> tuple[bool, bool]:
    """Whether module ``name`` is one of ``optim_target_modules``, and whether it matched as a regex (HF's rule).

    A string is a regex matched against the whole name; a list matches a name equal to an item, containing an item,
    or fully matching an item as a regex.
    """
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None, targets != name
    if name in targets or any(target in name for target in targets):
        return True, False
    if any(re.fullmatch(target, name) for target in targets):
        return True, True
    return False, False


class LayerWiseDummyOptimizer(torch.optim.Optimizer):
    """The optimizer the loop sees under a layer-wise optimizer: the real ones live in ``optimizer_dict``.

    Like HF's, it holds one random 1x1 tensor (drawn from the global RNG, as HF's draws it) and its ``zero_grad``
    does nothing. Its ``step`` runs the closure it is given and updates nothing: Lightning's closure is where the
    gradient clipping and ``on_pre_optimizer_step`` happen, which HF runs before its (no-op) step too.
    """

    def __init__(self, optimizer_dict: dict[nn.Parameter, torch.optim.Optimizer] | None = None, **kwargs: Any):
        self.optimizer_dict = optimizer_dict
        super().__init__([torch.randn(1, 1)], {"lr": kwargs.get("lr", 1e-03)})

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        return closure() if closure is not None else None


def low_rank_optimizer(args: Any, model: nn.Module | None, name: str, cls: type, group_kwargs: dict[str, Any],
                       kwargs: dict[str, Any]) -> tuple[type, dict[str, Any]]:
    """``(cls, kwargs)`` for a GaLore / APOLLO optimizer: the target ``nn.Linear`` weights in a group of their own.

    Args:
        args: Training arguments (``optim_target_modules``, ``gradient_accumulation_steps``, the world size).
        model: The model.
        name: The ``optim`` value; ending in ``layerwise`` selects the layer-wise variant.
        cls: The optimizer class.
        group_kwargs: The low-rank options of the target group (``rank``, ``update_proj_gap``, ...).
        kwargs: The optimizer's keyword arguments (``lr``, ...); ``params`` (or, layer-wise, ``optimizer_dict``) is
            added.

    Raises:
        ValueError / TypeError / NotImplementedError: HF's errors, each naming the setting to change.
    """
    layerwise = name.lower().endswith("layerwise")
    if layerwise and int(getattr(args, "world_size", 1) or 1) > 1:
        raise NotImplementedError(f"Layer-wise {name} does not support DDP at this time")
    targets = args.optim_target_modules
    if targets is None:
        raise ValueError(f"You need to define `optim_target_modules` to use {name} optimizers")
    if not isinstance(targets, (list, str)):
        raise TypeError(
            f"`optim_target_modules` must be a list of strings, a regex string, or 'all-linear'. Got: {targets}"
        )
    if model is None:
        raise ValueError(f"You need to pass a model to initialize {name} optimizer.")
    all_linear = isinstance(targets, str) and targets.replace("_", "-") == "all-linear"
    target_names = []
    for module_name, module in model.named_modules():
        matched, is_regex = target_module_match(targets, module_name)
        if not isinstance(module, nn.Linear):
            if matched and not is_regex:
                logger.warning(f"{module_name} matched but ignored. {name} only supports linear layers.")
            continue
        if matched or all_linear:
            target_names.append(module_name + ".weight")
    if not target_names:
        raise ValueError(f"No target modules found for {name} ({targets}).")
    named = list(model.named_parameters())
    target = [p for n, p in named if n in target_names]
    others = [p for n, p in named if n not in target_names]
    groups = [{"params": others}, {"params": target, **group_kwargs}]
    if layerwise:
        if args.gradient_accumulation_steps != 1:
            raise ValueError(f"Layerwise {name} does not support gradient accumulation!")
        optimizers = {p: cls([{"params": [p]}], **kwargs) for p in others}
        optimizers.update({p: cls([{"params": [p], **group_kwargs}], **kwargs) for p in target})

        def step_parameter(param: nn.Parameter) -> None:
            if param.grad is not None:
                optimizers[param].step()
                optimizers[param].zero_grad()

        for param in model.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(step_parameter)
        cls = LayerWiseDummyOptimizer
        kwargs["optimizer_dict"] = optimizers
    kwargs["params"] = groups
    return cls, kwargs
