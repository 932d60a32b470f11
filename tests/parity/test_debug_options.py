"""``debug="underflow_overflow"`` against HF's ``DebugUnderflowOverflow``, run by ``transformers.Trainer``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.models import regression_data

ABORT = "DebugUnderflowOverflow: inf/nan detected, aborting as there is no point running further."


class Blowup(nn.Module):
    """Passes its input through, times inf from its ``after + 1``-th training call on."""

    def __init__(self, after: int):
        super().__init__()
        self.after = after
        self.calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
        return x * float("inf") if self.calls > self.after else x


class BlowupModel(nn.Module):
    """Linear → ReLU → dropout → Blowup → Linear, HF-convention ``(loss, preds)``; inf from the 4th step on."""

    def __init__(self, after: int = 3):
        super().__init__()
        torch.manual_seed(42)
        self.lin = nn.Linear(4, 8)
        self.drop = nn.Dropout(0.1)
        self.blow = Blowup(after)
        self.head = nn.Linear(8, 1)

    def forward(self, x, labels=None):
        preds = self.head(self.blow(self.drop(torch.relu(self.lin(x))))).squeeze(-1)
        if labels is None:
            return (preds,)
        return (nn.functional.mse_loss(preds, labels), preds)


def _train(kind: str, tmp_path, model: nn.Module, **overrides):
    torch.set_num_threads(1)
    if kind == "hf":
        import transformers as lib
    else:
        import hf_lightning as lib
    args = dict(output_dir=str(tmp_path / kind), report_to="none", use_cpu=True, disable_tqdm=True, seed=42,
                debug="underflow_overflow", per_device_train_batch_size=4, max_steps=10, logging_steps=100,
                save_strategy="no")
    args.update(overrides)
    trainer = lib.Trainer(model=model, args=lib.TrainingArguments(**args), train_dataset=regression_data())
    return trainer, trainer.train


def test_underflow_overflow_report_and_error_match_hf(tmp_path, capsys):
    outputs, errors, steps = {}, {}, {}
    for kind in ("hf", "ours"):
        trainer, train = _train(kind, tmp_path, BlowupModel())
        capsys.readouterr()
        with pytest.raises(ValueError) as raised:
            train()
        outputs[kind] = capsys.readouterr().out
        errors[kind] = str(raised.value)
        steps[kind] = trainer.state.global_step
    assert errors["ours"] == errors["hf"]
    assert errors["ours"].startswith(ABORT)
    # The whole printout, frame by frame and number by number, is HF's.
    assert outputs["ours"] == outputs["hf"]
    assert "output has infs" in outputs["ours"]
    assert "Detected inf/nan during batch_number=3" in outputs["ours"]
    assert "Last 18 forward frames:" in outputs["ours"]
    # The report ends on the module that produced the inf, then the model's output.
    tail = outputs["ours"].split("*** Starting batch number=3 ***")[1]
    assert "blow Blowup" in tail
    assert steps["ours"] == steps["hf"] == 3


def test_detector_keeps_the_last_max_frames(tmp_path, capsys):
    # 5 modules per batch, inf in the 10th batch: the report is cut to HF's 21 frames.
    _, train = _train("ours", tmp_path, BlowupModel(after=9))
    with pytest.raises(ValueError, match=ABORT):
        train()
    assert "Last 21 forward frames:" in capsys.readouterr().out


def test_detector_removed_when_training_ends(tmp_path, capsys):
    model = BlowupModel(after=10**6)
    trainer, train = _train("ours", tmp_path, model, max_steps=2)
    train()
    assert trainer.state.global_step == 2
    assert all(not m._forward_hooks for m in model.modules())
    capsys.readouterr()
    model.blow.after = 0
    model.train()
    model(torch.ones(2, 4), labels=torch.ones(2))  # no detector left to raise
    assert "has infs" not in capsys.readouterr().out


def test_tpu_metrics_debug_refused_with_the_fix():
    import hf_lightning

    with pytest.raises(ValueError, match=r"`debug=.*tpu_metrics_debug.*` is not supported .* remove tpu_metrics_debug"):
        hf_lightning.TrainingArguments(output_dir="x", debug="underflow_overflow tpu_metrics_debug")
    args = hf_lightning.TrainingArguments(output_dir="x", debug=["underflow_overflow"])
    assert args.debug == [hf_lightning.args.DebugOption.UNDERFLOW_OVERFLOW]
