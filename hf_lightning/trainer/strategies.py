"""HF's distributed arguments → a Lightning strategy, devices and nodes.

HF's Trainer learns the process layout from the launcher (``torchrun``, ``accelerate launch``, SLURM) and picks
DDP, FSDP or DeepSpeed from its arguments; Lightning needs ``devices``/``num_nodes``/``strategy``. The mapping
lives here, resolved through one registry, and each choice is returned as ``(strategy class, kwargs)`` so it can
be checked without building processes.

- ``deepspeed`` (a config dict or JSON path) → ``DeepSpeedStrategy(config=...)`` (needs the ``deepspeed``
  package and CUDA);
- ``fsdp`` + ``fsdp_config`` with ``version: 2`` (transformers 5.x's default) → ``HFFSDP2Strategy``, Lightning's
  ``ModelParallelStrategy`` sharding the model with FSDP2's ``fully_shard`` (``hf_lightning/sharding.py``; CPU/gloo
  or GPUs);
- ``fsdp`` + ``fsdp_config`` with ``version: 1`` → ``FSDPStrategy`` (sharding, auto-wrap policy, CPU offload,
  activation checkpointing, state-dict type; needs CUDA);
- ``parallelism_config`` (accelerate's ``ParallelismConfig``) → ``HFFSDP2Strategy`` over ``dp_shard_size`` (HSDP with
  ``dp_replicate_size``), ``DDPStrategy`` over ``dp_replicate_size`` alone, ``HFTensorParallelStrategy`` for
  ``tp_size`` alone;
- more than one process → ``DDPStrategy`` with HF's ``ddp_*`` options;
- one process → Lightning's ``"auto"``.
"""

from __future__ import annotations

import functools
import json
import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments


def process_layout() -> tuple[int, int]:
    """``(devices per node, nodes)`` from the launcher's environment (1, 1 when not launched distributed).

    torchrun / ``lightning run`` set ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``; under SLURM (``srun``) the task
    counts come from ``SLURM_NTASKS`` and ``SLURM_NNODES`` and Lightning's SLURM environment does the rest.
    """
    if "WORLD_SIZE" not in os.environ and int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1:
        tasks, nodes = int(os.environ["SLURM_NTASKS"]), int(os.environ.get("SLURM_NNODES", "1") or 1)
        return tasks // nodes, nodes
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)) or world)
    if world <= 1:
        return 1, 1
    if world % local:
        raise ValueError(f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local}.")
    return local, world // local


def _ddp(args: TrainingArguments, on_cpu: bool, world_size: int = 1) -> tuple[type, dict[str, Any]]:
    from lightning.pytorch.strategies import DDPStrategy

    kwargs: dict[str, Any] = {
        "process_group_backend": args.ddp_backend or ("gloo" if on_cpu else "nccl"),
        "timeout": timedelta(seconds=int(args.ddp_timeout)),
        # HF finds unused parameters unless told otherwise or activation checkpointing is on.
        "find_unused_parameters": bool(args.ddp_find_unused_parameters)
        if args.ddp_find_unused_parameters is not None
        else not args.activation_checkpointing,
    }
    for name, key in (("ddp_bucket_cap_mb", "bucket_cap_mb"), ("ddp_broadcast_buffers", "broadcast_buffers"),
                      ("ddp_static_graph", "static_graph")):
        value = getattr(args, name, None)
        if value is not None:
            kwargs[key] = value
    return DDPStrategy, kwargs


def _name_policy(names: tuple[str, ...]):
    """An FSDP auto-wrap / checkpointing policy matching modules by class name (resolved on the model later)."""
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    return functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda module: type(module).__name__ in names)


def _fsdp2(args: TrainingArguments, on_cpu: bool, world_size: int = 1,
           replicate: int = 1) -> tuple[type, dict[str, Any]]:
    from hf_lightning.sharding import HFFSDP2Strategy, fsdp2_plan

    # cpu_offload runs on CPU processes too (torch's CPUOffloadPolicy keeps the shards where they already are;
    # measured to train as without it), so it is not refused there.
    plan = fsdp2_plan(args)
    kwargs: dict[str, Any] = {"plan": plan, "world_size": world_size,
                              "timeout": timedelta(seconds=int(args.ddp_timeout))}
    if replicate > 1:
        kwargs["replicate"] = replicate
    if args.ddp_backend:
        kwargs["process_group_backend"] = args.ddp_backend
    return HFFSDP2Strategy, kwargs


def _fsdp(args: TrainingArguments, on_cpu: bool, world_size: int = 1) -> tuple[type, dict[str, Any]]:
    version = str((args.fsdp_config or {}).get("version", 2))
    if version not in ("1", "2"):
        raise ValueError(f"fsdp_config['version']={version}: FSDP versions are 1 and 2 (2 is the default).")
    if version == "2":
        return _fsdp2(args, on_cpu, world_size)
    if on_cpu:
        raise ValueError(
            "fsdp_config['version']=1 needs CUDA GPUs (Lightning's FSDPStrategy); this run is on the CPU. Use FSDP2 "
            "(fsdp_config['version']=2, the default), which runs on the CPU too, or run on GPUs."
        )
    from lightning.pytorch.strategies import FSDPStrategy

    config = dict(args.fsdp_config or {})
    kwargs: dict[str, Any] = {"timeout": timedelta(seconds=int(args.ddp_timeout))}
    reshard = config.get("reshard_after_forward", True)
    if isinstance(reshard, str):
        kwargs["sharding_strategy"] = reshard.upper()
    else:
        kwargs["sharding_strategy"] = "FULL_SHARD" if reshard else "SHARD_GRAD_OP"
    layers = tuple(config.get("transformer_layer_cls_to_wrap") or ())
    policy = config.get("auto_wrap_policy", "TRANSFORMER_BASED_WRAP")
    if layers and policy == "TRANSFORMER_BASED_WRAP":
        kwargs["auto_wrap_policy"] = _name_policy(layers)
    elif policy == "SIZE_BASED_WRAP" or config.get("min_num_params"):
        from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

        kwargs["auto_wrap_policy"] = functools.partial(
            size_based_auto_wrap_policy, min_num_params=int(config.get("min_num_params") or 1e8)
        )
    if config.get("cpu_offload") or config.get("offload_params"):
        kwargs["cpu_offload"] = True
    if config.get("activation_checkpointing"):
        if not layers:
            raise ValueError(
                "fsdp_config['activation_checkpointing']=True needs fsdp_config['transformer_layer_cls_to_wrap'] "
                "to know which layers to checkpoint."
            )
        kwargs["activation_checkpointing_policy"] = _name_policy(layers)
    state_dict_type = str(config.get("state_dict_type", "FULL_STATE_DICT")).upper()
    kwargs["state_dict_type"] = "sharded" if state_dict_type.startswith("SHARDED") else "full"
    return FSDPStrategy, kwargs


def _deepspeed(args: TrainingArguments, on_cpu: bool, world_size: int = 1) -> tuple[type, dict[str, Any]]:
    config = args.deepspeed
    if isinstance(config, (str, os.PathLike)):
        if not os.path.isfile(config):
            raise ValueError(f"deepspeed={config!r}: no such DeepSpeed config file.")
        with open(config) as f:
            config = json.load(f)
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        raise ValueError(
            "deepspeed=... needs the `deepspeed` package, which is not installed: pip install deepspeed"
        ) from None
    if on_cpu:
        raise ValueError("deepspeed needs CUDA GPUs; this run is on the CPU. Drop `deepspeed` or run on GPUs.")
    from lightning.pytorch.strategies import DeepSpeedStrategy

    return DeepSpeedStrategy, {"config": dict(config)}


def _parallelism(args: TrainingArguments, on_cpu: bool, world_size: int = 1) -> tuple[type, dict[str, Any]] | None:
    """``parallelism_config`` (sizes read by ``args/parallelism.py``): FSDP2 over ``dp_shard`` (HSDP with
    ``dp_replicate``), DDP over ``dp_replicate`` alone, nothing more for a layout of 1."""
    from hf_lightning.args.parallelism import parallelism_plan

    plan = parallelism_plan(args.parallelism_config)
    plan.check_world_size(world_size)
    if plan.total_size == 1 and world_size == 1:
        # One process: accelerate returns before checking the layout, so the other arguments decide.
        name = strategy_name(args, world_size, parallelism=False)
        return None if name is None else STRATEGY_REGISTRY[name](args, on_cpu, world_size)
    if args.deepspeed:
        raise ValueError(
            "parallelism_config with deepspeed: DeepSpeed shards the model itself. Remove parallelism_config (or "
            "deepspeed)."
        )
    fsdp_version = str((args.fsdp_config or {}).get("version", 2)) if args.fsdp else None
    if fsdp_version not in (None, "1", "2"):
        raise ValueError(f"fsdp_config['version']={fsdp_version}: FSDP versions are 1 and 2 (2 is the default).")
    if plan.strategy == "fsdp":
        if fsdp_version == "1":
            raise ValueError(
                "parallelism_config.dp_shard_size > 1 with fsdp_config['version']=1: accelerate shards a "
                "ParallelismConfig's dp_shard dimension with FSDP2 only. Use fsdp_config['version']=2 (the default)."
            )
        return _fsdp2(args, on_cpu, world_size, replicate=plan.dp_replicate)
    if fsdp_version is not None and world_size > 1:
        # accelerate's own check: FSDP with a layout that has no dimension to shard across.
        raise ValueError(
            f"fsdp with parallelism_config (dp_replicate_size={plan.dp_replicate}, dp_shard_size=1): FSDP has no "
            "dimension to shard across. Set parallelism_config.dp_shard_size > 1, or remove fsdp (plain data "
            "parallelism) or parallelism_config."
        )
    if plan.strategy == "tp":
        from hf_lightning.tensor_parallel import HFTensorParallelStrategy

        kwargs: dict[str, Any] = {"tp_size": plan.tp, "timeout": timedelta(seconds=int(args.ddp_timeout))}
        if args.ddp_backend:
            kwargs["process_group_backend"] = args.ddp_backend
        return HFTensorParallelStrategy, kwargs
    return _ddp(args, on_cpu, world_size) if world_size > 1 else None


STRATEGY_REGISTRY = {"ddp": _ddp, "fsdp": _fsdp, "deepspeed": _deepspeed, "parallelism": _parallelism}


def strategy_name(args: TrainingArguments, world_size: int, parallelism: bool = True) -> str | None:
    """Which registry entry ``args`` selects (``None``: Lightning's default for one process); with
    ``parallelism=False``, as if ``parallelism_config`` were unset."""
    if parallelism and args.parallelism_config is not None:
        return "parallelism"
    if args.deepspeed:
        return "deepspeed"
    if args.fsdp:
        return "fsdp"
    if world_size > 1:
        return "ddp"
    return None


def resolve_strategy(args: TrainingArguments, world_size: int, on_cpu: bool) -> tuple[type, dict[str, Any]] | None:
    """``(strategy class, kwargs)`` for ``args`` on ``world_size`` processes, or ``None`` for one plain process.

    Raises:
        ValueError: a combination that cannot run here (FSDP1/DeepSpeed on the CPU, DeepSpeed not installed, ...).
    """
    name = strategy_name(args, world_size)
    if name is None:
        return None
    return STRATEGY_REGISTRY[name](args, on_cpu, world_size)


def cpu_run(args: TrainingArguments) -> bool:
    return bool(args.use_cpu) or not torch.cuda.is_available()
