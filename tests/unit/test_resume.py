"""``fit(ckpt_path=<checkpoint-N folder>)`` reaches ``CheckpointResume`` whatever the strategy.

FSDP and ``ModelParallelStrategy`` override ``Strategy.load_checkpoint`` and never ask their ``CheckpointIO``; a
strategy doing the same must still resume from an HF folder, to the same weights as the default strategy.
"""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy

from tests.helpers.models import RegressionModel, regression_data


class _OwnLoadStrategy(SingleDeviceStrategy):
    """Reads ``ckpt_path`` itself, never through ``checkpoint_io`` (as FSDPStrategy does); a folder would fail."""

    def load_checkpoint(self, checkpoint_path, weights_only=None):
        return torch.load(checkpoint_path, weights_only=True)


def _args(tmp_path, name):
    import hf_lightning

    return hf_lightning.TrainingArguments(output_dir=str(tmp_path / name), report_to="none", use_cpu=True,
                                          disable_tqdm=True, per_device_train_batch_size=4, max_steps=6,
                                          save_steps=2, logging_steps=1, learning_rate=1e-2, seed=42)


def _fit(args, ckpt_path=None, **overrides):
    from hf_lightning import HFDataModule, HFLightningModule, build_lightning_trainer

    model = RegressionModel()
    trainer = build_lightning_trainer(args, enable_progress_bar=False, **overrides)
    trainer.fit(HFLightningModule(model, args), datamodule=HFDataModule(args, train_dataset=regression_data(n=16)),
                ckpt_path=ckpt_path)
    flow = next(cb for cb in trainer.callbacks if type(cb).__name__ == "HFFlowCallback")
    return trainer, model.state_dict(), flow.state.log_history


def test_the_own_load_strategy_cannot_read_a_folder_itself(tmp_path):
    strategy = _OwnLoadStrategy(device=torch.device("cpu"))
    (tmp_path / "checkpoint-2").mkdir()
    with pytest.raises((IsADirectoryError, PermissionError)):
        strategy.load_checkpoint(str(tmp_path / "checkpoint-2"))


def test_resume_from_an_hf_folder_bypasses_the_strategy(tmp_path):
    torch.set_num_threads(1)
    _, full_weights, full_log = _fit(_args(tmp_path, "full"))
    folder = str(tmp_path / "full" / "checkpoint-2")

    default, default_weights, default_log = _fit(_args(tmp_path, "default"), ckpt_path=folder)
    own, own_weights, own_log = _fit(_args(tmp_path, "own"), ckpt_path=folder,
                                     strategy=_OwnLoadStrategy(device=torch.device("cpu")))

    assert isinstance(own.strategy, _OwnLoadStrategy)
    assert own.global_step == default.global_step == 6
    for name, value in default_weights.items():
        torch.testing.assert_close(own_weights[name], value, rtol=0, atol=0)
        torch.testing.assert_close(value, full_weights[name], rtol=0, atol=0)
    strip = [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k} for e in own_log]
    assert strip == [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k}
                     for e in default_log]
    # The resumed history goes on from the checkpoint's: its first two steps are the uninterrupted run's.
    assert [e["loss"] for e in own_log if "loss" in e] == [e["loss"] for e in full_log if "loss" in e]


def test_a_lightning_ckpt_file_still_goes_to_the_strategy(tmp_path):
    """Only HF folders are routed: a file path reaches the strategy's own ``load_checkpoint``."""
    torch.set_num_threads(1)
    seen = []

    class _Recording(SingleDeviceStrategy):
        def load_checkpoint(self, checkpoint_path, weights_only=None):
            seen.append(str(checkpoint_path))
            raise RuntimeError("reached the strategy")

    missing = tmp_path / "model.ckpt"
    missing.write_bytes(b"")
    with pytest.raises(RuntimeError, match="reached the strategy"):
        _fit(_args(tmp_path, "file"), ckpt_path=str(missing), strategy=_Recording(device=torch.device("cpu")))
    assert seen == [str(missing)]
