"""ShardedBatchSampler deals the same indices to each process as accelerate's BatchSamplerShard;
EvalShardBatchSampler gives each process its own share of an eval set, without repeats."""

import math

import pytest
from torch.utils.data import BatchSampler, SequentialSampler

from hf_lightning.data.samplers import EvalShardBatchSampler, ShardedBatchSampler


@pytest.mark.parametrize("n", [1, 7, 16, 17, 23, 30])
@pytest.mark.parametrize("batch_size", [1, 3, 4])
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("even", [True, False])
def test_same_batches_as_accelerate(n, batch_size, world, drop_last, even):
    from accelerate.data_loader import BatchSamplerShard

    for rank in range(world):
        base = BatchSampler(SequentialSampler(range(n)), batch_size, drop_last)
        theirs = BatchSamplerShard(base, num_processes=world, process_index=rank, even_batches=even)
        ours = ShardedBatchSampler(BatchSampler(SequentialSampler(range(n)), batch_size, drop_last), world, rank,
                                   even_batches=even)
        assert list(ours) == list(theirs)
        assert len(ours) == len(theirs)


def test_exposes_the_shuffling_sampler_and_checks_rank():
    inner = SequentialSampler(range(4))
    assert ShardedBatchSampler(BatchSampler(inner, 2, False), 2, 1).sampler is inner
    with pytest.raises(ValueError, match="process_index"):
        ShardedBatchSampler(BatchSampler(inner, 2, False), 2, 2)


@pytest.mark.parametrize("n", [1, 7, 16, 17, 23])
@pytest.mark.parametrize(("batch_size", "world"), [(4, 2), (6, 3), (6, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("even", [True, False])
def test_split_batches_as_accelerate(n, batch_size, world, drop_last, even):
    """accelerator_config['split_batches']=True: each process takes its slice of every batch."""
    from accelerate.data_loader import BatchSamplerShard

    for rank in range(world):
        theirs = BatchSamplerShard(BatchSampler(SequentialSampler(range(n)), batch_size, drop_last),
                                   num_processes=world, process_index=rank, split_batches=True, even_batches=even)
        ours = ShardedBatchSampler(BatchSampler(SequentialSampler(range(n)), batch_size, drop_last), world, rank,
                                   even_batches=even, split_batches=True)
        assert list(ours) == list(theirs)
        assert len(ours) == len(theirs)


def test_split_batches_needs_a_batch_size_the_processes_divide():
    with pytest.raises(ValueError, match=r"split_batches.*per_device_train_batch_size=5 over 2 processes"):
        ShardedBatchSampler(BatchSampler(SequentialSampler(range(8)), 5, False), 2, 0, split_batches=True)


@pytest.mark.parametrize("config", [{"split_batches": True}, {"even_batches": False}, {"dispatch_batches": True}])
def test_the_train_loader_of_a_process_follows_accelerator_config(config, tmp_path):
    """What HFDataModule gives process 1 of 2, against accelerate sharding the same seeded shuffle."""
    from accelerate.data_loader import BatchSamplerShard

    from hf_lightning import HFDataModule, TrainingArguments

    class SecondOfTwo(HFDataModule):
        def _layout(self):
            return 2, 1

    rows = [{"x": i} for i in range(11)]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, accelerator_config=config,
                             report_to="none")
    dm = SecondOfTwo(args, train_dataset=rows, data_collator=lambda feats: [f["x"] for f in feats])
    ours = list(dm.train_loader())
    sampler = dm.default_train_sampler(rows)
    theirs = BatchSamplerShard(BatchSampler(sampler, 4, False), num_processes=2, process_index=1,
                               split_batches=bool(config.get("split_batches")),
                               even_batches=config.get("even_batches", True))
    assert ours == [list(batch) for batch in theirs]


@pytest.mark.parametrize("n", [2, 7, 9, 10, 16, 17])
@pytest.mark.parametrize("batch_size", [1, 3, 4])
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_eval_shards_cover_the_one_process_batches_once(n, batch_size, world, drop_last):
    order = list(reversed(range(n)))  # the eval sampler's order is the order results come back in
    one_process = list(BatchSampler(order, batch_size, drop_last))
    shards = [EvalShardBatchSampler(order, batch_size, drop_last, world, rank) for rank in range(world)]
    batches = [list(shard) for shard in shards]
    covered = [i for rank_batches in batches for batch in rank_batches for i in batch]
    assert covered == [i for batch in one_process for i in batch]  # rank order = one-process order, no repeats
    for shard, rank_batches in zip(shards, batches):
        assert sum(map(len, rank_batches)) <= math.ceil(len(covered) / world)
        assert len(shard) == len(rank_batches)
        # Each batch is a one-process batch or a part of the one its id names.
        for batch, batch_id in zip(rank_batches, shard.batch_ids(shard.process_index)):
            assert set(batch) <= set(one_process[batch_id])


def test_eval_shards_check_the_rank():
    with pytest.raises(ValueError, match="process_index"):
        EvalShardBatchSampler(range(4), 2, False, 2, 2)
