"""``auto_find_batch_size=True`` against ``transformers.Trainer`` (accelerate's ``find_executable_batch_size``)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

from tests.helpers.models import regression_data
from tests.helpers.parity import assert_parity, run

CUDA_OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"


class OutOfMemoryModel(nn.Module):
    """Raises ``torch.OutOfMemoryError`` on a training micro-batch larger than ``limit``, from its ``fits_until``-th
    training forward on (so earlier steps of an attempt may update the weights and the optimizer first)."""

    def __init__(self, limit: int = 5, fits_until: int = 0, message: str = CUDA_OOM):
        super().__init__()
        torch.manual_seed(42)
        self.limit, self.fits_until, self.message = limit, fits_until, message
        self.calls = 0
        self.failures: list[int] = []
        self.lin = nn.Linear(4, 8)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(8, 1)

    def forward(self, x, labels=None):
        if self.training:
            self.calls += 1
            if x.shape[0] > self.limit and self.calls > self.fits_until:
                self.failures.append(x.shape[0])
                raise torch.OutOfMemoryError(self.message)
        preds = self.head(self.drop(torch.relu(self.lin(x)))).squeeze(-1)
        if labels is None:
            return (preds,)
        return (nn.functional.mse_loss(preds, labels), preds)


ARGS = dict(auto_find_batch_size=True, per_device_train_batch_size=8, num_train_epochs=2, logging_steps=2,
            save_strategy="epoch")


def _train_batch_sizes(result) -> dict[str, int]:
    return {name: json.load(open(os.path.join(result.output_dir, name, "trainer_state.json")))["train_batch_size"]
            for name in result.checkpoints()}


@pytest.mark.parametrize("fits_until", [pytest.param(0, marks=pytest.mark.slow), 2], ids=["first-forward", "after-two-steps"])
def test_retries_at_hf_batch_sizes_and_matches_hf(tmp_path, fits_until):
    models = {}

    def make_model(kind):
        return lambda: models.setdefault(kind, OutOfMemoryModel(fits_until=fits_until))

    hf = run("hf", make_model("hf"), tmp_path, train_dataset=regression_data(), args=ARGS)
    ours = run("ours", make_model("ours"), tmp_path, train_dataset=regression_data(), args=ARGS)
    # accelerate's 0.9x rule: 8 → 7 → 6 → 5 (not halving).
    assert models["ours"].failures == models["hf"].failures == [8, 7, 6]
    assert ours.trainer.state.train_batch_size == hf.trainer.state.train_batch_size == 5
    assert ours.trainer.args.per_device_train_batch_size == hf.trainer.args.per_device_train_batch_size == 8
    # Weights and optimizer moments of a failed attempt's steps carry over; state, logs and scheduler restart.
    assert_parity(hf, ours)
    assert ours.checkpoints() == hf.checkpoints() == ["checkpoint-5", "checkpoint-10"]
    assert _train_batch_sizes(ours) == _train_batch_sizes(hf) == {"checkpoint-5": 5, "checkpoint-10": 5}


def test_resume_starts_at_the_checkpoints_batch_size(tmp_path):
    models = {}
    for kind in ("hf", "ours"):
        run(kind, lambda: OutOfMemoryModel(), tmp_path, train_dataset=regression_data(), args=ARGS)
        checkpoint = str(tmp_path / kind / "checkpoint-5")
        lib = __import__("transformers" if kind == "hf" else "hf_lightning")
        models[kind] = OutOfMemoryModel()
        trainer = lib.Trainer(model=models[kind], train_dataset=regression_data(), args=lib.TrainingArguments(
            output_dir=str(tmp_path / f"{kind}_resumed"), report_to="none", use_cpu=True, disable_tqdm=True,
            seed=42, **ARGS))
        trainer.train(resume_from_checkpoint=checkpoint)
        assert trainer.state.global_step == 10
        assert trainer.state.train_batch_size == 5
    assert models["ours"].failures == models["hf"].failures == []


@pytest.mark.parametrize("message, error, match, failures", [
    ("boom", torch.OutOfMemoryError, "boom", [3]),  # no allocator phrase: not retried
    (CUDA_OOM, RuntimeError, "No executable batch size found, reached zero.", [3, 2, 1]),  # too big down to 1
], ids=["not-an-oom-message", "reaches-zero"])
def test_gives_up_like_hf(tmp_path, message, error, match, failures):
    for kind in ("hf", "ours"):
        model = OutOfMemoryModel(limit=0, message=message)
        with pytest.raises(error, match=match):
            run(kind, lambda: model, tmp_path, train_dataset=regression_data(),
                args={**ARGS, "per_device_train_batch_size": 3})
        assert model.failures == failures, kind


def test_set_dataloader_accepts_auto_find_batch_size():
    import hf_lightning

    args = hf_lightning.TrainingArguments(output_dir="x").set_dataloader(train_batch_size=16, auto_find_batch_size=True)
    assert args.auto_find_batch_size is True
    assert args.per_device_train_batch_size == 16


class EvalOutOfMemoryModel(OutOfMemoryModel):
    def forward(self, x, labels=None):
        if not self.training:
            self.failures.append(x.shape[0])
            raise torch.OutOfMemoryError(CUDA_OOM)
        return super().forward(x, labels)


def test_an_evaluation_oom_is_not_retried(tmp_path):
    errors = {}
    for kind in ("hf", "ours"):
        model = EvalOutOfMemoryModel(limit=8)
        with pytest.raises(RuntimeError) as raised:
            run(kind, lambda: model, tmp_path, train_dataset=regression_data(), eval_dataset=regression_data(8),
                args={**ARGS, "eval_strategy": "steps", "eval_steps": 2})
        errors[kind] = (str(raised.value), type(raised.value.__cause__))
        assert model.failures == [8], kind
    assert errors["ours"] == errors["hf"]
    assert errors["ours"][0].startswith("Evaluation hit an out-of-memory error.")


def test_a_failed_attempt_takes_its_hooks_off_the_model(tmp_path):
    # Each attempt installs the underflow/overflow detector; a failed fit never reaches teardown, so the retry
    # must remove it, or the old attempts' hooks would stay on the model.
    model = OutOfMemoryModel()
    run("ours", lambda: model, tmp_path, train_dataset=regression_data(),
        args={**ARGS, "max_steps": 2, "save_strategy": "no", "debug": "underflow_overflow"})
    assert model.failures == [8, 7, 6]
    assert sum(len(m._forward_hooks) for m in model.modules()) == 0
