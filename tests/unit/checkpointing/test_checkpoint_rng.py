"""RNG files: same content as HF's `_save_rng_state`, safe loading, NumPy 1.x files, missing files."""

import io
import logging
import os
import random

import numpy as np
import pytest
import torch
from ckpt_helpers import hf_trainer, rng_snapshot, scramble_rng

from hf_lightning.checkpointing.errors import CheckpointLoadError
from hf_lightning.checkpointing.layout import rng_file_name
from hf_lightning.checkpointing.rng import capture_rng_state, restore_rng_state
from hf_lightning.checkpointing.safe_load import rng_safe_globals, safe_torch_load


def _draws():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_capture_matches_hf_rng_file(tmp_path):
    trainer = hf_trainer(tmp_path / "hf")
    ours = capture_rng_state()
    trainer._save_rng_state(str(tmp_path))
    hf = safe_torch_load(tmp_path / "rng_state.pth", extra_safe_globals=rng_safe_globals())

    assert set(ours) == set(hf) == {"python", "numpy", "cpu"} | ({"cuda"} if torch.cuda.is_available() else set())
    assert ours["python"] == hf["python"]
    assert ours["numpy"][0] == hf["numpy"][0] and np.array_equal(ours["numpy"][1], hf["numpy"][1])
    assert ours["numpy"][2:] == hf["numpy"][2:]
    assert torch.equal(ours["cpu"], hf["cpu"])


@pytest.mark.parametrize("world_size,process_index,name", [(1, 0, "rng_state.pth"), (2, 0, "rng_state_0.pth"),
                                                           (4, 3, "rng_state_3.pth")])
def test_rng_file_name(world_size, process_index, name):
    assert rng_file_name(process_index, world_size) == name


def test_restore_reproduces_draws(tmp_path):
    torch.save(capture_rng_state(), tmp_path / "rng_state_1.pth")
    expected = _draws()
    scramble_rng()
    assert restore_rng_state(tmp_path, process_index=1, world_size=2) is True
    assert _draws() == expected


def test_hf_written_file_restores_the_same_state(tmp_path):
    trainer = hf_trainer(tmp_path / "hf")
    trainer._save_rng_state(str(tmp_path))
    saved = rng_snapshot()
    scramble_rng()
    restore_rng_state(tmp_path)
    assert rng_snapshot() == saved


def test_file_written_with_numpy_1_loads(tmp_path):
    # NumPy 1.x pickles its array rebuild function as `numpy.core.multiarray._reconstruct` (2.x: `numpy._core`).
    buffer = io.BytesIO()
    torch.save(capture_rng_state(), buffer, _use_new_zipfile_serialization=False)
    legacy = buffer.getvalue().replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert b"numpy.core.multiarray" in legacy
    (tmp_path / "rng_state.pth").write_bytes(legacy)
    expected = _draws()
    scramble_rng()
    assert restore_rng_state(tmp_path) is True
    assert _draws() == expected


def test_missing_file_is_logged_not_raised(tmp_path, caplog):
    before = rng_snapshot()
    with caplog.at_level(logging.INFO, logger="hf_lightning.checkpointing.rng"):
        assert restore_rng_state(tmp_path, process_index=1, world_size=2) is False
    assert "No rng_state_1.pth" in caplog.text
    assert rng_snapshot() == before


def test_file_without_rng_states_is_refused(tmp_path):
    torch.save({"python": 1}, tmp_path / "rng_state.pth")
    with pytest.raises(CheckpointLoadError, match=r"rng_state.pth: it does not hold the python / numpy / cpu"):
        restore_rng_state(tmp_path)


def test_object_arrays_are_not_allowed(tmp_path):
    # Only the uint32 MT19937 key array is allowlisted, not arbitrary NumPy content.
    torch.save({"python": random.getstate(), "numpy": np.array([object()], dtype=object),
                "cpu": torch.random.get_rng_state()}, tmp_path / "rng_state.pth")
    with pytest.raises(CheckpointLoadError, match="rng_state.pth"):
        restore_rng_state(tmp_path)
    assert os.path.isfile(tmp_path / "rng_state.pth")
