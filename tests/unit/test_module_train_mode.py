"""HF calls ``model.train()`` before every micro-batch; hf_lightning skips the call only when it would change nothing."""

import warnings

import torch
from torch import nn

import hf_lightning
from tests.helpers.models import RegressionModel, regression_data


class ModeRecorder(nn.Module):
    """Wraps the regression model; records every module's training flag at each forward."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = RegressionModel()
        self.dropout = nn.Dropout(0.0)
        self.modes: list[bool] = []

    def forward(self, x, labels=None):
        self.modes.append(all(m.training for m in self.modules()))
        return self.inner(self.dropout(x), labels=labels)


class CountingNorm(nn.LayerNorm):
    """A sub-module with its own ``train``: HF's per-micro-batch ``model.train()`` reaches it every time."""

    calls = 0

    def train(self, mode: bool = True):
        CountingNorm.calls += 1
        return super().train(mode)


def _args(tmp_path, **kwargs):
    return hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4, report_to="none", use_cpu=True,
        disable_tqdm=True, save_strategy="no", logging_strategy="no", **kwargs)


def test_modules_switched_to_eval_by_a_callback_train_again_next_step(tmp_path):
    model = ModeRecorder()

    class EvalSomePart(hf_lightning.TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            # e.g. a callback probing the model in eval mode and not switching back; only a sub-module here.
            model.dropout.eval()

    hf_lightning.Trainer(model=model, args=_args(tmp_path, gradient_accumulation_steps=2),
                         train_dataset=regression_data(), callbacks=[EvalSomePart()]).train()
    assert len(model.modes) == 8
    assert all(model.modes), model.modes


def test_a_module_overriding_train_is_called_every_micro_batch(tmp_path):
    model = RegressionModel()
    model.norm = CountingNorm(4)
    CountingNorm.calls = 0
    hf_lightning.Trainer(model=model, args=_args(tmp_path, gradient_accumulation_steps=2),
                         train_dataset=regression_data()).train()
    # 4 optimizer steps x 2 micro-batches, plus any calls Lightning makes around fit.
    assert CountingNorm.calls >= 8


def test_starting_from_eval_mode_trains_in_training_mode(tmp_path):
    model = ModeRecorder()
    model.eval()  # as from_pretrained() leaves a model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hf_lightning.Trainer(model=model, args=_args(tmp_path), train_dataset=regression_data()).train()
    assert model.modes and all(model.modes)
    # HF's Trainer says nothing about it; Lightning's "modules in eval mode" warning is not passed on.
    assert not [w for w in caught if "eval mode" in str(w.message)], [str(w.message) for w in caught]


def test_facade_prints_no_lightning_banners(tmp_path, capfd, caplog):
    # An HF user sees HF's output: no "GPU available" / "TPU available" / tips from Lightning, for train and evaluate.
    caplog.set_level("INFO")
    trainer = hf_lightning.Trainer(model=RegressionModel(), args=_args(tmp_path), train_dataset=regression_data(),
                                   eval_dataset=regression_data(8))
    trainer.train()
    trainer.evaluate()
    out, err = capfd.readouterr()
    shown = out + err + caplog.text
    for banner in ("GPU available", "TPU available", "Tip:", "LeafSpec"):
        assert banner not in shown


def test_gradients_are_dropped_before_evaluation_and_after_training(tmp_path):
    # HF sets gradients to None after each optimizer step; hf_lightning drops them just before the next backward,
    # but never holds them while evaluating and leaves none behind.
    seen: dict[str, list[bool]] = {"prediction_step": [], "optimizer_step": []}

    class Watch(hf_lightning.TrainerCallback):
        def on_prediction_step(self, args, state, control, model=None, **kwargs):
            seen["prediction_step"].append(all(p.grad is None for p in model.parameters()))

        def on_optimizer_step(self, args, state, control, model=None, **kwargs):
            seen["optimizer_step"].append(all(p.grad is not None for p in model.parameters()))

    model = RegressionModel()
    args = _args(tmp_path, eval_strategy="steps", eval_steps=2)
    hf_lightning.Trainer(model=model, args=args, train_dataset=regression_data(), eval_dataset=regression_data(8),
                         callbacks=[Watch()]).train()
    assert seen["prediction_step"] and all(seen["prediction_step"])
    assert seen["optimizer_step"] == [True] * 4

    # Without an evaluation at the last step, too.
    model = RegressionModel()
    hf_lightning.Trainer(model=model, args=_args(tmp_path / "no_eval"), train_dataset=regression_data()).train()
    assert all(p.grad is None for p in model.parameters())


def test_evaluation_batches_run_in_eval_mode_and_training_resumes_in_train_mode(tmp_path):
    model = ModeRecorder()

    class TrainModeAfterEachBatch(hf_lightning.TrainerCallback):
        def on_prediction_step(self, args, state, control, model=None, **kwargs):
            model.train()  # e.g. a callback probing the model; the next batch still evaluates in eval mode

    eval_rows, eval_batch = 8, 4
    args = _args(tmp_path, eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=eval_batch)
    trainer = hf_lightning.Trainer(model=model, args=args, train_dataset=regression_data(),
                                   eval_dataset=regression_data(eval_rows), callbacks=[TrainModeAfterEachBatch()])
    trainer.train()
    # 4 training steps, evaluations after steps 2 and 4 (2 batches each): train, train, eval, eval, train, ...
    assert model.modes == [True, True, False, False, True, True, False, False]
    model.modes.clear()
    trainer.evaluate()
    assert model.modes == [False, False]
