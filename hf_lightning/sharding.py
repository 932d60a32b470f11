"""FSDP2: HF's ``fsdp`` / ``fsdp_config`` (version 2, transformers 5.x's default) on Lightning's
``ModelParallelStrategy``.

HF's Trainer hands FSDP2 to accelerate, which shards the model in place with ``torch.distributed.fsdp.fully_shard``.
Lightning's ``ModelParallelStrategy`` runs FSDP2 too, but leaves the sharding to the LightningModule's
``configure_model``. This module holds both halves:

- :class:`FSDP2Plan`, what ``fsdp_config`` asks for, read as transformers 5.23 / accelerate read it
  (:func:`fsdp2_plan`);
- :func:`shard_model`, which applies it the way accelerate's FSDP2 preparation does: activation checkpointing on
  the matched layers first, then ``fully_shard`` on every matched module bottom-up, then one group for the final
  norm and the output embedding (with the input embedding when tied, kept gathered after the forward; other
  modules holding the input embedding's weight join its group), then the root, whose ``generate`` is registered as
  an FSDP forward method;
- :class:`HFFSDP2Strategy`, a ``ModelParallelStrategy`` with one data-parallel dimension over every process that
  carries the plan, and whose ``block_backward_sync`` is FSDP2's (``set_requires_gradient_sync(False)``: the
  gradients of a window's earlier micro-batches stay unsharded and local, reduce-scattered once in the last
  backward, as accelerate's ``no_sync`` does).

``HFLightningModule.configure_model`` calls :func:`shard_model` when the run's strategy is an :class:`HFFSDP2Strategy`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from hf_lightning import _compat

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments

logger = logging.getLogger(__name__)

__all__ = ["FSDP2Plan", "HFFSDP2Strategy", "fsdp2_plan", "full_state_dict", "is_sharded", "shard_model"]


def _flag(value: Any) -> bool:
    """HF reads ``fsdp_config`` flags through ``str(value).lower()`` (``"true"``, ``"1"``, ``"yes"`` ...)."""
    text = str(value).lower()
    if text in ("y", "yes", "t", "true", "on", "1"):
        return True
    if text in ("n", "no", "f", "false", "off", "0"):
        return False
    raise ValueError(f"fsdp_config: {value!r} is not a true/false value (use true or false).")


@dataclass(frozen=True)
class FSDP2Plan:
    """How to shard a model, from ``fsdp_config`` (see :func:`fsdp2_plan`)."""

    #: Class names of the layers that get their own FSDP group (``None``: the model's ``_no_split_modules``).
    layer_classes: tuple[str, ...] | None = None
    #: ``"TRANSFORMER_BASED_WRAP"``, ``"SIZE_BASED_WRAP"`` or ``"NO_WRAP"``.
    wrap_policy: str = "TRANSFORMER_BASED_WRAP"
    #: With ``SIZE_BASED_WRAP``: a module with more parameters than this gets its own group (0: none does).
    min_num_params: int = 0
    #: Free the gathered parameters after each layer's forward (``full_shard``) or keep them (``shard_grad_op``).
    reshard_after_forward: bool = True
    #: Keep the sharded parameters, gradients and optimizer state on the CPU.
    cpu_offload: bool = False
    #: Recompute the matched layers' activations in the backward.
    activation_checkpointing: bool = False
    #: Compute dtype of the gathered parameters and of the gradient reduction (``None``: the parameters' own).
    param_dtype: torch.dtype | None = None
    #: ``FULL_STATE_DICT`` or ``SHARDED_STATE_DICT``: how checkpoints store the model.
    state_dict_type: str = "FULL_STATE_DICT"


def fsdp2_plan(args: TrainingArguments) -> FSDP2Plan:
    """Read ``args.fsdp_config`` (already normalised by ``TrainingArguments``) as transformers 5.23 does.

    - ``transformer_layer_cls_to_wrap`` names the layer classes; without it the model's ``_no_split_modules``;
    - ``auto_wrap_policy="SIZE_BASED_WRAP"`` with ``min_num_params > 0`` wraps by size instead;
    - ``reshard_after_forward`` (``fsdp="full_shard"`` → True, ``"shard_grad_op"`` → False);
    - ``cpu_offload`` (``fsdp="... offload"``), ``activation_checkpointing``, ``state_dict_type``;
    - ``bf16=True`` / ``fp16=True`` → gathered parameters and reductions in that dtype (accelerate's FSDP2 mixed
      precision policy).

    Raises:
        ValueError: a flag that is not true/false, an unknown ``state_dict_type`` (names the key).
    """
    config = dict(args.fsdp_config or {})
    policy = str(config.get("auto_wrap_policy", "TRANSFORMER_BASED_WRAP"))
    layers = config.get("transformer_layer_cls_to_wrap")
    state_dict_type = str(config.get("state_dict_type", "FULL_STATE_DICT")).upper()
    if state_dict_type not in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
        raise ValueError(
            f"fsdp_config['state_dict_type']={config.get('state_dict_type')!r}: FSDP2 checkpoints are "
            "FULL_STATE_DICT or SHARDED_STATE_DICT."
        )
    param_dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
    return FSDP2Plan(
        layer_classes=tuple(layers) if layers else None,
        wrap_policy=policy,
        min_num_params=int(config.get("min_num_params") or 0),
        reshard_after_forward=_flag(config.get("reshard_after_forward", True)),
        cpu_offload=_flag(config.get("cpu_offload", False)),
        activation_checkpointing=_flag(config.get("activation_checkpointing", False)),
        param_dtype=param_dtype,
        state_dict_type=state_dict_type,
    )


def _bottom_up(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``model``'s sub-modules, each after all of its children, ``model`` itself last (accelerate's order)."""
    stack: list[tuple[str, nn.Module]] = [("", model)]
    ordered: list[tuple[str, nn.Module]] = []
    while stack:
        name, module = stack.pop()
        for child_name, child in module.named_children():
            stack.append((f"{name}.{child_name}" if name else child_name, child))
        ordered.append((name, module))
    return ordered[::-1]


def _layer_matcher(model: nn.Module, plan: FSDP2Plan):
    """The predicate choosing the modules that get their own FSDP group (and activation checkpointing)."""
    if plan.wrap_policy == "SIZE_BASED_WRAP":
        def by_size(module: nn.Module) -> bool:
            # A container without a forward (ModuleList, ModuleDict) cannot be sharded: torch refuses it, which
            # makes HF's own size-based wrap fail on any model that keeps its layers in a ModuleList.
            if type(module).forward is nn.Module.forward:
                return False
            return sum(p.numel() for p in module.parameters()) > plan.min_num_params

        return by_size
    if plan.wrap_policy != "TRANSFORMER_BASED_WRAP":
        return None
    names = plan.layer_classes if plan.layer_classes is not None else tuple(
        getattr(model, "_no_split_modules", None) or ())
    present = {type(m).__name__ for m in model.modules()}
    missing = [name for name in names if name not in present]
    if missing:
        raise ValueError(
            f"fsdp_config['transformer_layer_cls_to_wrap']: no module of class {missing} in "
            f"{type(model).__name__}. Name the model's layer class (e.g. one of {sorted(present)[:8]})."
        )
    # Resolved to classes now: fully_shard gives a sharded module a new class (FSDPGPT2Block), a subclass of its own.
    classes = tuple({type(m) for m in model.modules() if type(m).__name__ in set(names)})

    def by_class(module: nn.Module) -> bool:
        return bool(classes) and isinstance(_compat.checkpoint_wrapped_inner(module), classes)

    return by_class


def is_sharded(model: nn.Module) -> bool:
    """Whether ``fully_shard`` was applied to ``model`` (its root)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard_model(model: nn.Module, plan: FSDP2Plan, mesh: Any = None) -> nn.Module:
    """Apply ``plan`` to ``model`` in place (accelerate's FSDP2 preparation order); a sharded model is left alone.

    Args:
        model: The (unwrapped) model, on its device.
        plan: What to do, from :func:`fsdp2_plan`.
        mesh: The device mesh to shard over (``None``: every process); 2-D (replicate, shard) for HSDP.

    Returns:
        ``model``, now an ``FSDPModule``.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if is_sharded(model):
        return model
    match = _layer_matcher(model, plan)
    if plan.activation_checkpointing and match is not None:
        for name, module in _bottom_up(model)[:-1]:
            if match(module):
                model.set_submodule(name, _compat.checkpoint_wrapper(module))
    kwargs: dict[str, Any] = {
        "reshard_after_forward": plan.reshard_after_forward,
        "offload_policy": CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if plan.cpu_offload
        else OffloadPolicy(),
        "mp_policy": MixedPrecisionPolicy(param_dtype=plan.param_dtype, reduce_dtype=plan.param_dtype)
        if plan.param_dtype is not None else MixedPrecisionPolicy(),
        "mesh": mesh,
    }
    if plan.param_dtype is not None:
        # accelerate keeps trainable parameters in fp32 under mixed precision (the policy casts the gathered copy).
        for param in model.parameters():
            if param.requires_grad and param.dtype != torch.float32:
                param.data = param.data.float()
    embed_in = getattr(model, "get_input_embeddings", lambda: None)()
    embed_out = getattr(model, "get_output_embeddings", lambda: None)()
    tied = getattr(embed_in, "weight", None) is not None and getattr(embed_in, "weight", None) is getattr(
        embed_out, "weight", None)
    # Other modules holding the input embedding's weight (T5's encoder/decoder `embed_tokens`, tied to `shared`)
    # join its group: left to the root, they would put the parameter in two groups, which torch refuses.
    sharers = _weight_sharers(model, embed_in)
    tied_set = [embed_in, *sharers, embed_out] if tied else [embed_in, *sharers] if sharers else []

    def splits_tied_weight(module: nn.Module) -> bool:
        # A group holding one of two tied embeddings but not the other would own a parameter it shares, which
        # torch refuses (a size-based wrap can pick such a module); the set gets its own group below.
        inside = {id(m) for m in module.modules()}
        return len({id(m) in inside for m in tied_set}) > 1

    if match is not None:
        for _, module in _bottom_up(model)[:-1]:
            if match(module) and not isinstance(module, FSDPModule) and not splits_tied_weight(module):
                fully_shard(module, **kwargs)
    # Modules inside a group already (a size-based wrap can take a whole sub-model) are left to that group.
    grouped = {id(m) for group in model.modules() if isinstance(group, FSDPModule) for m in group.modules()}
    if not tied and isinstance(embed_in, nn.Module) and id(embed_in) not in grouped:
        fully_shard([embed_in, *sharers] if sharers else embed_in, **kwargs)
    tail = (_final_norm(model), embed_in, *sharers, embed_out) if tied else (_final_norm(model), embed_out)
    tail = [m for m in tail if isinstance(m, nn.Module) and id(m) not in grouped]
    if tail:
        fully_shard(tail, **{**kwargs, "reshard_after_forward": False})
    # The root's own leftovers: torch's default (kept gathered after the forward) for the root.
    fully_shard(model, **{k: v for k, v in kwargs.items() if k != "reshard_after_forward"})
    if callable(getattr(model, "generate", None)):
        # generate calls sub-modules (T5's encoder) outside the root's forward: it runs the root's hooks too, as in
        # HF's Trainer, so the root's parameters are gathered around it.
        from torch.distributed.fsdp import register_fsdp_forward_method

        register_fsdp_forward_method(model, "generate")
    return model


def _weight_sharers(model: nn.Module, embedding: Any) -> list[nn.Module]:
    """The modules other than ``embedding`` (and the output embedding) whose own ``weight`` is ``embedding``'s."""
    weight = getattr(embedding, "weight", None)
    if not isinstance(weight, nn.Parameter):
        return []
    out = getattr(model, "get_output_embeddings", lambda: None)()
    return [m for m in model.modules() if m is not embedding and m is not out
            and any(p is weight for p in m.parameters(recurse=False))]


def _final_norm(model: nn.Module) -> nn.Module | None:
    """The last normalisation layer among the base model's direct children (GPT-2's ``ln_f``, Llama's ``norm``)."""
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else model
    if not isinstance(base, nn.Module):
        return None
    found = None
    for _, module in base.named_children():
        if "Norm" in type(module).__name__:
            found = module
    return found


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict, gathered on the CPU (a collective: call it on every process).

    Returns the full dict on every process (``get_model_state_dict(full_state_dict=True, cpu_offload=True)``
    returns an empty dict on the processes other than 0).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


class HFFSDP2Strategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` as HF's FSDP2 run uses it: every process shards one model.

    Args:
        plan: What ``fsdp_config`` asks for (:func:`fsdp2_plan`).
        world_size: Processes in the run; they form the one data-parallel dimension (no tensor parallelism).
        replicate: Replica groups (``parallelism_config.dp_replicate_size``): above 1, HSDP, each group of
            ``world_size // replicate`` processes shards one copy and the copies' gradients are all-reduced.
        **kwargs: ``ModelParallelStrategy``'s own (``process_group_backend``, ``timeout``).
    """

    def __init__(self, plan: FSDP2Plan, world_size: int, replicate: int = 1, **kwargs: Any) -> None:
        if replicate < 1 or world_size % replicate:
            raise ValueError(f"HFFSDP2Strategy: replicate={replicate} does not divide world_size={world_size}.")
        super().__init__(data_parallel_size=world_size, tensor_parallel_size=1,
                         save_distributed_checkpoint=plan.state_dict_type == "SHARDED_STATE_DICT", **kwargs)
        self.plan = plan
        self.replicate = replicate
        self._shard_mesh: Any = None

    def setup_environment(self) -> None:
        super().setup_environment()
        if self.replicate > 1:
            # HSDP: fully_shard on a 2-D mesh replicates over its first dimension and shards over the second
            # (accelerate's ("dp_replicate", "dp_shard_cp") mesh). Every process builds it: a collective.
            from torch.distributed.device_mesh import init_device_mesh

            self._shard_mesh = init_device_mesh(
                self.root_device.type, (self.replicate, self.world_size // self.replicate),
                mesh_dim_names=("dp_replicate", "dp_shard"))

    def shard(self, model: nn.Module) -> nn.Module:
        """Shard ``model`` over the data-parallel dimension (``configure_model``); idempotent."""
        mesh = self._shard_mesh if self._shard_mesh is not None else self.device_mesh["data_parallel"]
        return shard_model(model, self.plan, mesh)

    @contextlib.contextmanager
    def block_backward_sync(self) -> Generator[None, None, None]:
        """Keep this backward's gradients local and unsharded (FSDP2's ``no_sync``): reduced with the next one."""
        from torch.distributed.fsdp import FSDPModule

        modules = [m for m in self.model.modules() if isinstance(m, FSDPModule)] if self.model is not None else []
        for module in modules:
            module.set_requires_gradient_sync(False, recurse=False)
        try:
            yield
        finally:
            for module in modules:
                module.set_requires_gradient_sync(True, recurse=False)
