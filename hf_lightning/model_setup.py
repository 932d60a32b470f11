"""Per-``train()`` changes HF's Trainer makes to the model: activation checkpointing, NEFTune, torch.compile.

Each one is applied when ``fit`` starts and (where HF undoes it) removed when it ends, from
``HFLightningModule``, so the facade and the Lightning-native path behave alike.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hf_lightning._utils import unwrap_model

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments


def _base_model(model: nn.Module) -> nn.Module:
    model = unwrap_model(model)
    # A PEFT wrapper keeps the real model under base_model.model (HF reaches through it the same way).
    if type(model).__name__.startswith("Peft") and hasattr(model, "base_model"):
        return model.base_model.model
    return model


LIGER_MISSING = ("You have set `use_liger_kernel` to `True` but liger-kernel >= 0.3.0 is not available. Please "
                 "install it with `pip install liger-kernel`")


def apply_liger_kernel(model: nn.Module, kernel_config: dict | None) -> None:
    """HF's ``use_liger_kernel``: liger-kernel's fused (Triton, GPU) kernels patched into the model in place.

    As HF: a transformers model (also under a PEFT wrapper) is patched with ``liger_kernel_config`` as keyword
    arguments; any other model gets a warning and is left alone.

    Raises:
        ImportError: ``liger-kernel`` is not installed (HF's message).
    """
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
    except ImportError as error:
        raise ImportError(LIGER_MISSING) from error
    base = _base_model(model)
    if callable(getattr(base, "save_pretrained", None)) and hasattr(base, "config"):
        _apply_liger_kernel_to_instance(model=base, **(kernel_config or {}))
    else:
        warnings.warn("The model is not an instance of PreTrainedModel. No liger kernels will be applied.",
                      stacklevel=2)


def enable_activation_checkpointing(model: nn.Module, args: TrainingArguments) -> None:
    """HF's ``activation_checkpointing`` (4.x: ``gradient_checkpointing``) with its kwargs."""
    if not args.activation_checkpointing:
        return
    kwargs = dict(args.activation_checkpointing_kwargs or {})
    every_n_layers = kwargs.pop("every_n_layers", 1)
    offload = kwargs.pop("offload", False)
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or None,
                                              every_n_layers=every_n_layers, offload=offload)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)
    else:
        raise ValueError(
            f"activation_checkpointing=True needs a model with `activation_checkpointing_enable` or "
            f"`gradient_checkpointing_enable`; {type(model).__name__} has neither. Set activation_checkpointing="
            "False or wrap the layers with torch.utils.checkpoint yourself."
        )


def _neftune_hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    # Uniform noise scaled by alpha / sqrt(seq_len * hidden), in training mode only (NEFTune).
    if module.training:
        magnitude = module.neftune_noise_alpha / torch.sqrt(torch.tensor(output.size(1) * output.size(2)))
        output = output + torch.zeros_like(output).uniform_(-magnitude, magnitude)
    return output


def activate_neftune(model: nn.Module, alpha: float):
    """Add NEFTune noise to the input embeddings; returns the hook handle (``None`` when ``alpha`` is None)."""
    if alpha is None:
        return None
    if not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"neftune_noise_alpha must be a positive number, got {alpha}.")
    base = _base_model(model)
    if not hasattr(base, "get_input_embeddings"):
        raise ValueError(
            f"neftune_noise_alpha needs a model with `get_input_embeddings()`; {type(base).__name__} has none."
        )
    embeddings = base.get_input_embeddings()
    embeddings.neftune_noise_alpha = alpha
    return embeddings.register_forward_hook(_neftune_hook)


def compile_model(model: nn.Module, args: TrainingArguments) -> None:
    """``torch_compile``: compile the model in place (``nn.Module.compile`` keeps its state-dict keys)."""
    if not args.torch_compile:
        return
    kwargs = {"backend": args.torch_compile_backend or "inductor"}
    if args.torch_compile_mode:
        kwargs["mode"] = args.torch_compile_mode
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.compile(**kwargs)
