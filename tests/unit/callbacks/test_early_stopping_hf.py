"""EarlyStoppingCallback: same decisions as transformers' for the same evaluations."""

import logging
import math
from types import SimpleNamespace

import numpy as np
import pytest

from hf_lightning.callbacks import hf_api
from hf_lightning.callbacks.hf_api import (
    CallbackHandler,
    DefaultFlowCallback,
    EarlyStoppingCallback,
    EarlyStoppingConfigError,
)
from hf_lightning.state import TrainerControl, TrainerState


def _hf():
    from transformers import trainer_callback

    return trainer_callback


def _args(tmp_path, metric, greater_is_better):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        eval_strategy="steps",
        eval_steps=1,
        save_steps=1,
        load_best_model_at_end=True,
        metric_for_best_model=metric,
        greater_is_better=greater_is_better,
    )


def _update_best(args, state, metrics):
    """What HF's Trainer does after on_evaluate (`_determine_best_metric`)."""
    key = args.metric_for_best_model
    key = key if key.startswith("eval_") else f"eval_{key}"
    if key not in metrics:
        return
    better = np.greater if args.greater_is_better else np.less
    if state.best_metric is None:
        state.best_metric = float("-inf") if args.greater_is_better else float("inf")
    if better(metrics[key], state.best_metric):
        state.best_metric = metrics[key]
        state.best_global_step = state.global_step


def _run(handler, callback, state, control, args, sequence, key):
    handler.on_train_begin(args, state, control)
    decisions = []
    for value in sequence:
        state.global_step += 1
        control = handler.on_step_begin(args, state, control)
        control = handler.on_step_end(args, state, control)
        metrics = {} if value is None else {key: value}
        control = handler.on_evaluate(args, state, control, metrics=metrics)
        _update_best(args, state, metrics)
        decisions.append((callback.early_stopping_patience_counter, control.should_training_stop, state.best_metric))
    return decisions


SEQUENCES = [
    # (metric_for_best_model, greater_is_better, metric key reported, values)
    ("loss", False, "eval_loss", [1.0, 0.9, 0.95, 0.96, 0.8, 0.85, 0.86, 0.87, 0.7]),
    ("eval_loss", False, "eval_loss", [1.0, 1.0, 0.99, 0.98, 0.985, 0.97]),
    ("accuracy", True, "eval_accuracy", [0.5, 0.6, 0.6, 0.61, 0.55, 0.7, 0.69, 0.71]),
    ("loss", False, "eval_loss", [1.0, float("nan"), 0.9, float("nan"), float("nan"), 0.5]),
    ("loss", False, "eval_loss", [1.0, None, 1.1, None, 0.5]),
]


@pytest.mark.parametrize(("metric", "greater", "key", "values"), SEQUENCES)
@pytest.mark.parametrize("patience", [1, 2, 3])
@pytest.mark.parametrize("threshold", [0.0, 0.015, 0.05])
def test_decisions_match_hf(tmp_path, metric, greater, key, values, patience, threshold):
    hf = _hf()
    args = _args(tmp_path, metric, greater)
    ours_cb = EarlyStoppingCallback(patience, threshold)
    theirs_cb = hf.EarlyStoppingCallback(patience, threshold)
    state = TrainerState(max_steps=100)
    hf_state = hf.TrainerState(max_steps=100)
    for st in (state, hf_state):
        st.compute_steps(args, 100)
    ours = _run(
        CallbackHandler([DefaultFlowCallback, ours_cb], None, None, None, None),
        ours_cb,
        state,
        TrainerControl(),
        args,
        values,
        key,
    )
    theirs = _run(
        hf.CallbackHandler([hf.DefaultFlowCallback, theirs_cb], None, None, None, None),
        theirs_cb,
        hf_state,
        hf.TrainerControl(),
        args,
        values,
        key,
    )
    assert _nan_safe(ours) == _nan_safe(theirs)
    assert ours_cb.state() == theirs_cb.state()


def _nan_safe(decisions):
    return [(c, s, "nan" if isinstance(b, float) and math.isnan(b) else b) for c, s, b in decisions]


def test_stop_flag_survives_to_the_loop():
    args = SimpleNamespace(
        eval_strategy="steps", metric_for_best_model="loss", greater_is_better=False, load_best_model_at_end=True
    )
    callback = EarlyStoppingCallback(early_stopping_patience=1)
    control = TrainerControl(should_save=True)
    callback.on_evaluate(args, TrainerState(best_metric=0.5), control, metrics={"eval_loss": 0.6})
    assert control.should_training_stop and control.should_save


def test_missing_metric_warns_and_changes_nothing(caplog):
    args = SimpleNamespace(metric_for_best_model="accuracy", greater_is_better=True)
    callback = EarlyStoppingCallback()
    control = TrainerControl()
    with caplog.at_level(logging.WARNING, logger=hf_api.__name__):
        assert callback.on_evaluate(args, TrainerState(best_metric=1.0), control, metrics={"eval_loss": 1}) is None
    assert "did not find eval_accuracy so early stopping is disabled" in caplog.text
    assert callback.early_stopping_patience_counter == 0
    assert control == TrainerControl()


def test_warns_without_load_best_model_at_end(caplog):
    args = SimpleNamespace(eval_strategy="epoch", metric_for_best_model="loss", load_best_model_at_end=False)
    with caplog.at_level(logging.WARNING, logger=hf_api.__name__):
        EarlyStoppingCallback().on_train_begin(args, TrainerState(), TrainerControl())
    assert "without load_best_model_at_end=True" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"metric_for_best_model": None}, "requires metric_for_best_model to be defined: set `metric_for_best_model`"),
        ({"eval_strategy": "no"}, "requires IntervalStrategy of steps or epoch: set `eval_strategy`"),
    ],
)
def test_bad_configuration_fails_at_train_begin(overrides, message):
    values = {"eval_strategy": "steps", "metric_for_best_model": "loss", "load_best_model_at_end": True}
    values.update(overrides)
    with pytest.raises(EarlyStoppingConfigError, match=message) as info:
        EarlyStoppingCallback().on_train_begin(SimpleNamespace(**values), TrainerState(), TrainerControl())
    # HF raises AssertionError here; code catching it keeps working.
    assert isinstance(info.value, AssertionError) and isinstance(info.value, ValueError)


def test_hf_rejects_the_same_configurations(tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(AssertionError, match="metric_for_best_model"):
        _hf().EarlyStoppingCallback().on_train_begin(args, _hf().TrainerState(), _hf().TrainerControl())
    with pytest.raises(AssertionError, match="metric_for_best_model"):
        EarlyStoppingCallback().on_train_begin(args, TrainerState(), TrainerControl())


@pytest.mark.parametrize(
    ("patience", "error", "message"),
    [
        (0, ValueError, "early_stopping_patience must be >= 1, got 0"),
        (1.5, TypeError, "early_stopping_patience must be an int, got 1.5"),
        (True, TypeError, "early_stopping_patience must be an int, got True"),
    ],
)
def test_bad_patience_is_rejected(patience, error, message):
    with pytest.raises(error, match=message):
        EarlyStoppingCallback(early_stopping_patience=patience)


def test_state_round_trips_like_hf():
    callback = EarlyStoppingCallback(3, 0.01)
    callback.early_stopping_patience_counter = 2
    hf_callback = _hf().EarlyStoppingCallback(3, 0.01)
    hf_callback.early_stopping_patience_counter = 2
    assert callback.state() == hf_callback.state()
    stored = TrainerState(stateful_callbacks=[callback]).stateful_callbacks["EarlyStoppingCallback"]
    assert EarlyStoppingCallback.from_state(stored).state() == callback.state()
    # HF can restore from what we store, and we from what HF stores.
    assert _hf().EarlyStoppingCallback.from_state(callback.state()).state() == hf_callback.state()
    assert EarlyStoppingCallback.from_state(hf_callback.state()).state() == callback.state()


def test_none_threshold_means_zero():
    args = SimpleNamespace(greater_is_better=True)
    callback = EarlyStoppingCallback(early_stopping_threshold=None)
    callback.check_metric_value(args, TrainerState(best_metric=0.5), TrainerControl(), 0.51)
    assert callback.early_stopping_patience_counter == 0
