"""Control flow driven by ``TrainerControl``: callbacks and flow arguments against a live ``transformers.Trainer``.

Every case runs the same model, data, arguments and callbacks through HF's Trainer and ours, then compares the
recorder's event sequence, ``log_history``, final weights and the ``checkpoint-N`` folders left on disk.

The base run has 20 rows, batch 4 and gradient accumulation 2: windows of 2, 2 and 1 micro-batches, so three
optimizer steps per epoch with a short last window, and 9 steps over 3 epochs.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from transformers import TrainerCallback

from tests.helpers.models import RegressionModel, regression_data
from tests.helpers.parity import assert_parity, run

BASE_ARGS = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=3,
                 logging_steps=1, learning_rate=5e-2, save_strategy="no", per_device_eval_batch_size=4)


# ---------------------------------------------------------------------------------------------- callbacks
class StopTrainingAt(TrainerCallback):
    """Raises ``should_training_stop`` in ``on_step_end`` once ``global_step`` reaches ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


class StopEpochAt(TrainerCallback):
    """Raises ``should_epoch_stop`` in ``on_step_end`` at the given global steps."""

    def __init__(self, *steps: int):
        self.steps = set(steps)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.steps:
            control.should_epoch_stop = True


class StopInsideWindow(TrainerCallback):
    """Raises a stop flag from ``on_substep_end`` (mid-window) of the step after ``after_step``."""

    def __init__(self, after_step: int, flag: str):
        self.after_step, self.flag, self.done = after_step, flag, False

    def on_substep_end(self, args, state, control, **kwargs):
        if state.global_step == self.after_step and not self.done:
            self.done = True
            setattr(control, self.flag, True)


class ForceAtOddSteps(TrainerCallback):
    """Forces log / evaluate / save at odd global steps, whatever the strategies say."""

    def __init__(self, flags=("should_log", "should_evaluate", "should_save")):
        self.flags = flags

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % 2 == 1:
            for flag in self.flags:
                setattr(control, flag, True)


class ReturnsNewControl(TrainerCallback):
    """Replaces ``control`` by returning a copy with ``should_log`` set (HF keeps the returned object)."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            new = copy.deepcopy(control)
            new.should_log = True
            return new


# ---------------------------------------------------------------------------------------------- runner
def _with_callbacks(base: type, make_callbacks) -> type:
    """``base`` whose constructor puts fresh control callbacks *before* the recorder, so it sees their flags."""

    class WithCallbacks(base):
        def __init__(self, *args, callbacks=None, **kwargs):
            super().__init__(*args, callbacks=[*make_callbacks(base), *(callbacks or [])], **kwargs)

    return WithCallbacks


def _pair(tmp_path, args: dict, make_callbacks=None, eval_dataset=True, n_train: int = 20):
    import transformers

    import hf_lightning

    results = []
    for kind, base in (("hf", transformers.Trainer), ("ours", hf_lightning.Trainer)):
        cls = _with_callbacks(base, make_callbacks) if make_callbacks else None
        results.append(run(kind, RegressionModel, tmp_path, train_dataset=regression_data(n=n_train),
                           eval_dataset=regression_data(n=8, seed=9) if eval_dataset else None,
                           args={**BASE_ARGS, **args}, trainer_cls=cls))
    return results


def _folder_name(path: str | None) -> str | None:
    # Best-checkpoint paths differ by output_dir between the two runs; the folder name must match.
    return Path(path).name if path else None


def _state(result, checkpoint: str) -> dict:
    return json.loads((Path(result.output_dir) / checkpoint / "trainer_state.json").read_text())


def _assert_same_run(hf, ours) -> None:
    assert_parity(hf, ours)
    assert ours.checkpoints() == hf.checkpoints()
    for name in ours.checkpoints():
        a, b = _state(hf, name), _state(ours, name)
        for key in ("global_step", "epoch", "best_metric", "best_global_step"):
            expected = pytest.approx(a[key], rel=1e-5) if isinstance(a[key], float) else a[key]
            assert b[key] == expected, (name, key, a[key], b[key])
        assert _folder_name(b["best_model_checkpoint"]) == _folder_name(a["best_model_checkpoint"]), name
        assert b["stateful_callbacks"] == a["stateful_callbacks"], name


def _stop_eval_save_args() -> dict:
    return dict(eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2)


# ---------------------------------------------------------------------------------------------- callbacks setting flags
@pytest.mark.parametrize("step", [1, 4])
def test_should_training_stop_in_on_step_end(tmp_path, step):
    hf, ours = _pair(tmp_path, _stop_eval_save_args(), lambda base: [StopTrainingAt(step)])
    _assert_same_run(hf, ours)
    assert ours.train_output.global_step == step


def test_should_epoch_stop_in_on_step_end(tmp_path):
    # Epoch 0 ends after step 2 (one micro-batch unseen), epoch 1 after step 4; epoch 2 runs in full.
    hf, ours = _pair(tmp_path, _stop_eval_save_args(), lambda base: [StopEpochAt(2, 4)])
    _assert_same_run(hf, ours)


@pytest.mark.parametrize("flag", ["should_epoch_stop", "should_training_stop"])
def test_stop_flag_raised_inside_an_accumulation_window(tmp_path, flag):
    """HF checks the stop flags after every micro-batch, so a flag from ``on_substep_end`` cuts the window."""
    hf, ours = _pair(tmp_path, dict(logging_steps=1), lambda base: [StopInsideWindow(after_step=3, flag=flag)])
    _assert_same_run(hf, ours)


@pytest.mark.parametrize("strategies", [
    dict(),
    dict(logging_strategy="no", eval_strategy="no", save_strategy="no"),
    dict(logging_steps=2, eval_strategy="steps", eval_steps=3, save_strategy="steps", save_steps=4),
], ids=["default", "all_no", "steps"])
def test_forced_log_evaluate_save_at_odd_steps(tmp_path, strategies):
    hf, ours = _pair(tmp_path, strategies, lambda base: [ForceAtOddSteps()])
    _assert_same_run(hf, ours)
    assert "checkpoint-1" in ours.checkpoints()


def test_callback_returning_a_new_control(tmp_path):
    hf, ours = _pair(tmp_path, dict(logging_steps=4), lambda base: [ReturnsNewControl()])
    _assert_same_run(hf, ours)
    assert [e["step"] for e in ours.log_history if "loss" in e][:2] == [2, 4]


# ---------------------------------------------------------------------------------------------- flow arguments
FLOW_ARGS = [
    ("eval_on_start", dict(eval_on_start=True, eval_strategy="steps", eval_steps=4)),
    ("eval_delay_steps", dict(eval_strategy="steps", eval_steps=2, eval_delay=5)),
    ("eval_delay_epochs", dict(eval_strategy="epoch", eval_delay=2)),
    ("all_epoch", dict(logging_strategy="epoch", eval_strategy="epoch", save_strategy="epoch")),
    ("epoch_fractional_end", dict(logging_strategy="epoch", eval_strategy="epoch", save_strategy="epoch",
                                  num_train_epochs=1.5)),
    ("logging_first_step", dict(logging_steps=4, logging_first_step=True)),
    ("eval_save_steps_max_steps_tail", dict(max_steps=7, eval_strategy="steps", eval_steps=3,
                                            save_strategy="steps", save_steps=3)),
    ("save_total_limit", dict(eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
                              save_total_limit=2)),
]


@pytest.mark.parametrize("name,args", FLOW_ARGS, ids=[f[0] for f in FLOW_ARGS])
def test_flow_arguments(tmp_path, name, args):
    hf, ours = _pair(tmp_path, args)
    _assert_same_run(hf, ours)


@pytest.mark.parametrize("greater_is_better,save_total_limit", [(False, None), (True, None), (False, 1)])
def test_save_strategy_best(tmp_path, greater_is_better, save_total_limit):
    """Checkpoints only at evaluations that improve ``metric_for_best_model``; none at the end."""
    hf, ours = _pair(tmp_path, dict(eval_strategy="steps", eval_steps=2, save_strategy="best",
                                    metric_for_best_model="loss", greater_is_better=greater_is_better,
                                    save_total_limit=save_total_limit))
    _assert_same_run(hf, ours)
    assert ours.trainer.state.best_metric == pytest.approx(hf.trainer.state.best_metric, rel=1e-5)
    assert ours.checkpoints()


@pytest.mark.parametrize("patience,greater_is_better", [(1, True), (2, True), (2, False)])
def test_early_stopping_with_load_best_model_at_end(tmp_path, patience, greater_is_better):
    """``greater_is_better=True`` on a falling loss makes every evaluation after the first one worse: stop early."""
    import transformers

    import hf_lightning

    def early_stopping(base):
        lib = transformers if base is transformers.Trainer else hf_lightning
        return [lib.EarlyStoppingCallback(early_stopping_patience=patience)]

    hf, ours = _pair(tmp_path, dict(eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
                                    load_best_model_at_end=True, metric_for_best_model="loss",
                                    greater_is_better=greater_is_better, save_total_limit=2),
                     early_stopping)
    _assert_same_run(hf, ours)
    if greater_is_better:
        assert ours.train_output.global_step == 2 * (patience + 1) < 9
    # load_best_model_at_end: the final weights are the best checkpoint's, in both.
    assert _folder_name(ours.trainer.state.best_model_checkpoint) == \
        _folder_name(hf.trainer.state.best_model_checkpoint)
