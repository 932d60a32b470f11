"""Our Adafactor against transformers.optimization.Adafactor: same parameters, same gradients, same trajectory."""

import io

import pytest
import torch

from hf_lightning.optim import Adafactor, AdafactorSchedule, get_adafactor_schedule

transformers = pytest.importorskip("transformers")
HFAdafactor = transformers.optimization.Adafactor
HFAdafactorSchedule = transformers.optimization.AdafactorSchedule

SHAPES = {"factored_2d": (4, 6), "unfactored_1d": (6,), "factored_3d": (2, 3, 5)}

OPTIONS = {
    "trainer_default": {"lr": 1e-2, "scale_parameter": False, "relative_step": False},
    "manual_lr_beta1": {"lr": 1e-2, "scale_parameter": False, "relative_step": False, "beta1": 0.9},
    "manual_lr_scaled": {"lr": 1e-2, "scale_parameter": True, "relative_step": False},
    "relative_step": {},
    "relative_step_beta1": {"beta1": 0.9},
    "relative_warmup_init": {"warmup_init": True, "beta1": 0.5},
    "weight_decay_clip": {"weight_decay": 0.1, "clip_threshold": 0.5, "decay_rate": -0.5, "eps": (1e-20, 1e-2)},
}


def _params(shapes, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen).to(dtype)) for shape in shapes]


def _run(optimizer, params, steps, seed=1):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
        optimizer.step()


def _assert_states_close(ours, theirs, params_a, params_b):
    for a, b in zip(params_a, params_b):
        sa, sb = ours.state[a], theirs.state[b]
        assert sa.keys() == sb.keys()
        assert sa["step"] == sb["step"]
        for key in sa:
            if torch.is_tensor(sb[key]):
                torch.testing.assert_close(sa[key], sb[key], rtol=1e-6, atol=0)


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_trajectory_matches_hf(shape, options):
    ours_params, hf_params = _params([shape]), _params([shape])
    ours = Adafactor(ours_params, **options)
    theirs = HFAdafactor(hf_params, **options)
    assert ours.defaults == theirs.defaults
    _run(ours, ours_params, steps=6)
    _run(theirs, hf_params, steps=6)
    for a, b in zip(ours_params, hf_params):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)
    _assert_states_close(ours, theirs, ours_params, hf_params)


def test_mixed_groups_and_missing_grads_match_hf():
    shapes = [(4, 6), (6,), (3, 3)]
    ours_params, hf_params = _params(shapes), _params(shapes)

    def groups(ps):
        return [{"params": ps[:2], "weight_decay": 0.01}, {"params": ps[2:], "weight_decay": 0.0, "beta1": 0.9}]

    kwargs = {"lr": 3e-3, "scale_parameter": False, "relative_step": False}
    ours, theirs = Adafactor(groups(ours_params), **kwargs), HFAdafactor(groups(hf_params), **kwargs)
    _run(ours, ours_params, steps=3)
    _run(theirs, hf_params, steps=3)
    ours_params[1].grad = hf_params[1].grad = None  # a parameter without a gradient is skipped
    ours.step()
    theirs.step()
    for a, b in zip(ours_params, hf_params):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)
    _assert_states_close(ours, theirs, ours_params, hf_params)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_params_match_hf(dtype):
    ours_params, hf_params = _params([(4, 6), (6,)], dtype=dtype), _params([(4, 6), (6,)], dtype=dtype)
    ours, theirs = Adafactor(ours_params, beta1=0.9), HFAdafactor(hf_params, beta1=0.9)
    _run(ours, ours_params, steps=3)
    _run(theirs, hf_params, steps=3)
    for a, b in zip(ours_params, hf_params):
        assert a.dtype == dtype
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)


def test_state_dict_interchangeable_with_hf():
    shapes = [(4, 6), (6,)]
    ours_params, hf_params = _params(shapes), _params(shapes)
    ours, theirs = Adafactor(ours_params, beta1=0.9), HFAdafactor(hf_params, beta1=0.9)
    _run(ours, ours_params, steps=3)
    _run(theirs, hf_params, steps=3)

    buffer = io.BytesIO()
    torch.save(ours.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in ours_params]
    hf_resumed = HFAdafactor(resumed_params, beta1=0.9)
    hf_resumed.load_state_dict(saved)  # HF's optimizer continues from our optimizer.pt

    _run(theirs, hf_params, steps=2, seed=7)
    _run(hf_resumed, resumed_params, steps=2, seed=7)
    for a, b in zip(resumed_params, hf_params):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)


def test_schedule_reports_like_hf():
    ours_params, hf_params = _params([(4, 6), (6,)]), _params([(4, 6), (6,)])
    ours, theirs = Adafactor(ours_params, warmup_init=True), HFAdafactor(hf_params, warmup_init=True)
    ours_sched, hf_sched = get_adafactor_schedule(ours, initial_lr=0.5), HFAdafactorSchedule(theirs, initial_lr=0.5)
    assert isinstance(ours_sched, AdafactorSchedule)
    assert ours_sched.get_last_lr() == hf_sched.get_last_lr() == [0.5]
    assert "initial_lr" not in ours.param_groups[0]
    gen_a, gen_b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for _ in range(4):
        for ps, gen in ((ours_params, gen_a), (hf_params, gen_b)):
            for p in ps:
                p.grad = torch.randn(p.shape, generator=gen)
        ours.step()
        theirs.step()
        ours_sched.step()
        hf_sched.step()
        assert [float(x) for x in ours_sched.get_last_lr()] == [float(x) for x in hf_sched.get_last_lr()]
    assert ours_sched.state_dict().keys() == hf_sched.state_dict().keys()
    assert ours_sched.state_dict()["lr_lambdas"] == hf_sched.state_dict()["lr_lambdas"] == [None]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": 1e-3}, r"lr=0.001 together with relative_step=True"),
        ({"relative_step": False, "lr": 1e-3, "warmup_init": True}, r"warmup_init=True .*needs relative_step=True"),
    ],
)
def test_invalid_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Adafactor(_params([(2,)]), **kwargs)
    with pytest.raises(ValueError):
        HFAdafactor(_params([(2,)]), **kwargs)


def test_sparse_gradient_rejected():
    param = torch.nn.Parameter(torch.zeros(3, 2))
    param.grad = torch.zeros(3, 2).to_sparse()
    with pytest.raises(RuntimeError, match="does not support sparse gradients"):
        Adafactor([param]).step()


def test_closure_loss_returned():
    param = torch.nn.Parameter(torch.ones(2))
    opt = Adafactor([param])

    def closure():
        opt.zero_grad()
        loss = (param**2).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 2.0
