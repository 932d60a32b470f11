"""Tensor parallelism: ``parallelism_config.tp_size`` on Lightning's ``ModelParallelStrategy``.

HF's Trainer does not split a model itself: the model must come tensor-parallel from transformers
(``from_pretrained(..., tp_plan="auto")`` or ``distributed_config=DistributedConfig(tp_size=N)``, which shard the
layers named in the model's ``base_model_tp_plan`` as DTensors), and accelerate checks that its ``tp_size`` is the
configured one. Every process of the group sees the same batches; HF divides ``num_items_in_batch`` by ``tp_size``
and scales the loss by ``processes // tp_size``. The parameters the plan leaves whole (norms) stay plain tensors,
so the gradients live on two kinds of device (a mesh and none): their norm is taken per kind and combined, as
HF's ``_mixed_mesh_grad_norm`` does.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

__all__ = ["HFTensorParallelStrategy", "clip_grad_norm_by_mesh", "has_mixed_meshes", "model_tp_size"]


def _mesh_of(tensor: Any) -> Any:
    return getattr(tensor, "device_mesh", None)


def model_tp_size(model: nn.Module) -> int | None:
    """The tensor-parallel size transformers sharded ``model`` with (``None``: not tensor-parallel)."""
    size = getattr(model, "_tp_size", None) or getattr(model, "tp_size", None)
    has_dtensor = any(_mesh_of(p) is not None for p in model.parameters())
    return int(size) if size and has_dtensor else None


def has_mixed_meshes(params: list[nn.Parameter]) -> bool:
    """Whether ``params`` live on more than one device mesh (plain tensors count as one)."""
    return len({id(_mesh_of(p)) if _mesh_of(p) is not None else None for p in params}) > 1


def clip_grad_norm_by_mesh(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """The norm of every gradient (one norm per mesh, each reduced over it, then combined), clipped to
    ``max_norm``; ``clip_grad_norm_`` cannot take DTensors and plain tensors together."""
    from torch.nn.utils import clip_grads_with_norm_, get_total_norm

    groups: dict[Any, list[nn.Parameter]] = defaultdict(list)
    for param in params:
        if param.grad is not None:
            groups[_mesh_of(param.grad)].append(param)
    norms = []
    for group in groups.values():
        norm = get_total_norm([p.grad for p in group])
        norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    total = torch.linalg.vector_norm(torch.stack(norms))
    if max_norm != math.inf:
        for group in groups.values():
            clip_grads_with_norm_(group, max_norm, total)
    return total


class HFTensorParallelStrategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` with one tensor-parallel dimension over every process.

    Args:
        tp_size: Processes in the tensor-parallel group (the number of processes).
        **kwargs: ``ModelParallelStrategy``'s own (``process_group_backend``, ``timeout``).
    """

    def __init__(self, tp_size: int, **kwargs: Any) -> None:
        super().__init__(data_parallel_size=1, tensor_parallel_size=tp_size, save_distributed_checkpoint=False,
                         **kwargs)
        self.tp_size = tp_size

    def check_model(self, model: nn.Module) -> None:
        """HF's (accelerate's) check, at ``configure_model``: the model is tensor-parallel with this ``tp_size``.

        Raises:
            ValueError: the model is not tensor-parallel, or with another size.
        """
        size = model_tp_size(model)
        if size is None:
            raise ValueError(
                f"parallelism_config.tp_size={self.tp_size}: the model is not tensor-parallel. Load it sharded, as "
                "HF requires: from_pretrained(..., tp_plan='auto') (or distributed_config=DistributedConfig("
                f"tp_size={self.tp_size})) under the same launcher."
            )
        if size != self.tp_size:
            raise ValueError(
                f"parallelism_config.tp_size={self.tp_size}, but the model was loaded with tp_size={size}; make them "
                "equal."
            )
