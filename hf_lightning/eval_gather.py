"""Bringing a sharded evaluation back together: every process's batch results, step by step, in dataset order.

Under several processes each one evaluates its own share of the eval set
(:class:`~hf_lightning.data.samplers.EvalShardBatchSampler`). After every batch, :class:`ShardGather` exchanges
what the accumulator keeps (losses, predictions, labels, inputs) so every process ends with the whole set, as HF's
``gather_for_metrics`` does, but without repeated examples. Gathering batch by batch keeps the transient memory at
one batch per process; nothing of the whole set is gathered at once.

Tensors of different sizes (a shorter last batch, other sequence lengths) are exchanged with their shapes first,
padded to the largest for the collective and trimmed back after it; the accumulator then pads sequences with
``-100`` as one process would. Processes can run different numbers of batches (their shares differ by up to one
example): a process past its last batch joins the remaining exchanges with nothing, so every collective is
matched. Under a strategy whose forward is itself a collective (FSDP gathers the parameters), that process also
runs an evaluation step it discards before each of those exchanges (the caller's ``before_empty_step``).
Pure torch: the collective is passed in (a tensor in, every process's tensor stacked out;
:func:`all_gather_world` over the default process group, which every data-parallel strategy sets up).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

__all__ = ["ShardGather", "all_gather_world"]


def all_gather_world(tensor: torch.Tensor) -> torch.Tensor:
    """Every process's ``tensor`` (same shape everywhere), stacked in rank order, over the default process group.

    Whatever the strategy (DDP, FSDP, ...), its processes form the default group; torch's collective is called
    directly (Lightning's ``all_gather`` goes through an autograd function torch deprecates, warning per call).
    """
    parts = [torch.empty_like(tensor) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(parts, tensor.contiguous())
    return torch.stack(parts)


def _flatten(value: Any, leaves: list[torch.Tensor]) -> Any:
    """``value``'s structure with each tensor replaced by its index in ``leaves`` (where it is appended)."""
    if isinstance(value, torch.Tensor):
        leaves.append(torch.atleast_1d(value))
        return len(leaves) - 1
    if isinstance(value, (list, tuple)):
        return type(value)(_flatten(v, leaves) for v in value)
    if isinstance(value, Mapping):
        return {k: _flatten(v, leaves) for k, v in value.items()}
    if value is None:
        return None
    raise TypeError(f"Cannot gather a {type(value).__name__} across processes; evaluation outputs must be tensors "
                    "(or tuples, lists and dicts of tensors).")


def _unflatten(spec: Any, leaves: Sequence[torch.Tensor]) -> Any:
    if isinstance(spec, int):
        return leaves[spec]
    if isinstance(spec, (list, tuple)):
        return type(spec)(_unflatten(s, leaves) for s in spec)
    if isinstance(spec, dict):
        return {k: _unflatten(s, leaves) for k, s in spec.items()}
    return None


class ShardGather:
    """The per-batch exchange of one sharded evaluation pass over one dataloader.

    Every process calls :meth:`gather` once per batch it evaluates, in order. Each call yields the exchanges that
    are complete: this step's, and, after the process's last batch, the remaining steps that the other processes
    still run (this one contributes nothing to them).

    Args:
        all_gather: the collective, ``tensor -> tensor of shape (world_size, *tensor.shape)`` (see
            :func:`all_gather_world`).
        rank: this process's rank.
        world_size: the number of processes.
        own_steps: how many batches this process evaluates in this pass.
        device: where the exchanged tensors go (the device the process group communicates from: the model's).

    Attributes:
        steps_per_rank: every process's number of batches (known after the first exchange).
        step: exchanges done so far.
    """

    def __init__(self, all_gather: Callable[[torch.Tensor], torch.Tensor], rank: int, world_size: int,
                 own_steps: int, device: torch.device | str = "cpu") -> None:
        self.all_gather = all_gather
        self.device = torch.device(device)
        self.rank = rank
        self.world_size = world_size
        self.own_steps = own_steps
        self.steps_per_rank: list[int] | None = None
        self.step = 0
        self._template: tuple[Any, list[torch.Tensor]] | None = None  # (structure, empty leaves)

    @property
    def total_steps(self) -> int:
        return max(self.steps_per_rank) if self.steps_per_rank is not None else self.own_steps

    @property
    def done(self) -> bool:
        """Whether the last exchange of the pass has happened (on every process alike)."""
        return self.steps_per_rank is not None and self.step >= self.total_steps

    def gather(self, value: Any, batch_size: int,
               before_empty_step: Callable[[], None] | None = None) -> Iterator[tuple[list[Any], list[int]]]:
        """Exchange this process's ``value`` (a batch's nested tensors, ``None`` entries allowed).

        Args:
            value: this batch's results.
            batch_size: its number of examples.
            before_empty_step: called before each exchange this process joins with nothing, to do the collectives
                the others do in their step (a forward under a strategy that shards the parameters).

        Yields:
            ``(values, batch_sizes)`` per completed exchange: every process's value in rank order (``None`` for
            a process that had no batch left) and its batch size (0 then).
        """
        yield self._exchange(value, batch_size)
        if self.step >= self.own_steps:
            while self.step < self.total_steps:
                if before_empty_step is not None:
                    before_empty_step()
                yield self._exchange(None, 0)

    def _exchange(self, value: Any, batch_size: int) -> tuple[list[Any], list[int]]:
        if value is not None:
            leaves: list[torch.Tensor] = []
            spec = _flatten(value, leaves)
            # What a process past its last batch sends: no rows, the same structure, dims and dtypes.
            self._template = (spec, [t.new_empty((0,) + tuple(t.shape[1:])) for t in leaves])
        elif self._template is not None:
            spec, leaves = self._template
        else:  # pragma: no cover - every process evaluates at least one batch before it has nothing left
            raise RuntimeError("A sharded evaluation process ran out of batches before its first one.")
        dims = [d for t in leaves for d in (t.dim(), *t.shape)]
        meta = torch.tensor([self.own_steps, batch_size, *dims], dtype=torch.long, device=self.device)
        metas = self.all_gather(meta).cpu().tolist()
        if self.steps_per_rank is None:
            self.steps_per_rank = [int(m[0]) for m in metas]
        shapes = [_shapes(m[2:]) for m in metas]
        gathered: list[list[torch.Tensor]] = [[] for _ in range(self.world_size)]
        for i, leaf in enumerate(leaves):
            biggest = [max(s[i][d] for s in shapes) for d in range(leaf.dim())]
            padded = leaf.to(self.device)
            if list(leaf.shape) != biggest:
                padded = leaf.new_zeros(biggest, device=self.device)
                padded[tuple(slice(0, n) for n in leaf.shape)] = leaf.to(self.device)
            is_bool = padded.dtype == torch.bool
            stacked = self.all_gather(padded.to(torch.uint8) if is_bool else padded.contiguous())
            for rank in range(self.world_size):
                part = stacked[rank][tuple(slice(0, n) for n in shapes[rank][i])]
                gathered[rank].append(part.bool() if is_bool else part)
        step = self.step
        self.step += 1
        present = [step < n for n in self.steps_per_rank]
        values = [_unflatten(spec, gathered[r]) if present[r] else None for r in range(self.world_size)]
        return values, [int(m[1]) for m in metas]


def _shapes(dims: list[int]) -> list[list[int]]:
    """``[ndim, *shape, ndim, *shape, ...]`` → the list of shapes."""
    shapes, i = [], 0
    while i < len(dims):
        n = int(dims[i])
        shapes.append([int(d) for d in dims[i + 1: i + 1 + n]])
        i += 1 + n
    return shapes
