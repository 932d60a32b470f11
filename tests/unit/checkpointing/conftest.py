"""One real HF Trainer run shared by the checkpoint tests."""

import os
from types import SimpleNamespace

import pytest
from ckpt_helpers import hf_trainer


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    """HF's Trainer trained 2 steps with save_steps=1: `output_dir/checkpoint-1`, `checkpoint-2`."""
    output_dir = tmp_path_factory.mktemp("hf_run") / "out"
    trainer = hf_trainer(output_dir)
    trainer.train()
    return SimpleNamespace(trainer=trainer, output_dir=str(output_dir),
                           checkpoint=os.path.join(str(output_dir), "checkpoint-2"))
