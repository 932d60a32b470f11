"""``HFDataModule``'s public ways to change its train loader: a given loader, and a mid-epoch resume's skip."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from hf_lightning import HFDataModule, TrainingArguments
from tests.helpers.models import regression_data


def _datamodule(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, seed=3)
    return HFDataModule(args, train_dataset=regression_data(n=16))


def _xs(windows):
    return [torch.cat([batch["x"] for batch in window]) for window in windows]


def _epoch(dm, epoch):
    # Lightning sets the sampler's epoch before each pass; the resumed pass must see the same epoch's order.
    windows = dm.train_dataloader()
    windows.sampler.set_epoch(epoch)
    return _xs(windows)


def test_skip_first_windows_applies_to_the_next_loader_only(tmp_path):
    dm = _datamodule(tmp_path)
    full = _epoch(dm, 0)
    dm.skip_first_windows(3)
    resumed = _epoch(dm, 0)
    again = _epoch(dm, 0)
    assert len(full) == 4 and len(resumed) == 1
    torch.testing.assert_close(resumed[0], full[3])
    assert len(again) == len(full)


def test_set_train_loader_replaces_the_built_one(tmp_path):
    dm = _datamodule(tmp_path)
    loader = DataLoader(regression_data(n=6), batch_size=3, collate_fn=dm.data_collator)
    dm.set_train_loader(loader)
    assert dm.train_loader() is loader
    windows = dm.train_dataloader()
    assert windows.loader is loader and len(windows) == 1
