"""Names HF scripts import that hf_lightning now exports, with HF 5.23's signatures and behaviour."""

from __future__ import annotations

import inspect
import json
import os

import pytest
import torch

import hf_lightning

transformers = pytest.importorskip("transformers")
from transformers import trainer_utils as hf_trainer_utils  # noqa: E402

NEW_EXPORTS = ("ExportableState", "LengthGroupedSampler", "RemoveColumnsCollator", "GreedyLR", "DefaultDataCollator",
               "sort_checkpoints", "rotate_checkpoints", "DataCollatorForMultipleChoice")


def _hf_object(name):
    for module in ("transformers", "transformers.trainer_callback", "transformers.trainer_pt_utils",
                   "transformers.trainer_utils"):
        mod = __import__(module, fromlist=[name])
        if hasattr(mod, name):
            return getattr(mod, name)
    raise AssertionError(name)


def _parameters(obj):
    target = obj.__init__ if inspect.isclass(obj) else obj
    return [(p.name, p.default) for p in inspect.signature(target).parameters.values()]


@pytest.mark.parametrize("name", NEW_EXPORTS)
def test_exported_with_hfs_signature(name):
    assert name in hf_lightning.__all__
    ours = getattr(hf_lightning, name)
    assert _parameters(ours) == _parameters(_hf_object(name))


def _checkpoint(root, step):
    from safetensors.torch import save_file

    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    save_file({"w": torch.zeros(1)}, str(folder / "model.safetensors"))
    return folder


ROTATIONS = [
    {"save_total_limit": 2},
    {"save_total_limit": 1, "best_model_checkpoint": "checkpoint-20"},
    {"save_total_limit": 2, "best_model_checkpoint": "checkpoint-5"},
    {"save_total_limit": 0},
    {"save_total_limit": None},
]


@pytest.mark.parametrize("kwargs", ROTATIONS, ids=str)
def test_rotate_and_sort_checkpoints_as_hf(tmp_path, kwargs):
    steps = (5, 20, 100, 35)
    remaining = {}
    for side, rotate, sort in (("hf", hf_trainer_utils.rotate_checkpoints, hf_trainer_utils.sort_checkpoints),
                               ("ours", hf_lightning.rotate_checkpoints, hf_lightning.sort_checkpoints)):
        root = tmp_path / side
        for step in steps:
            _checkpoint(root, step)
        call = dict(kwargs)
        if call.get("best_model_checkpoint"):
            call["best_model_checkpoint"] = str(root / call["best_model_checkpoint"])
        best = call.get("best_model_checkpoint")
        # Positional call in HF's argument order: (output_dir, checkpoint_prefix, use_mtime, best).
        ordered = sort(str(root), "checkpoint", False, best)
        assert rotate(str(root), **call) is None
        remaining[side] = ([os.path.basename(p) for p in ordered], sorted(p.name for p in root.iterdir()))
    assert remaining["ours"] == remaining["hf"]


def test_rotate_checkpoints_with_another_prefix_as_hf(tmp_path):
    remaining = {}
    for side, rotate in (("hf", hf_trainer_utils.rotate_checkpoints), ("ours", hf_lightning.rotate_checkpoints)):
        root = tmp_path / side
        for step in (1, 3, 2):
            (root / f"run-{step}").mkdir(parents=True)
        rotate(str(root), 1, checkpoint_prefix="run")
        remaining[side] = sorted(p.name for p in root.iterdir())
    assert remaining["ours"] == remaining["hf"] == ["run-3"]
