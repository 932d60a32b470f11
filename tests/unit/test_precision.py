"""``HFMixedPrecision``: autocast around the HF model's forward only, fp32 outputs, the model restored after."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import torch
from torch import nn

from hf_lightning import TrainingArguments
from hf_lightning.checkpointing.io import HFCheckpointIO
from hf_lightning.precision import HFMixedPrecision, outputs_to_fp32
from hf_lightning.trainer.build import build_lightning_trainer


def _args(tmp_path, **extra):
    return TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, **extra)


def test_bf16_uses_the_forward_only_plugin_even_with_user_plugins(tmp_path):
    for overrides in ({}, {"plugins": [HFCheckpointIO()]}):
        trainer = build_lightning_trainer(_args(tmp_path, bf16=True), enable_progress_bar=False, **overrides)
        assert isinstance(trainer.precision_plugin, HFMixedPrecision), overrides
        assert trainer.precision == "bf16-mixed"
    plain = build_lightning_trainer(_args(tmp_path), enable_progress_bar=False)
    assert not isinstance(plain.precision_plugin, HFMixedPrecision)


class _Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return OrderedDict(h=h, was_autocast=torch.is_autocast_enabled("cpu"))


class _Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = _Inner()


def test_forward_runs_in_autocast_returns_fp32_and_is_restored():
    holder = _Holder()
    plugin = HFMixedPrecision("bf16-mixed", "cpu")
    plugin.convert_module(holder)
    with plugin.forward_context():
        assert not torch.is_autocast_enabled("cpu")  # Lightning's step context enters nothing
    out = holder.model(torch.randn(2, 4))
    assert out["was_autocast"] is True
    assert out["h"].dtype == torch.float32
    plugin.teardown()
    assert "forward" not in holder.model.__dict__
    assert holder.model(torch.randn(2, 4))["was_autocast"] is False


def test_outputs_to_fp32_keeps_containers():
    Pair = namedtuple("Pair", "a b")
    bf = torch.ones(2, dtype=torch.bfloat16)
    out = outputs_to_fp32({"x": [bf, (bf, torch.ones(2, dtype=torch.int64))], "p": Pair(bf, None)})
    assert out["x"][0].dtype == torch.float32 and out["x"][1][0].dtype == torch.float32
    assert out["x"][1][1].dtype == torch.int64
    assert isinstance(out["p"], Pair) and out["p"].a.dtype == torch.float32 and out["p"].b is None
