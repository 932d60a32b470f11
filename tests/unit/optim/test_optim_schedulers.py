"""Every lr_scheduler_type against transformers.get_scheduler: LR sequences compared with ==, not allclose."""

import inspect
import io
import json
import pickle
from types import SimpleNamespace

import pytest
import torch

from hf_lightning.optim import (
    SCHEDULER_REGISTRY,
    create_optimizer,
    create_scheduler,
    get_scheduler,
    resolve_warmup_steps,
)
from hf_lightning.optim import schedulers as ours_dispatch
from hf_lightning.optim import schedules as ours_module

transformers = pytest.importorskip("transformers")
from transformers import optimization as hf_module  # noqa: E402
from transformers.trainer_utils import SchedulerType  # noqa: E402

STEPS = 30
LR = 3e-3

# (name, num_warmup_steps, num_training_steps, scheduler_specific_kwargs)
LAMBDA_CASES = [
    ("linear", 0, 30, None),
    ("linear", 5, 30, None),
    ("linear", 40, 30, None),
    ("cosine", 0, 30, None),
    ("cosine", 3, 30, None),
    ("cosine", 4, 25, {"num_cycles": 1.5}),
    ("cosine_with_restarts", 0, 30, None),
    ("cosine_with_restarts", 3, 28, {"num_cycles": 3}),
    ("polynomial", 0, 30, None),
    ("polynomial", 4, 20, {"lr_end": 1e-5, "power": 2.0}),
    ("constant", 0, 30, None),
    ("constant", 7, None, {"ignored": True}),  # HF ignores warmup and kwargs for "constant"
    ("constant_with_warmup", 0, None, None),
    ("constant_with_warmup", 4, 30, {"ignored": 1}),  # ...and kwargs for "constant_with_warmup"
    ("inverse_sqrt", 0, None, None),
    ("inverse_sqrt", 5, None, None),
    ("inverse_sqrt", 5, 30, {"timescale": 3}),
    ("cosine_with_min_lr", 0, 30, {"min_lr_rate": 0.1}),
    ("cosine_with_min_lr", 5, 30, {"min_lr": 1e-4}),
    ("cosine_with_min_lr", 3, 30, {"min_lr": 7e-5, "num_cycles": 1.0}),
    ("cosine_warmup_with_min_lr", 0, 30, {"min_lr_rate": 0.1}),
    ("cosine_warmup_with_min_lr", 6, 30, {"min_lr": 1e-4}),
    ("cosine_warmup_with_min_lr", 6, 30, {"min_lr_rate": 0.05, "warmup_lr_rate": 0.2}),
    ("cosine_warmup_with_min_lr", 1, 30, {"min_lr_rate": 0.0, "warmup_lr_rate": 0.3}),
    ("warmup_stable_decay", 5, 30, {"num_decay_steps": 10}),
    ("warmup_stable_decay", 5, None, {"num_decay_steps": 8, "num_stable_steps": 6, "min_lr_ratio": 0.1}),
    ("warmup_stable_decay", 4, 30, {"num_decay_steps": 9, "warmup_type": "cosine", "decay_type": "linear"}),
    ("warmup_stable_decay", 6, 30, {"num_decay_steps": 12, "warmup_type": "1-sqrt", "decay_type": "1-sqrt"}),
    ("warmup_stable_decay", 0, 30, {"num_decay_steps": 20, "decay_type": "cosine", "num_cycles": 1.0}),
]


def _optimizer(lr=LR):
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))]
    return torch.optim.SGD([{"params": params[:1]}, {"params": params[1:], "weight_decay": 0.0}], lr=lr)


def _lr_sequence(scheduler, optimizer, steps=STEPS):
    seen = [scheduler.get_last_lr()]
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        seen.append(scheduler.get_last_lr())
    return seen


def _both(name, warmup, total, kwargs, hf_name=None):
    ours_opt, hf_opt = _optimizer(), _optimizer()
    ours = get_scheduler(name, ours_opt, warmup, total, None if kwargs is None else dict(kwargs))
    theirs = transformers.get_scheduler(
        hf_name or name, hf_opt, warmup, total, None if kwargs is None else dict(kwargs)
    )
    return (ours, ours_opt), (theirs, hf_opt)


def _case_id(case):
    name, warmup, total, kwargs = case
    return f"{name}-w{warmup}-t{total}-{json.dumps(kwargs, sort_keys=True) if kwargs else 'default'}"


@pytest.mark.filterwarnings("ignore:warmup_stable_decay got both", "ignore:Both num_training_steps")
@pytest.mark.parametrize("case", LAMBDA_CASES, ids=[_case_id(c) for c in LAMBDA_CASES])
def test_lr_sequence_bit_identical_to_hf(case):
    (ours, ours_opt), (theirs, hf_opt) = _both(*case)
    assert type(ours) is type(theirs) is torch.optim.lr_scheduler.LambdaLR
    assert _lr_sequence(ours, ours_opt) == _lr_sequence(theirs, hf_opt)


@pytest.mark.parametrize("case", LAMBDA_CASES[:20], ids=[_case_id(c) for c in LAMBDA_CASES[:20]])
def test_state_dict_equals_hf_and_loads_weights_only(case):
    (ours, ours_opt), (theirs, hf_opt) = _both(*case)
    _lr_sequence(ours, ours_opt, steps=7)
    _lr_sequence(theirs, hf_opt, steps=7)
    assert ours.state_dict() == theirs.state_dict()
    buffer = io.BytesIO()
    torch.save(ours.state_dict(), buffer)
    buffer.seek(0)
    # A scheduler.pt written by us resumes HF's scheduler (and vice versa: the dicts are equal).
    fresh_opt = _optimizer()
    resumed = transformers.get_scheduler(case[0], fresh_opt, case[1], case[2], case[3])
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert _lr_sequence(resumed, fresh_opt, 5)[1:] == _lr_sequence(ours, ours_opt, 5)[1:]


def test_scheduler_pickles():
    scheduler = get_scheduler("cosine", _optimizer(), 3, 30)
    clone = pickle.loads(pickle.dumps(scheduler))
    assert clone.lr_lambdas[0](10) == scheduler.lr_lambdas[0](10)


def test_accepts_hf_scheduler_type_enum():
    (ours, ours_opt), (theirs, hf_opt) = _both(SchedulerType.COSINE, 2, 30, None)
    assert _lr_sequence(ours, ours_opt) == _lr_sequence(theirs, hf_opt)


def test_registry_has_every_hf_scheduler_type():
    assert list(SCHEDULER_REGISTRY) == [member.value for member in SchedulerType]


@pytest.mark.parametrize(
    "kwargs", [{}, {"mode": "max", "factor": 0.5, "patience": 1, "threshold": 0.01, "cooldown": 1, "min_lr": 1e-4}]
)
def test_reduce_lr_on_plateau_matches_hf(kwargs):
    (ours, ours_opt), (theirs, hf_opt) = _both("reduce_lr_on_plateau", None, None, kwargs)
    assert type(ours) is type(theirs) is torch.optim.lr_scheduler.ReduceLROnPlateau
    metrics = [1.0, 0.9, 0.9, 0.95, 0.95, 0.97, 0.8, 0.8, 0.8, 0.8, 0.85, 0.9] * 3
    for value in metrics:
        ours.step(value)
        theirs.step(value)
        assert [g["lr"] for g in ours_opt.param_groups] == [g["lr"] for g in hf_opt.param_groups]


GREEDY_CASES = {
    "defaults": {},
    "small_patience": {"patience": 1, "factor": 0.5, "min_lr": 1e-4, "max_lr": 1e-2},
    "rel_cooldown_warmup": {"patience": 1, "threshold_mode": "rel", "threshold": 0.01, "cooldown": 2, "warmup": 1},
    "max_mode_smooth": {"mode": "max", "patience": 2, "smooth": True, "window_size": 3},
    "reset": {"patience": 0, "factor": 0.5, "min_lr": [1e-3, 2e-3], "reset_start": 2},
}


@pytest.mark.parametrize("kwargs", GREEDY_CASES.values(), ids=GREEDY_CASES.keys())
def test_greedy_matches_hf(kwargs):
    (ours, ours_opt), (theirs, hf_opt) = _both("greedy", None, None, kwargs)
    assert type(theirs) is hf_module.GreedyLR
    gen = torch.Generator().manual_seed(0)
    drift = torch.cat([torch.linspace(1.0, 0.2, 15), torch.full((15,), 0.2), torch.linspace(0.2, 0.6, 15)])
    metrics = (drift + 0.01 * torch.randn(45, generator=gen)).tolist()
    for value in metrics:
        ours.step(value)
        theirs.step(value)
        assert ours.get_last_lr() == theirs.get_last_lr()
        assert [g["lr"] for g in ours_opt.param_groups] == [g["lr"] for g in hf_opt.param_groups]
    assert ours.state_dict() == theirs.state_dict()

    # HF's greedy state resumes ours.
    resumed_opt = _optimizer()
    resumed = get_scheduler("greedy", resumed_opt, scheduler_specific_kwargs=kwargs)
    resumed.load_state_dict(theirs.state_dict())
    assert resumed.state_dict() == theirs.state_dict()
    assert [g["lr"] for g in resumed_opt.param_groups] == [g["lr"] for g in hf_opt.param_groups]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"factor": 1.0}, ValueError, r"factor must be < 1.0"),
        ({"mode": "up"}, ValueError, r"mode must be 'min' or 'max'"),
        ({"threshold_mode": "pct"}, ValueError, r"threshold_mode must be 'rel' or 'abs'"),
        ({"min_lr": [1e-3]}, ValueError, r"expected 2 min_lrs"),
    ],
)
def test_greedy_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        get_scheduler("greedy", _optimizer(), scheduler_specific_kwargs=kwargs)


# --- errors ---------------------------------------------------------------------------------------------------


NEED_WARMUP = [n for n in SCHEDULER_REGISTRY if n not in ("constant", "reduce_lr_on_plateau", "greedy")]


@pytest.mark.parametrize("name", NEED_WARMUP)
def test_missing_warmup_steps(name):
    with pytest.raises(ValueError, match=rf"^{name} requires `num_warmup_steps`, please provide that argument\.$"):
        get_scheduler(name, _optimizer(), num_training_steps=10)
    with pytest.raises(ValueError, match=r"requires `num_warmup_steps`"):
        transformers.get_scheduler(name, _optimizer(), num_training_steps=10)


@pytest.mark.parametrize(
    "name",
    ["linear", "cosine", "cosine_with_restarts", "polynomial", "cosine_with_min_lr", "cosine_warmup_with_min_lr"],
)
def test_missing_training_steps(name):
    with pytest.raises(ValueError, match=rf"^{name} requires `num_training_steps`, please provide that argument\.$"):
        get_scheduler(name, _optimizer(), num_warmup_steps=2)
    with pytest.raises(ValueError, match=r"requires `num_training_steps`"):
        transformers.get_scheduler(name, _optimizer(), num_warmup_steps=2)


def test_unknown_scheduler_lists_names():
    with pytest.raises(ValueError, match=r"lr_scheduler_type='cosyne' is not a known scheduler; use one of: linear, "):
        get_scheduler("cosyne", _optimizer(), 0, 10)


@pytest.mark.parametrize("name", ["cosine_with_min_lr", "cosine_warmup_with_min_lr"])
def test_min_lr_rules(name):
    with pytest.raises(ValueError, match=rf"{name}: set only one of `min_lr` or `min_lr_rate`"):
        get_scheduler(name, _optimizer(), 1, 10, {"min_lr": 1e-5, "min_lr_rate": 0.1})
    with pytest.raises(ValueError, match=rf"{name}: one of `min_lr` or `min_lr_rate` should be set"):
        get_scheduler(name, _optimizer(), 1, 10)
    for kwargs in ({"min_lr": 1e-5, "min_lr_rate": 0.1}, {}):
        with pytest.raises(ValueError, match="min_lr"):
            transformers.get_scheduler(name, _optimizer(), 1, 10, kwargs)


@pytest.mark.parametrize("lr_end", [LR, 1.0])
def test_polynomial_lr_end_must_be_below_lr(lr_end):
    with pytest.raises(ValueError, match=rf"lr_end \({lr_end}\) must be smaller than the initial lr \({LR}\)"):
        get_scheduler("polynomial", _optimizer(), 0, 10, {"lr_end": lr_end})
    with pytest.raises(ValueError, match="must be smaller than initial lr"):
        transformers.get_scheduler("polynomial", _optimizer(), 0, 10, {"lr_end": lr_end})


def test_polynomial_zero_length_decay_fails_early():
    # HF divides by zero once the schedule reaches step W == T; we refuse at construction.
    with pytest.raises(ValueError, match=r"num_training_steps \(5\) must differ from num_warmup_steps \(5\)"):
        get_scheduler("polynomial", _optimizer(), 5, 5)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({}, TypeError, r"warmup_stable_decay requires `num_decay_steps`"),
        ({"num_decay_steps": 3, "warmup_type": "exp"}, ValueError, r"unknown warmup_type 'exp'"),
        ({"num_decay_steps": 3, "decay_type": "step"}, ValueError, r"unknown decay_type 'step'"),
    ],
)
def test_wsd_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        get_scheduler("warmup_stable_decay", _optimizer(), 2, 10, kwargs)
    with pytest.raises(error):
        transformers.get_scheduler("warmup_stable_decay", _optimizer(), 2, 10, kwargs)


def test_wsd_needs_a_length():
    with pytest.raises(ValueError, match="either num_training_steps or num_stable_steps must be specified"):
        get_scheduler("warmup_stable_decay", _optimizer(), 2, None, {"num_decay_steps": 3})


def test_wsd_warns_when_both_lengths_given():
    with pytest.warns(UserWarning, match="num_stable_steps is used"):
        get_scheduler("warmup_stable_decay", _optimizer(), 2, 10, {"num_decay_steps": 3, "num_stable_steps": 1})


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("linear", {"num_cycles": 2}, r"\['num_cycles'\] are not accepted by the 'linear' scheduler; it takes: last_"),
        ("cosine", {"num_warmup_steps": 2}, r"\['num_warmup_steps'\] are not accepted by the 'cosine'"),
        ("reduce_lr_on_plateau", {"gamma": 0.1}, r"\['gamma'\] are not accepted .* it takes: mode, factor"),
    ],
)
def test_unexpected_scheduler_kwargs(name, kwargs, message):
    with pytest.raises(TypeError, match=message):
        get_scheduler(name, _optimizer(), 1, 10, kwargs)
    with pytest.raises(TypeError):
        transformers.get_scheduler(name, _optimizer(), 1, 10, kwargs)


# --- create_scheduler from TrainingArguments --------------------------------------------------------------------

ARGS_CASES = [
    {"lr_scheduler_type": "linear"},
    {"lr_scheduler_type": "linear", "warmup_steps": 0.1},
    {"lr_scheduler_type": "cosine", "warmup_steps": 3},
    {"lr_scheduler_type": "cosine", "warmup_steps": 2.7},
    {"lr_scheduler_type": "cosine_with_restarts", "warmup_steps": 0.25, "lr_scheduler_kwargs": {"num_cycles": 2}},
    {"lr_scheduler_type": "cosine_with_min_lr", "warmup_steps": 0.05, "lr_scheduler_kwargs": '{"min_lr": 1e-4}'},
    {"lr_scheduler_type": "polynomial", "lr_scheduler_kwargs": '{"power": "2", "lr_end": "0.00001"}'},
    {"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 4},
    {"lr_scheduler_type": "inverse_sqrt", "warmup_steps": 0.2},
    {"lr_scheduler_type": "warmup_stable_decay", "warmup_steps": 3, "lr_scheduler_kwargs": {"num_decay_steps": 10}},
    {"lr_scheduler_type": "reduce_lr_on_plateau", "lr_scheduler_kwargs": {"patience": 2}, "eval_strategy": "steps"},
]


@pytest.mark.parametrize("fields", ARGS_CASES, ids=[str(i) for i in range(len(ARGS_CASES))])
def test_create_scheduler_equals_hf_trainer(fields, tmp_path):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", learning_rate=LR, **fields
    )
    model = torch.nn.Linear(2, 2)
    trainer = transformers.Trainer(model=model, args=args, eval_dataset=[{"x": 0}])
    hf_opt = trainer.create_optimizer()
    theirs = trainer.create_scheduler(num_training_steps=STEPS, optimizer=hf_opt)

    ours_opt = create_optimizer(model, args)
    ours = create_scheduler(args, ours_opt, num_training_steps=STEPS)
    assert type(ours) is type(theirs)
    if isinstance(ours, torch.optim.lr_scheduler.LambdaLR):
        assert _lr_sequence(ours, ours_opt) == _lr_sequence(theirs, hf_opt)
    else:
        assert ours.state_dict() == theirs.state_dict()


def test_create_scheduler_without_get_warmup_steps_uses_hf_rule(tmp_path):
    for warmup in (0, 0.1, 0.5, 1, 2.9, 7):
        hf_args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", warmup_steps=warmup)
        plain = SimpleNamespace(lr_scheduler_type="linear", lr_scheduler_kwargs=None, warmup_steps=warmup)
        assert resolve_warmup_steps(warmup, 16) == hf_args.get_warmup_steps(16)
        ours_opt, hf_opt = _optimizer(), _optimizer()
        ours = create_scheduler(plain, ours_opt, 16)
        theirs = transformers.get_scheduler("linear", hf_opt, hf_args.get_warmup_steps(16), 16)
        assert _lr_sequence(ours, ours_opt, 16) == _lr_sequence(theirs, hf_opt, 16)


def test_create_scheduler_string_kwargs_coerced_like_hf(tmp_path):
    text = '{"num_cycles": "3", "flag": "True", "rate": "0.5", "name": "x1"}'
    hf_args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", lr_scheduler_kwargs=text)
    assert ours_dispatch._scheduler_kwargs(text) == hf_args.lr_scheduler_kwargs


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("num_cycles=2", r"lr_scheduler_kwargs='num_cycles=2' is not valid JSON"),
        ("[1, 2]", r"lr_scheduler_kwargs must be a dict or a JSON object string; got str"),
        (3, r"lr_scheduler_kwargs must be a dict or a JSON object string; got int"),
    ],
)
def test_create_scheduler_bad_kwargs(raw, message):
    args = SimpleNamespace(lr_scheduler_type="cosine", lr_scheduler_kwargs=raw, warmup_steps=0)
    with pytest.raises(ValueError, match=message):
        create_scheduler(args, _optimizer(), 10)


def test_negative_warmup_rejected():
    with pytest.raises(ValueError, match=r"warmup_steps must be >= 0"):
        resolve_warmup_steps(-1, 10)


def test_public_schedule_functions_match_hf_names():
    for name in (
        "get_constant_schedule",
        "get_constant_schedule_with_warmup",
        "get_linear_schedule_with_warmup",
        "get_cosine_schedule_with_warmup",
        "get_cosine_with_hard_restarts_schedule_with_warmup",
        "get_polynomial_decay_schedule_with_warmup",
        "get_inverse_sqrt_schedule",
        "get_reduce_on_plateau_schedule",
        "get_cosine_with_min_lr_schedule_with_warmup",
        "get_cosine_with_min_lr_schedule_with_warmup_lr_rate",
        "get_wsd_schedule",
        "get_greedy_schedule",
    ):
        ours = inspect.signature(getattr(ours_module, name)).parameters
        theirs = inspect.signature(getattr(hf_module, name)).parameters
        assert list(ours) == list(theirs), name
        assert [p.default for p in ours.values()] == [p.default for p in theirs.values()], name


def test_direct_call_with_last_epoch_resume():
    ours_opt, hf_opt = _optimizer(), _optimizer()
    for opt in (ours_opt, hf_opt):
        for group in opt.param_groups:
            group["initial_lr"] = LR
    ours = ours_module.get_linear_schedule_with_warmup(ours_opt, 3, 20, last_epoch=5)
    theirs = hf_module.get_linear_schedule_with_warmup(hf_opt, 3, 20, last_epoch=5)
    assert _lr_sequence(ours, ours_opt, 10) == _lr_sequence(theirs, hf_opt, 10)
