"""ShardedBatchSampler deals the same indices to each process as accelerate's BatchSamplerShard."""

import pytest
from torch.utils.data import BatchSampler, SequentialSampler

from hf_lightning.data.samplers import ShardedBatchSampler


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
