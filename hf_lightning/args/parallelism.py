"""``parallelism_config`` (accelerate's ``ParallelismConfig``) read into the process layout hf_lightning runs.

HF's Trainer hands the object to accelerate, which builds a device mesh of ``dp_replicate × dp_shard × cp × sp ×
tp`` processes. hf_lightning reads the sizes (duck-typed: accelerate is never imported) into a
:class:`ParallelismPlan` and runs it on Lightning (``trainer/strategies.py``):

- ``dp_shard_size > 1``: FSDP2 over the sharding dimension (``HFFSDP2Strategy``), with the ``fsdp_config`` plan;
- ``dp_replicate_size > 1`` with ``dp_shard_size > 1``: HSDP (each replica group shards, the replicas all-reduce);
- ``dp_replicate_size > 1`` alone: plain data parallelism, DDP (what accelerate runs: no dimension to shard);
- every size 1: nothing (accelerate makes it ``dp_replicate = number of processes``, DDP);
- ``tp_size > 1`` alone: tensor parallelism on a model already sharded by transformers
  (``from_pretrained(..., tp_plan="auto")``), as HF requires; every process of the group sees the same batches.

``tp_size`` with a data-parallel size, ``cp_size`` and ``sp_size`` above 1 are refused, each with its reason (see
:data:`REFUSED_SIZES`).
Pure: no Lightning, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ParallelismPlan", "REFUSED_SIZES", "data_parallel_layout", "parallelism_plan"]

_SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")

# HF's Trainer 5.23 with accelerate 1.15 refuses every ParallelismConfig whose sizes multiply to more than 1 on CPU
# processes (accelerate's MULTI_CPU is neither FSDP2 nor a multi-device type); measured under torchrun, gloo.
_HF_ON_CPU = ("HF's Trainer cannot run it on CPU processes either: accelerate refuses any ParallelismConfig there "
              "('only compatible DistributedType.FSDP (version 2) or DistributedType.Multi{Device} or "
              "DistributedType.DEEPSPEED, but got DistributedType.MULTI_CPU')")

#: The sizes hf_lightning refuses above 1, with why and what to do instead.
REFUSED_SIZES: dict[str, str] = {
    "cp_size": (
        "context parallelism is not supported. HF runs it through accelerate's FSDP2 with torch's ring attention "
        "(context_parallel over SDPA), on GPUs only; accelerate turns FSDP on only for GPU-family devices and "
        f"{_HF_ON_CPU}. Set cp_size=1"
    ),
    "sp_size": (
        "sequence parallelism (sp_backend='deepspeed', ALST/Ulysses) needs DeepSpeed on CUDA GPUs, which "
        "hf_lightning does not run this way. Set sp_size=1"
    ),
}


@dataclass(frozen=True)
class ParallelismPlan:
    """The process layout a ``parallelism_config`` asks for (every size at least 1)."""

    #: Replica groups: each holds a whole copy of the (sharded) model; gradients are all-reduced across them.
    dp_replicate: int = 1
    #: Processes one copy of the model is sharded over with FSDP2 (1: no sharding).
    dp_shard: int = 1
    #: Processes one layer's weights are split over (tensor parallelism; they all see the same batches).
    tp: int = 1

    @property
    def total_size(self) -> int:
        """Processes the layout needs (accelerate's ``total_size``)."""
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def strategy(self) -> str | None:
        """``"tp"``, ``"fsdp"`` (FSDP2, HSDP with replicas), ``"ddp"`` (replicas only) or ``None`` (every size 1)."""
        if self.tp > 1:
            return "tp"
        if self.dp_shard > 1:
            return "fsdp"
        if self.dp_replicate > 1:
            return "ddp"
        return None

    def check_world_size(self, world_size: int) -> None:
        """accelerate's rule: the sizes multiply to the number of processes (a layout of 1 fits any).

        Raises:
            ValueError: naming the sizes and the number of processes.
        """
        if self.total_size != 1 and self.total_size != world_size:
            raise ValueError(
                f"parallelism_config: dp_replicate_size ({self.dp_replicate}) x dp_shard_size ({self.dp_shard}) x "
                f"tp_size ({self.tp}) = {self.total_size} does not match the number of processes ({world_size}). "
                f"Adjust the sizes so they multiply to {world_size}, or launch {self.total_size} processes."
            )


def _size(config: Any, name: str) -> int:
    value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
    if value is None:  # accelerate reads an unset size from PARALLELISM_CONFIG_* or 1 in __post_init__
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"parallelism_config.{name}={value!r}: sizes are whole numbers of at least 1.")
    return value


def parallelism_plan(config: Any) -> ParallelismPlan | None:
    """Read ``args.parallelism_config`` (an accelerate ``ParallelismConfig``, or a dict with its size keys).

    Returns:
        The plan, or ``None`` when ``config`` is ``None``.

    Raises:
        ValueError: a size that is not a whole number of at least 1, an unknown key in a dict, or a refused
            dimension (``tp_size``, ``cp_size``, ``sp_size`` above 1), naming the setting and the fix.
    """
    if config is None:
        return None
    if isinstance(config, Mapping):
        unknown = sorted(set(config) - set(_SIZES) - {"cp_backend", "sp_backend"})
        if unknown:
            raise ValueError(f"parallelism_config: unknown keys {unknown}; the sizes are {list(_SIZES)}.")
    elif not any(hasattr(config, name) for name in _SIZES):
        raise ValueError(
            f"parallelism_config={config!r}: expected accelerate's ParallelismConfig (or a dict of its sizes "
            f"{list(_SIZES)})."
        )
    sizes = {name: _size(config, name) for name in _SIZES}
    for name, reason in REFUSED_SIZES.items():
        if sizes[name] > 1:
            raise ValueError(f"parallelism_config.{name}={sizes[name]}: {reason}.")
    if sizes["tp_size"] > 1 and sizes["dp_replicate_size"] * sizes["dp_shard_size"] > 1:
        raise ValueError(
            f"parallelism_config.tp_size={sizes['tp_size']} with dp_replicate_size={sizes['dp_replicate_size']} / "
            f"dp_shard_size={sizes['dp_shard_size']}: tensor parallelism combined with data parallelism is not "
            "supported yet (HF runs it on GPUs only; on CPU processes HF's Trainer refuses it too). Use tp_size alone, "
            "or the data-parallel sizes alone"
        )
    return ParallelismPlan(dp_replicate=sizes["dp_replicate_size"], dp_shard=sizes["dp_shard_size"],
                           tp=sizes["tp_size"])


def data_parallel_layout(world_size: int, rank: int, config: Any) -> tuple[int, int]:
    """``(processes with their own batches, this process's index among them)`` under ``config``: the tensor-parallel
    processes of a group share their batches (the tensor-parallel dimension is the innermost of the mesh)."""
    plan = parallelism_plan(config)
    tp = plan.tp if plan is not None and world_size % plan.tp == 0 else 1
    return world_size // tp, rank // tp
