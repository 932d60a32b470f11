import os

import pytest
import torch

# HF's Trainer and ours must run with the same thread count for bit-level parity (kernels reduce in a
# thread-count dependent order); one thread also keeps the suite stable on a 2-core machine.
torch.set_num_threads(1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture(autouse=True)
def _same_environment():
    """Each test leaves the process environment as it found it. Libraries run in-process set variables
    (``lightning.seed_everything``: ``PL_GLOBAL_SEED``; transformers' and accelerate's arguments and states; Ray), and
    the subprocesses later tests launch inherit them: under two pytest workers the order of files varies."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


# Opt-in long tests (e.g. the kill/resume fuzz with many trials): `pytest --run-slow` or HFL_SLOW=1.
def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False, help="also run tests marked slow")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long test, skipped unless --run-slow or HFL_SLOW=1")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow") or os.environ.get("HFL_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow test: run with --run-slow or HFL_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
