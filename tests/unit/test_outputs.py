"""Output types, speed_metrics, denumpify_detensorize and get_last_checkpoint against transformers."""

import collections
import logging
import time

import numpy as np
import pytest
import torch

from hf_lightning.checkpointing import paths
from hf_lightning.checkpointing.completeness import is_complete_checkpoint
from hf_lightning.checkpointing.layout import PREFIX_CHECKPOINT_DIR, checkpoint_folder_name
from hf_lightning.checkpointing.paths import get_last_checkpoint
from hf_lightning.outputs import (
    EvalLoopOutput,
    EvalPrediction,
    PredictionOutput,
    TrainOutput,
    denumpify_detensorize,
    speed_metrics,
)


def _hf():
    from transformers import trainer_utils

    return trainer_utils


PREDS, LABELS, INPUTS, LOSSES = np.arange(4), np.ones(4), np.zeros((4, 2)), np.full(4, 0.5)


@pytest.mark.parametrize(
    "extras",
    [{}, {"inputs": INPUTS}, {"losses": LOSSES}, {"inputs": INPUTS, "losses": LOSSES}, {"inputs": None}],
    ids=["plain", "inputs", "losses", "both", "explicit-none"],
)
def test_eval_prediction_behaves_like_hf(extras):
    ours = EvalPrediction(PREDS, LABELS, **extras)
    theirs = _hf().EvalPrediction(PREDS, LABELS, **extras)
    assert len(list(ours)) == len(list(theirs))
    for a, b in zip(ours, theirs, strict=True):
        assert a is b
    for idx in range(len(theirs.elements)):
        assert ours[idx] is theirs[idx]
    for attr in ("predictions", "label_ids", "inputs", "losses"):
        assert getattr(ours, attr) is getattr(theirs, attr)
    for bad in (-1, len(theirs.elements)):
        with pytest.raises(IndexError, match="tuple index out of range"):
            ours[bad]
        with pytest.raises(IndexError, match="tuple index out of range"):
            theirs[bad]


def test_eval_prediction_unpacks():
    preds, labels = EvalPrediction(PREDS, LABELS)
    assert preds is PREDS and labels is LABELS
    preds, labels, inputs, losses = EvalPrediction(PREDS, LABELS, inputs=INPUTS, losses=LOSSES)
    assert inputs is INPUTS and losses is LOSSES


@pytest.mark.parametrize(
    ("ours", "name"),
    [(EvalLoopOutput, "EvalLoopOutput"), (PredictionOutput, "PredictionOutput"), (TrainOutput, "TrainOutput")],
)
def test_named_tuples_have_hf_fields(ours, name):
    theirs = getattr(_hf(), name)
    assert ours._fields == theirs._fields
    values = tuple(range(len(ours._fields)))
    assert tuple(ours(*values)) == tuple(theirs(*values))


SPEED_CASES = [
    # (runtime in seconds, num_samples, num_steps, num_tokens)
    (1.23456789, None, None, None),
    (1.23456789, 100, 10, 12345),
    (0.0137, 16, 2, None),
    (3.0, None, 7, None),
    (0.0, 100, 10, 1000),
    (12345.678912, 3, None, 99999),
]


@pytest.mark.parametrize(("runtime", "samples", "steps", "tokens"), SPEED_CASES)
def test_speed_metrics_match_hf(monkeypatch, runtime, samples, steps, tokens):
    start = 1_000_000.0
    monkeypatch.setattr(time, "time", lambda: start + runtime)
    for split in ("train", "eval", "test"):
        ours = speed_metrics(split, start, num_samples=samples, num_steps=steps, num_tokens=tokens)
        theirs = _hf().speed_metrics(split, start, num_samples=samples, num_steps=steps, num_tokens=tokens)
        assert ours == theirs
        assert list(ours) == list(theirs)


def test_speed_metrics_positional_signature():
    assert set(speed_metrics("eval", time.time() - 1, 10, 2)) == {
        "eval_runtime",
        "eval_samples_per_second",
        "eval_steps_per_second",
    }


Point = collections.namedtuple("Point", ["x", "y"])

DENUMPIFY_CASES = [
    {"a": np.float32(1.5), "b": np.int64(3), "c": torch.tensor(2.5), "d": torch.tensor([1.0, 2.0])},
    [np.float64(0.1), (np.int32(2), torch.tensor([[4]])), {"n": np.bool_(True)}, "text", None],
    (np.float16(1.0),),
    collections.OrderedDict(z=np.float64(1.0), a=np.array([1, 2])),
    np.float32(0.25),
    torch.tensor(7),
    "plain",
]


@pytest.mark.parametrize("metrics", DENUMPIFY_CASES)
def test_denumpify_detensorize_matches_hf(metrics):
    ours = denumpify_detensorize(metrics)
    theirs = _hf().denumpify_detensorize(metrics)
    assert type(ours) is type(theirs)
    assert repr(ours) == repr(theirs)


def test_denumpify_detensorize_keeps_named_tuples():
    # HF fails on named tuples (it passes a generator to their constructor); we rebuild them.
    assert denumpify_detensorize(Point(np.int64(1), torch.tensor(2.0))) == Point(1, 2.0)
    assert type(denumpify_detensorize(Point(1, 2))) is Point


# The smallest valid safetensors file (no tensors): a checkpoint's weights, for the completeness rule.
_EMPTY_SAFETENSORS = (2).to_bytes(8, "little") + b"{}"


def _make_checkpoint(folder, name, complete=True):
    path = folder / name
    path.mkdir()
    (path / "model.safetensors").write_bytes(_EMPTY_SAFETENSORS)
    if complete:
        (path / "trainer_state.json").write_text("{}")
    return path


def test_get_last_checkpoint_matches_hf_on_complete_folders(tmp_path):
    for name in ("checkpoint-5", "checkpoint-40", "checkpoint-100", "checkpoint-9", "checkpoint-200-old"):
        _make_checkpoint(tmp_path, name)
    (tmp_path / "checkpoint-300").write_text("a file, not a folder")
    (tmp_path / "runs").mkdir()
    assert get_last_checkpoint(tmp_path) == _hf().get_last_checkpoint(tmp_path)
    assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-100")


def test_get_last_checkpoint_skips_incomplete_folders(tmp_path, caplog):
    _make_checkpoint(tmp_path, "checkpoint-4")
    _make_checkpoint(tmp_path, "checkpoint-8", complete=False)
    # HF picks the half-written folder; we resume from the last complete one.
    assert _hf().get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-8")
    with caplog.at_level(logging.WARNING, logger=paths.__name__):
        assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-4")
    assert "checkpoint-8: its save did not finish (no trainer_state.json)" in caplog.text


@pytest.mark.parametrize("names", [[], ["other", "checkpoint-x"]], ids=["empty", "no-match"])
def test_get_last_checkpoint_returns_none_like_hf(tmp_path, names):
    for name in names:
        (tmp_path / name).mkdir()
    assert get_last_checkpoint(tmp_path) is None
    assert _hf().get_last_checkpoint(tmp_path) is None


def test_get_last_checkpoint_returns_none_when_all_incomplete(tmp_path):
    _make_checkpoint(tmp_path, "checkpoint-2", complete=False)
    assert get_last_checkpoint(tmp_path) is None


def test_get_last_checkpoint_bad_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="Cannot look for checkpoints in .*missing: it does not exist"):
        get_last_checkpoint(tmp_path / "missing")
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="it is not a directory"):
        get_last_checkpoint(tmp_path / "file")


def test_checkpoint_names(tmp_path):
    assert PREFIX_CHECKPOINT_DIR == _hf().PREFIX_CHECKPOINT_DIR
    assert checkpoint_folder_name(500) == "checkpoint-500"
    assert is_complete_checkpoint(_make_checkpoint(tmp_path, "checkpoint-1"))
    assert not is_complete_checkpoint(_make_checkpoint(tmp_path, "checkpoint-2", complete=False))
    assert not is_complete_checkpoint(tmp_path / "checkpoint-3")


def test_get_last_checkpoint_skips_a_truncated_trainer_state(tmp_path):
    from hf_lightning.checkpointing.paths import get_last_checkpoint

    for step, text in ((3, '{"global_step": 3}'), (5, '{"global_st')):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(_EMPTY_SAFETENSORS)
        (folder / "trainer_state.json").write_text(text)
    assert get_last_checkpoint(str(tmp_path)).endswith("checkpoint-3")
