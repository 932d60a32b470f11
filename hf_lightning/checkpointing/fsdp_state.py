"""How an FSDP2-sharded model (``fully_shard``) and its optimizer are saved into and loaded from a checkpoint folder.

Every process holds a shard, so gathering is a collective that every process runs (``gather`` and
``optimizer_state`` are called on all of them); only the saving process writes. With ``FULL_STATE_DICT`` (the
default) the folder is the one an unsharded run writes, so a one-process run, a DDP run and HF's Trainer read it as
they read their own:

- ``model.safetensors`` (+ ``config.json`` ...): the full weights, written by the model's ``save_pretrained`` with
  the gathered state dict (what HF's ``save_model`` does under FSDP);
- ``optimizer.pt``: the full optimizer state in ``torch.optim.Optimizer.state_dict()``'s own form (parameters
  numbered in the optimizer's order), gathered from the shards.

Loading reads those full files on every process and each process keeps its shard (``set_model_state_dict`` /
``set_optimizer_state_dict`` with ``full_state_dict=True``), so an unsharded run's checkpoint resumes under FSDP2 too.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from hf_lightning._utils import unwrap_model
from hf_lightning.checkpointing.errors import CheckpointLoadError
from hf_lightning.checkpointing.layout import SAFE_WEIGHTS_NAME, WEIGHTS_NAME
from hf_lightning.checkpointing.model_state import PlainModelState, WeightsLoadResult
from hf_lightning.checkpointing.safe_load import load_safetensors, safe_torch_load

__all__ = ["FSDP2ModelState", "is_fsdp2_model"]


def is_fsdp2_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` (possibly under ``.module``) was sharded with FSDP2's ``fully_shard``."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without distributed support
        return False
    return isinstance(unwrap_model(model), FSDPModule)


def _options(**kwargs: Any):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


class FSDP2ModelState(PlainModelState):
    """An FSDP2 model's state, stored full (``FULL_STATE_DICT``; see the module docstring)."""

    def prepare(self, model: torch.nn.Module) -> None:
        """Nothing to warm up (the plain kind's warm-up reads the model's config only)."""
        super().prepare(model)

    def gather(self, model: torch.nn.Module, folder: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
        """All-gather the full state dict onto the CPU (every process); the saving process (rank 0) gets it."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        unwrapped = unwrap_model(model)
        state_dict = get_model_state_dict(unwrapped, options=_options(cpu_offload=True))
        # A tied weight (GPT-2's lm_head shares wte) is stored once, under its first name, as HF stores it.
        unique = {name for name, _ in unwrapped.named_parameters()}
        tied = {name for name, _ in unwrapped.named_parameters(remove_duplicate=False)} - unique
        return unwrapped, {name: tensor for name, tensor in state_dict.items() if name not in tied}

    def write(self, gathered: tuple[torch.nn.Module, dict[str, torch.Tensor]], folder: str) -> None:
        """``save_pretrained(folder, state_dict=...)`` with the gathered weights (else ``model.safetensors``)."""
        model, state_dict = gathered
        save_pretrained = getattr(model, "save_pretrained", None)
        if callable(save_pretrained):
            save_pretrained(folder, state_dict=state_dict)
            return
        import safetensors.torch

        from hf_lightning.checkpointing.model_state import _standalone_tensors

        safetensors.torch.save_file(_standalone_tensors(state_dict), os.path.join(folder, SAFE_WEIGHTS_NAME),
                                    metadata={"format": "pt"})

    def check_loadable(self, model: torch.nn.Module) -> None:
        """Nothing to refuse: the full weights are written as ``model.safetensors``."""

    def load(self, model: torch.nn.Module, folder: str, strict: bool = False) -> WeightsLoadResult:
        """Read the full ``model.safetensors`` / ``pytorch_model.bin`` on every process; each keeps its shard.

        Raises:
            ValueError: ``Can't find a valid checkpoint at {folder}`` when neither file exists (HF's message).
            RuntimeError: ``strict=True`` and the keys do not match.
        """
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        unwrapped = unwrap_model(model)
        safe_file, pickle_file = os.path.join(folder, SAFE_WEIGHTS_NAME), os.path.join(folder, WEIGHTS_NAME)
        if os.path.isfile(safe_file):
            state_dict = load_safetensors(safe_file)
        elif os.path.isfile(pickle_file):
            state_dict = safe_torch_load(pickle_file)
            if not isinstance(state_dict, dict):
                raise CheckpointLoadError(pickle_file, "it does not hold a state dict")
        else:
            raise ValueError(f"Can't find a valid checkpoint at {folder}")
        # The keys of the model's state dict (its sharded form has the same keys and gathers nothing).
        names = set(get_model_state_dict(unwrapped))
        # A tied weight (GPT-2's lm_head shares wte) is stored once: give it the tensor it shares.
        for key in names - set(state_dict):
            tied = _tied_source(unwrapped, key)
            if tied in state_dict:
                state_dict[key] = state_dict[tied]
        result = WeightsLoadResult(sorted(names - set(state_dict)), sorted(set(state_dict) - names))
        if strict and (result.missing_keys or result.unexpected_keys):
            raise RuntimeError(
                f"Cannot load the weights at {folder} into {type(unwrapped).__name__}: missing keys "
                f"{result.missing_keys}, unexpected keys {result.unexpected_keys}."
            )
        set_model_state_dict(unwrapped, {k: v for k, v in state_dict.items() if k in names},
                             options=_options(strict=False))
        return result

    # ---- the optimizer ---------------------------------------------------------------------------------------

    def optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
        """The full optimizer state in ``Optimizer.state_dict()``'s form (every process; rank 0 gets it)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        full = get_optimizer_state_dict(unwrap_model(model), optimizer, options=_options(cpu_offload=True))
        if not full:
            return None
        index = {}
        groups = []
        for group in full["param_groups"]:
            ids = []
            for name in group["params"]:
                index[name] = len(index)
                ids.append(index[name])
            groups.append({**group, "params": ids})
        return {"state": {index[name]: value for name, value in full["state"].items()}, "param_groups": groups}

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load a full ``Optimizer.state_dict()``-form state (every process); each process keeps its shard."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        unwrapped = unwrap_model(model)
        # The optimizer's own parameter names, in its order (the same numbering the file uses).
        current = get_optimizer_state_dict(unwrapped, optimizer, options=_options())
        names = [name for group in current["param_groups"] for name in group["params"]]
        saved_groups = state["param_groups"]
        if len(saved_groups) != len(current["param_groups"]) or \
                sum(len(g["params"]) for g in saved_groups) != len(names):
            raise ValueError(
                "The optimizer state in the checkpoint does not match this optimizer (different parameter groups): "
                "resume with the same model and optimizer arguments."
            )
        position = {}
        for group in saved_groups:
            for pid in group["params"]:
                position[pid] = len(position)
        by_name = {
            "state": {names[position[pid]]: value for pid, value in state["state"].items()},
            "param_groups": [{**group, "params": [names[position[pid]] for pid in group["params"]]}
                             for group in saved_groups],
        }
        set_optimizer_state_dict(unwrapped, optimizer, by_name, options=_options())


def _tied_source(model: torch.nn.Module, key: str) -> str | None:
    """The name under which the parameter ``key`` shares its tensor with another parameter (tied weights)."""
    try:
        target = model.get_parameter(key)
    except AttributeError:
        return None
    for name, param in model.named_parameters(remove_duplicate=False):
        if param is target and name != key:
            return name
    return None
