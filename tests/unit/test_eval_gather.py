"""Sharded evaluation without processes: two ranks are threads joined by an in-memory ``all_gather``.

The exchange (``ShardGather``) pads and trims tensors of different shapes and lets a rank with fewer batches join
the remaining exchanges; two sharded ``EvalAccumulator``s end with exactly what one accumulator fed the one-process
batches computes.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hf_lightning.data.samplers import EvalShardBatchSampler
from hf_lightning.eval_gather import ShardGather
from hf_lightning.evaluation import EvalAccumulator


class ThreadGroup:
    """``all_gather`` between threads: each rank's tensor, stacked in rank order."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.slots: list = [None] * world
        self.barrier = threading.Barrier(world, timeout=20)

    def all_gather(self, rank: int):
        def gather(tensor: torch.Tensor) -> torch.Tensor:
            self.slots[rank] = tensor.clone()
            self.barrier.wait()
            stacked = torch.stack(list(self.slots))
            self.barrier.wait()
            return stacked

        return gather


def run_ranks(world: int, body) -> list:
    group, results, errors = ThreadGroup(world), [None] * world, []

    def target(rank: int) -> None:
        try:
            results[rank] = body(rank, group.all_gather(rank))
        except BaseException as error:  # noqa: BLE001 - re-raised in the test thread
            errors.append(error)
            group.barrier.abort()

    threads = [threading.Thread(target=target, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def test_exchange_pads_trims_and_lets_a_shorter_rank_finish():
    # Rank 0 has two batches, rank 1 one; shapes differ on every dim but the last; a bool and a nested leaf.
    batches = {
        0: [{"x": torch.arange(6.0).reshape(2, 3), "m": (torch.tensor([True, False]),)},
            {"x": torch.ones(1, 5), "m": (torch.tensor([True]),)}],
        1: [{"x": torch.full((3, 2), 7.0), "m": (torch.tensor([False, True, True]),)}],
    }

    def body(rank, all_gather):
        gather = ShardGather(all_gather, rank, 2, own_steps=len(batches[rank]))
        out = []
        for batch in batches[rank]:
            out.extend(gather.gather(batch, batch_size=batch["x"].shape[0]))
        assert gather.done and gather.steps_per_rank == [2, 1]
        return out

    for steps in run_ranks(2, body):
        assert len(steps) == 2
        (first, sizes0), (second, sizes1) = steps
        assert sizes0 == [2, 3] and sizes1 == [1, 0]
        assert torch.equal(first[0]["x"], batches[0][0]["x"]) and torch.equal(first[1]["x"], batches[1][0]["x"])
        assert torch.equal(first[1]["m"][0], batches[1][0]["m"][0]) and first[1]["m"][0].dtype == torch.bool
        assert torch.equal(second[0]["x"], batches[0][1]["x"]) and second[1] is None


N_CLASSES = 5


def model_outputs(indices: list[int], batch_size: int):
    """What a prediction step returns for these examples: a per-sample length that depends on the one-process
    batch (so parts of a split batch match), the loss the mean of per-sample losses."""
    length = 2 + (indices[0] // batch_size) % 3
    idx = torch.tensor(indices, dtype=torch.float32)
    logits = idx[:, None, None] + torch.arange(length * N_CLASSES, dtype=torch.float32).reshape(1, length, N_CLASSES)
    labels = (torch.tensor(indices)[:, None] + torch.arange(length)) % N_CLASSES
    loss = (idx * 0.1 + 1).mean()
    return loss, logits / 10, labels


@pytest.mark.parametrize("n", [9, 12])  # 9: the batch [3, 4, 5] is split between the ranks; 12: no split
@pytest.mark.parametrize("concat,accumulation", [(True, None), (True, 1), (False, None), (False, 2)])
@pytest.mark.parametrize("full_batch_loss", [False, True])
def test_two_sharded_accumulators_equal_one(n, concat, accumulation, full_batch_loss):
    batch_size, world = 3, 2
    args = SimpleNamespace(eval_do_concat_batches=concat, eval_accumulation_steps=accumulation,
                           include_for_metrics=["inputs", "loss"], batch_eval_metrics=False,
                           logging_nan_inf_filter=True)

    def evaluate(batches, gather=None, batch_ids=None):
        seen = []
        def rows(p):
            seen.append(p)
            return {"n": len(p.label_ids) if concat else sum(len(batch) for batch in p.label_ids)}

        acc = EvalAccumulator(args, compute_metrics=rows,
                              gather=gather, batch_ids=batch_ids)
        for indices in batches:
            loss, logits, labels = model_outputs(indices, batch_size)
            acc.add(loss, logits, labels, len(indices), inputs_for_metrics=labels + 100,
                    loss_repeats=batch_size if full_batch_loss else None)
        return acc.finalize(), seen[0], acc.observed

    one_process = [list(range(i, min(i + batch_size, n))) for i in range(0, n, batch_size)]
    (preds, labels, metrics, _), pred, observed = evaluate(one_process)

    def body(rank, all_gather):
        shard = EvalShardBatchSampler(range(n), batch_size, False, world, rank)
        gather = ShardGather(all_gather, rank, world, own_steps=len(shard))
        return evaluate(list(shard), gather, [shard.batch_ids(r) for r in range(world)])

    for (s_preds, s_labels, s_metrics, _), s_pred, s_observed in run_ranks(world, body):
        assert s_observed == observed == n
        assert s_metrics["eval_loss"] == pytest.approx(metrics["eval_loss"], rel=1e-6)
        assert s_metrics["eval_n"] == n
        for ours, theirs in [(s_preds, preds), (s_labels, labels), (s_pred.inputs, pred.inputs),
                             (s_pred.losses, pred.losses)]:
            if concat:
                ours, theirs = [ours], [theirs]
            assert len(ours) == len(theirs)
            for a, b in zip(ours, theirs):
                assert a.shape == b.shape and a.dtype == b.dtype
                np.testing.assert_allclose(a, b, rtol=1e-6)


def test_batchwise_compute_metrics_sees_every_example_once():
    n, batch_size, world = 9, 3, 2
    args = SimpleNamespace(eval_do_concat_batches=True, eval_accumulation_steps=None, include_for_metrics=["loss"],
                           batch_eval_metrics=True, logging_nan_inf_filter=True)

    def body(rank, all_gather):
        totals = {"rows": 0, "label_sum": 0, "loss_sum": 0.0}

        def batch_metrics(p, compute_result):
            totals["rows"] += len(p.label_ids)
            totals["label_sum"] += int(p.label_ids[p.label_ids != -100].sum())
            totals["loss_sum"] += float(p.losses.sum())
            return dict(totals) if compute_result else {}

        shard = EvalShardBatchSampler(range(n), batch_size, False, world, rank)
        acc = EvalAccumulator(args, compute_metrics=batch_metrics,
                              gather=ShardGather(all_gather, rank, world, own_steps=len(shard)),
                              batch_ids=[shard.batch_ids(r) for r in range(world)])
        for indices in shard:
            loss, logits, labels = model_outputs(indices, batch_size)
            acc.add(loss, logits, labels, len(indices))
        return acc.finalize()[2]

    expected_labels = sum(int(model_outputs(list(range(i, i + 3)), 3)[2].sum()) for i in range(0, n, 3))
    for metrics in run_ranks(world, body):
        assert metrics["eval_rows"] == n and metrics["eval_label_sum"] == expected_labels
        # Each part of the split batch carries its own mean loss per sample: the sum over samples is the same.
        assert metrics["eval_loss_sum"] == pytest.approx(sum(i * 0.1 + 1 for i in range(n)), rel=1e-6)


def test_a_finished_rank_runs_the_lockstep_step_before_each_empty_exchange():
    # Under a strategy whose forward is a collective, the rank with fewer batches must run one forward per step the
    # others still evaluate, before joining their exchange.
    own = {0: 1, 1: 3}
    calls = {0: 0, 1: 0}

    def body(rank, all_gather):
        gather = ShardGather(all_gather, rank, 2, own_steps=own[rank])

        def forward():
            calls[rank] += 1

        steps = []
        for _ in range(own[rank]):
            steps.extend(gather.gather({"x": torch.ones(2)}, 2, before_empty_step=forward))
        return [sizes for _, sizes in steps]

    results = run_ranks(2, body)
    assert calls == {0: 2, 1: 0}
    assert results[0] == results[1] == [[2, 2], [0, 2], [0, 2]]
