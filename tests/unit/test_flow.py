"""flow.step_end_flags / epoch_end_flags against transformers' DefaultFlowCallback, table-driven, no Lightning."""

import enum
from types import SimpleNamespace

import pytest

from hf_lightning.callbacks.hf_api import DefaultFlowCallback
from hf_lightning.flow import FlowFlags, epoch_end_flags, step_end_flags
from hf_lightning.state import TrainerControl, TrainerState

FLAG_NAMES = ("should_log", "should_evaluate", "should_save", "should_training_stop")

# Each row: TrainingArguments keywords (beyond output_dir/use_cpu/report_to) and an optional state override.
ARG_TABLE = [
    pytest.param({"logging_steps": 2}, {}, id="defaults-log2"),
    pytest.param({"logging_steps": 2, "eval_strategy": "steps", "eval_steps": 3, "save_steps": 3}, {}, id="brief"),
    pytest.param({"logging_steps": 2, "eval_strategy": "steps", "eval_steps": 4, "save_steps": 4}, {}, id="golden"),
    pytest.param({"logging_steps": 5, "eval_strategy": "steps", "eval_steps": 2, "eval_delay": 4}, {}, id="delay"),
    pytest.param({"logging_strategy": "epoch", "logging_first_step": True}, {}, id="first-step"),
    pytest.param({"logging_first_step": True, "logging_steps": 1}, {}, id="first-step-and-every"),
    pytest.param(
        {"logging_strategy": "epoch", "eval_strategy": "epoch", "save_strategy": "epoch", "eval_delay": 1},
        {},
        id="all-epoch-delay1",
    ),
    pytest.param(
        {"eval_strategy": "steps", "eval_steps": 3, "save_strategy": "best", "metric_for_best_model": "loss"},
        {},
        id="save-best",
    ),
    pytest.param({"logging_strategy": "no", "eval_strategy": "no", "save_strategy": "no"}, {}, id="all-no"),
    pytest.param(
        {"logging_steps": 0.25, "eval_strategy": "steps", "eval_steps": 0.1, "save_steps": 0.5}, {}, id="ratios"
    ),
    pytest.param({"eval_strategy": "steps", "eval_steps": 4}, {"save_steps": 0}, id="save-steps-0"),
    pytest.param({"eval_strategy": "steps", "eval_steps": 5, "eval_delay": 100}, {}, id="delay-beyond-end"),
]


def _hf_args(tmp_path, kwargs):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs)


def _states(args, max_steps, override):
    from transformers import TrainerState as HFTrainerState

    ours, theirs = TrainerState(max_steps=max_steps), HFTrainerState(max_steps=max_steps)
    for state in (ours, theirs):
        state.compute_steps(args, max_steps)
        for key, value in override.items():
            setattr(state, key, value)
    return ours, theirs


def _flags(control):
    return tuple(getattr(control, name) for name in FLAG_NAMES)


def _hf_flow(hook, args, state):
    from transformers import DefaultFlowCallback as HFDefaultFlowCallback
    from transformers import TrainerControl as HFTrainerControl

    return _flags(getattr(HFDefaultFlowCallback(), hook)(args, state, HFTrainerControl()))


@pytest.mark.parametrize(("kwargs", "override"), ARG_TABLE)
@pytest.mark.parametrize("max_steps", [6, 11, 16])
def test_step_end_flags_match_hf(tmp_path, kwargs, override, max_steps):
    args = _hf_args(tmp_path, kwargs)
    ours, theirs = _states(args, max_steps, override)
    for step in range(1, max_steps + 2):
        ours.global_step = theirs.global_step = step
        expected = _hf_flow("on_step_end", args, theirs)
        assert _flags(step_end_flags(args, ours)) == expected, (step, kwargs)
        control = DefaultFlowCallback().on_step_end(args, ours, TrainerControl())
        assert _flags(control) == expected, (step, kwargs)


@pytest.mark.parametrize(("kwargs", "override"), ARG_TABLE)
def test_epoch_end_flags_match_hf(tmp_path, kwargs, override):
    args = _hf_args(tmp_path, kwargs)
    ours, theirs = _states(args, 16, override)
    for epoch in (0, 0.5, 0.999, 1.0, 1.5, 2.0, 3):
        ours.epoch = theirs.epoch = epoch
        ours.global_step = theirs.global_step = 8
        expected = _hf_flow("on_epoch_end", args, theirs)
        assert _flags(epoch_end_flags(args, ours)) == expected, (epoch, kwargs)
        control = DefaultFlowCallback().on_epoch_end(args, ours, TrainerControl())
        assert _flags(control) == expected, (epoch, kwargs)


def test_raised_flags_are_never_lowered(tmp_path):
    from transformers import DefaultFlowCallback as HFDefaultFlowCallback
    from transformers import TrainerControl as HFTrainerControl

    args = _hf_args(tmp_path, {"logging_steps": 10})
    ours, theirs = _states(args, 20, {})
    ours.global_step = theirs.global_step = 3
    raised = dict.fromkeys(FLAG_NAMES, True)
    for hook in ("on_step_end", "on_epoch_end"):
        expected = _flags(getattr(HFDefaultFlowCallback(), hook)(args, theirs, HFTrainerControl(**raised)))
        assert _flags(getattr(DefaultFlowCallback(), hook)(args, ours, TrainerControl(**raised))) == expected


class _Strategy(str, enum.Enum):
    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"


def _plain_args(strategy_type, **overrides):
    values = {
        "logging_strategy": "steps",
        "logging_first_step": False,
        "eval_strategy": "steps",
        "eval_delay": 0,
        "save_strategy": "steps",
    }
    values.update(overrides)
    for key in ("logging_strategy", "eval_strategy", "save_strategy"):
        values[key] = strategy_type(values[key])
    return SimpleNamespace(**values)


STEP_TABLE = [
    # (args overrides, global_step, max_steps, expected flag names)
    ({}, 1, 12, []),
    ({"logging_first_step": True}, 1, 12, ["log"]),
    ({}, 2, 12, ["log"]),
    ({}, 3, 12, ["eval", "save"]),
    ({}, 6, 12, ["log", "eval", "save"]),
    ({}, 11, 11, ["eval", "save", "stop"]),
    ({"eval_delay": 12}, 11, 11, ["save", "stop"]),
    ({"save_strategy": "epoch", "eval_strategy": "epoch"}, 12, 12, ["log", "stop"]),
    ({"logging_strategy": "no"}, 13, 12, ["eval", "save", "stop"]),
]


@pytest.mark.parametrize("strategy_type", [str, _Strategy], ids=["str", "str-enum"])
@pytest.mark.parametrize(("overrides", "step", "max_steps", "expected"), STEP_TABLE)
def test_step_end_flags_table(strategy_type, overrides, step, max_steps, expected):
    args = _plain_args(strategy_type, **overrides)
    state = TrainerState(global_step=step, max_steps=max_steps, logging_steps=2, eval_steps=3, save_steps=3)
    assert step_end_flags(args, state).names() == expected


EPOCH_TABLE = [
    ({}, 1.0, []),
    ({"logging_strategy": "epoch"}, 1.0, ["log"]),
    ({"eval_strategy": "epoch", "eval_delay": 2}, 1.0, []),
    ({"eval_strategy": "epoch", "eval_delay": 2}, 2.0, ["eval"]),
    ({"eval_strategy": "epoch", "save_strategy": "epoch", "logging_strategy": "epoch"}, 0.5, ["log", "eval", "save"]),
]


@pytest.mark.parametrize("strategy_type", [str, _Strategy], ids=["str", "str-enum"])
@pytest.mark.parametrize(("overrides", "epoch", "expected"), EPOCH_TABLE)
def test_epoch_end_flags_table(strategy_type, overrides, epoch, expected):
    args = _plain_args(strategy_type, **overrides)
    assert epoch_end_flags(args, TrainerState(epoch=epoch, global_step=5, max_steps=5)).names() == expected


@pytest.mark.parametrize("field", ["logging_steps", "eval_steps"])
def test_zero_interval_with_steps_strategy_is_a_clear_error(field):
    state = TrainerState(global_step=1, max_steps=10, **{field: 0})
    with pytest.raises(ValueError, match=f"state.{field} is 0 but its strategy is 'steps'; set `{field}`"):
        step_end_flags(_plain_args(str), state)


def test_apply_returns_the_same_control():
    control = TrainerControl(should_epoch_stop=True)
    assert FlowFlags(should_save=True).apply(control) is control
    assert control == TrainerControl(should_epoch_stop=True, should_save=True)
