"""Samplers against accelerate's SeedableRandomSampler and HF's LengthGroupedSampler, same seeds."""

from __future__ import annotations

import pytest
import torch

from hf_lightning.data.samplers import (
    LengthGroupedSampler,
    SeedableRandomSampler,
    eval_length_grouped_sampler,
    get_length_grouped_indices,
)


@pytest.mark.parametrize("n", [1, 7, 64])
@pytest.mark.parametrize("seed", [0, 42, 1234])
def test_seedable_sampler_matches_accelerate_with_set_epoch(n, seed):
    from accelerate.data_loader import SeedableRandomSampler as AccelerateSampler

    theirs = AccelerateSampler(range(n), data_seed=seed)
    ours = SeedableRandomSampler(range(n), seed)
    for epoch in (0, 1, 2, 5, 3):
        theirs.set_epoch(epoch)
        ours.set_epoch(epoch)
        assert list(ours) == list(theirs)
        expected = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        assert list(SeedableRandomSampler(n, seed + epoch)) == expected


def test_seedable_sampler_matches_accelerate_without_set_epoch():
    from accelerate.data_loader import SeedableRandomSampler as AccelerateSampler

    theirs = AccelerateSampler(range(10), data_seed=3)
    ours = SeedableRandomSampler(10, seed=3)
    passes = [(list(ours), list(theirs)) for _ in range(4)]
    assert all(a == b for a, b in passes)
    assert len({tuple(a) for a, _ in passes}) == 4
    assert ours.epoch == theirs.epoch == 4


def test_seedable_sampler_reads_epoch_lazily_and_ignores_global_rng():
    sampler = SeedableRandomSampler(list("abcdefgh"), seed=11)
    iterator = iter(sampler)
    sampler.set_epoch(2)  # after iter() but before the first index: the pass still uses epoch 2
    torch.manual_seed(999)
    expected = torch.randperm(8, generator=torch.Generator().manual_seed(13)).tolist()
    assert list(iterator) == expected
    assert len(sampler) == 8


def test_seedable_sampler_default_seed_is_torch_initial_seed():
    from accelerate.data_loader import SeedableRandomSampler as AccelerateSampler

    torch.manual_seed(77)
    ours, theirs = SeedableRandomSampler(9), AccelerateSampler(range(9))
    assert ours.seed == theirs.initial_seed == 77
    assert list(ours) == list(theirs)


def test_seedable_sampler_in_a_dataloader_matches_hf_order():
    from accelerate.data_loader import SeedableRandomSampler as AccelerateSampler

    data = list(range(20))
    loaders = [torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
               for sampler in (SeedableRandomSampler(data, 5), AccelerateSampler(data, data_seed=5))]
    for epoch in range(3):
        for loader in loaders:
            loader.sampler.set_epoch(epoch)
        ours, theirs = ([batch.tolist() for batch in loader] for loader in loaders)
        assert ours == theirs


@pytest.mark.parametrize("bad", [object(), 3.5, True, None])
def test_seedable_sampler_rejects_non_sized(bad):
    with pytest.raises(TypeError, match="needs a dataset with __len__ or an int length"):
        SeedableRandomSampler(bad, seed=0)


def _lengths(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, 40, (n,), generator=generator).tolist()


@pytest.mark.parametrize("n, batch_size", [(5, 2), (16, 4), (100, 3), (1000, 8), (37, 64)])
@pytest.mark.parametrize("seed", [0, 1, 42])
def test_length_grouped_indices_match_hf_with_global_rng(n, batch_size, seed):
    from transformers.trainer_pt_utils import get_length_grouped_indices as hf_indices

    lengths = _lengths(n, seed)
    torch.manual_seed(seed)
    theirs = hf_indices(lengths, batch_size)
    torch.manual_seed(seed)
    ours = get_length_grouped_indices(lengths, batch_size)
    assert ours == theirs
    assert sorted(ours) == list(range(n))
    assert lengths[ours[0]] == max(lengths)


@pytest.mark.parametrize("mega_batch_mult", [1, 3])
def test_length_grouped_indices_match_hf_with_generator(mega_batch_mult):
    from transformers.trainer_pt_utils import get_length_grouped_indices as hf_indices

    lengths = _lengths(60, 9)
    theirs = hf_indices(lengths, 4, mega_batch_mult, torch.Generator().manual_seed(5))
    ours = get_length_grouped_indices(lengths, 4, mega_batch_mult, torch.Generator().manual_seed(5))
    assert ours == theirs


@pytest.mark.parametrize("source", ["lengths", "tensor lengths", "dataset", "dataset custom key"])
def test_length_grouped_sampler_matches_hf_over_epochs(source):
    from transformers.trainer_pt_utils import LengthGroupedSampler as HFSampler

    lengths = _lengths(50, 3)
    if source == "lengths":
        kwargs = {"lengths": lengths}
    elif source == "tensor lengths":
        kwargs = {"lengths": torch.tensor(lengths)}
    elif source == "dataset":
        kwargs = {"dataset": [{"input_ids": [0] * n} for n in lengths]}
    else:
        kwargs = {"dataset": [{"pixel_values": [0] * n} for n in lengths], "model_input_name": "pixel_values"}
    theirs, ours = HFSampler(6, **kwargs), LengthGroupedSampler(6, **kwargs)
    assert len(ours) == len(theirs) == 50
    torch.manual_seed(21)
    hf_epochs = [list(theirs) for _ in range(3)]
    torch.manual_seed(21)
    assert [list(ours) for _ in range(3)] == hf_epochs


def test_eval_length_grouped_sampler_matches_hf_trainer(tmp_path):
    import transformers

    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], per_device_eval_batch_size=3,
                                          train_sampling_strategy="group_by_length", seed=17, use_cpu=True)
    trainer = transformers.Trainer(model=torch.nn.Linear(1, 1), args=args)
    dataset = [{"input_ids": [0] * n} for n in _lengths(30, 4)]
    torch.manual_seed(0)
    hf_sampler = trainer._get_eval_sampler(dataset)
    ours = eval_length_grouped_sampler(3, 17, dataset=dataset)
    torch.manual_seed(1)  # the global RNG must not matter
    assert [list(ours) for _ in range(2)] == [list(hf_sampler) for _ in range(2)]
    fresh = eval_length_grouped_sampler(3, 17, dataset=dataset)
    assert list(fresh) == list(trainer._get_eval_sampler(dataset))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 2}, "needs `dataset` or `lengths`"),
        ({"batch_size": 0, "lengths": [1]}, "batch_size must be a positive int"),
        ({"batch_size": 2, "dataset": [[1, 2]]}, "items must be dicts holding 'input_ids'"),
        ({"batch_size": 2, "dataset": [{"ids": [1]}], "model_input_name": "tokens"}, "dicts holding 'tokens'"),
    ],
)
def test_length_grouped_sampler_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LengthGroupedSampler(**kwargs)
