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
