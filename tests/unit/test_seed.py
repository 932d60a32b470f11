"""set_seed / enable_full_determinism give what transformers' give."""

import os
import random

import numpy as np
import pytest
import torch

from hf_lightning.seed import enable_full_determinism, set_seed


def _draws():
    return (
        [random.random() for _ in range(3)],
        np.random.rand(3).tolist(),
        torch.rand(3).tolist(),
        torch.randint(0, 1000, (4,)).tolist(),
        torch.randperm(8).tolist(),
    )


@pytest.fixture
def restore_torch_determinism():
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


@pytest.mark.parametrize("seed", [0, 1, 42, 1234, 2**32 - 1])
def test_set_seed_gives_hf_draws(seed):
    from transformers import set_seed as hf_set_seed

    set_seed(seed)
    ours = _draws()
    hf_set_seed(seed)
    assert _draws() == ours


def test_set_seed_accepts_numpy_integers():
    from transformers import set_seed as hf_set_seed

    set_seed(np.int64(7))
    ours = _draws()
    hf_set_seed(7)
    assert _draws() == ours


@pytest.mark.usefixtures("restore_torch_determinism")
def test_set_seed_deterministic_turns_on_deterministic_algorithms():
    torch.use_deterministic_algorithms(False)
    set_seed(3, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize(
    ("seed", "error", "message"),
    [
        (-1, ValueError, r"seed must be in \[0, 2\*\*32 - 1\] \(NumPy's limit\), got -1"),
        (2**32, ValueError, "got 4294967296"),
        (1.5, TypeError, "seed must be an integer, got float 1.5"),
        ("42", TypeError, "seed must be an integer, got str '42'"),
        (True, TypeError, "seed must be an integer, got bool True"),
    ],
)
def test_bad_seed_is_a_clear_error(seed, error, message):
    with pytest.raises(error, match=message):
        set_seed(seed)


DETERMINISM_ENV = [
    "CUDA_LAUNCH_BLOCKING",
    "CUBLAS_WORKSPACE_CONFIG",
    "ASCEND_LAUNCH_BLOCKING",
    "HCCL_DETERMINISTIC",
    "FLASH_ATTENTION_DETERMINISTIC",
]


def _determinism_snapshot():
    return (
        {name: os.environ.get(name) for name in DETERMINISM_ENV},
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        _draws(),
    )


def _reset(monkeypatch):
    for name in DETERMINISM_ENV:
        monkeypatch.delenv(name, raising=False)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True


@pytest.mark.usefixtures("restore_torch_determinism")
@pytest.mark.parametrize("warn_only", [False, True])
def test_enable_full_determinism_matches_hf(monkeypatch, warn_only):
    from transformers import enable_full_determinism as hf_enable_full_determinism

    _reset(monkeypatch)
    enable_full_determinism(11, warn_only=warn_only)
    ours = _determinism_snapshot()
    _reset(monkeypatch)
    hf_enable_full_determinism(11, warn_only=warn_only)
    assert _determinism_snapshot() == ours
    assert ours[1] is True and ours[2] is warn_only


def test_without_lightning_reseed_hides_seed_everythings_leftover_from_lightnings_reset():
    """A `seed_everything` earlier in the process leaves PL_GLOBAL_SEED; Lightning's distributed strategies call
    `reset_seed()` at setup, which would seed again. Inside the facade's context that call changes nothing, and the
    variables are back afterwards."""
    import lightning.pytorch as pl
    from lightning.fabric.utilities.seed import reset_seed

    from hf_lightning.seed import without_lightning_reseed

    pl.seed_everything(7, workers=True, verbose=False)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with without_lightning_reseed():
        assert "PL_GLOBAL_SEED" not in os.environ and "PL_SEED_WORKERS" not in os.environ
        reset_seed()
        assert torch.equal(torch.rand(3), expected)
    assert os.environ["PL_GLOBAL_SEED"] == "7" and os.environ["PL_SEED_WORKERS"] == "1"
    torch.manual_seed(123)
    reset_seed()  # outside: Lightning seeds with 7 again
    assert not torch.equal(torch.rand(3), expected)
