"""Checkpoint ordering and ``save_total_limit`` rotation against ``transformers.trainer_utils``."""

import itertools
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from hf_lightning.checkpointing.paths import get_last_checkpoint
from hf_lightning.checkpointing.rotation import (
    clean_stale_temporary_folders,
    final_cleanup_for_limit_one,
    rotate_checkpoints,
    sort_checkpoints,
)

STEPS = [2, 4, 6, 8, 10]
BASE_TIME = 1_700_000_000.0
# The smallest valid safetensors file (no tensors): an 8-byte header length and the header "{}".
EMPTY_SAFETENSORS = (2).to_bytes(8, "little") + b"{}"
# Modification time of each step's folder, in seconds after BASE_TIME.
MTIMES = {
    "increasing": {2: 0, 4: 10, 6: 20, 8: 30, 10: 40},
    # A resumed run rewrote early steps after later ones: mtime order differs from step order.
    "shuffled": {2: 30, 4: 0, 6: 40, 8: 10, 10: 20},
    "equal": {step: 0 for step in STEPS},
    # Coarse filesystem: everything within one second, HF falls back to step order.
    "sub_second": {2: 0.9, 4: 0.1, 6: 0.5, 8: 0.0, 10: 0.3},
}
BEST = {"none": None, "oldest": 2, "middle": 6, "newest": 10, "deleted": 12}
LIMITS = [None, 0, 1, 2, 3, 5]


def _make_tree(root: Path, mtimes: dict[int, float]) -> str:
    root.mkdir(parents=True)
    for step, offset in mtimes.items():
        folder = root / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(EMPTY_SAFETENSORS)
        (folder / "trainer_state.json").write_text("{}")
        os.utime(folder, (BASE_TIME + offset, BASE_TIME + offset))
    return str(root)


def _names(paths):
    return [os.path.basename(path) for path in paths]


def _best_path(output_dir, key):
    step = BEST[key]
    return None if step is None else os.path.join(output_dir, f"checkpoint-{step}")


@pytest.mark.parametrize("mtime_kind", list(MTIMES))
@pytest.mark.parametrize("use_mtime", [False, True])
@pytest.mark.parametrize("best", list(BEST))
def test_sort_matches_hf(tmp_path, mtime_kind, use_mtime, best):
    from transformers.trainer_utils import sort_checkpoints as hf_sort

    ours_dir = _make_tree(tmp_path / "ours", MTIMES[mtime_kind])
    hf_dir = _make_tree(tmp_path / "hf", MTIMES[mtime_kind])

    ours = sort_checkpoints(ours_dir, use_mtime=use_mtime, best_model_checkpoint=_best_path(ours_dir, best))
    expected = hf_sort(hf_dir, use_mtime=use_mtime, best_model_checkpoint=_best_path(hf_dir, best))

    assert _names(ours) == _names(expected)
    # Same spelling as HF's paths, so comparing with `best_model_checkpoint` strings works the same way.
    assert ours == [path.replace(hf_dir, ours_dir) for path in expected]


@pytest.mark.parametrize(
    "mtime_kind,best,limit", list(itertools.product(MTIMES, BEST, LIMITS)), ids=lambda value: str(value)
)
def test_rotate_matches_hf(tmp_path, mtime_kind, best, limit):
    from transformers.trainer_utils import rotate_checkpoints as hf_rotate

    ours_dir = _make_tree(tmp_path / "ours", MTIMES[mtime_kind])
    hf_dir = _make_tree(tmp_path / "hf", MTIMES[mtime_kind])

    deleted = rotate_checkpoints(ours_dir, limit, best_model_checkpoint=_best_path(ours_dir, best), use_mtime=True)
    hf_rotate(hf_dir, limit, best_model_checkpoint=_best_path(hf_dir, best), use_mtime=True)

    assert sorted(os.listdir(ours_dir)) == sorted(os.listdir(hf_dir))
    assert sorted(_names(deleted)) == sorted(set(f"checkpoint-{s}" for s in STEPS) - set(os.listdir(hf_dir)))


def test_rotate_matches_golden_run(tmp_path):
    # The golden run saved at 4, 8, 12, 16 with save_total_limit=2; the best was step 16 at the end.
    output_dir = _make_tree(tmp_path / "out", {4: 0, 8: 10, 12: 20, 16: 30})
    golden = json.loads(Path("/work/shared/reference/golden/checkpoints.json").read_text())
    rotate_checkpoints(output_dir, 2, best_model_checkpoint=os.path.join(output_dir, "checkpoint-16"))
    assert sorted(os.listdir(output_dir)) == golden["checkpoints_left_in_output_dir"]


@pytest.mark.parametrize("best", ["oldest", "middle", "newest"])
def test_final_cleanup_for_limit_one_keeps_only_best(tmp_path, best):
    from transformers.trainer_utils import sort_checkpoints as hf_sort

    ours_dir = _make_tree(tmp_path / "ours", MTIMES["increasing"])
    hf_dir = _make_tree(tmp_path / "hf", MTIMES["increasing"])
    final_cleanup_for_limit_one(ours_dir, _best_path(ours_dir, best))
    # HF's end-of-train rule (Trainer._inner_training_loop): delete every sorted checkpoint not the best.
    hf_best = _best_path(hf_dir, best)
    for path in hf_sort(hf_dir, best_model_checkpoint=hf_best):
        if not os.path.samefile(path, hf_best):
            shutil.rmtree(path)

    assert os.listdir(ours_dir) == os.listdir(hf_dir) == [f"checkpoint-{BEST[best]}"]


def test_final_cleanup_without_best_or_with_missing_best_deletes_nothing(tmp_path):
    output_dir = _make_tree(tmp_path / "out", MTIMES["increasing"])
    assert final_cleanup_for_limit_one(output_dir, None) == []
    assert final_cleanup_for_limit_one(output_dir, os.path.join(output_dir, "checkpoint-99")) == []
    assert len(os.listdir(output_dir)) == len(STEPS)


def test_rotation_ignores_incomplete_and_foreign_folders(tmp_path):
    output_dir = _make_tree(tmp_path / "out", {2: 0, 4: 10, 6: 20})
    half_written = tmp_path / "out" / "checkpoint-8"  # an HF save killed before trainer_state.json
    half_written.mkdir()
    (half_written / "model.safetensors").write_bytes(EMPTY_SAFETENSORS)
    no_weights = tmp_path / "out" / "checkpoint-9"
    no_weights.mkdir()
    (no_weights / "trainer_state.json").write_text("{}")
    (tmp_path / "out" / "checkpoint-7-old").mkdir()
    (tmp_path / "out" / ".tmp-checkpoint-10-123").mkdir()

    assert _names(sort_checkpoints(output_dir)) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert _names(rotate_checkpoints(output_dir, 1, use_mtime=False)) == ["checkpoint-2", "checkpoint-4"]
    assert sorted(os.listdir(output_dir)) == [
        ".tmp-checkpoint-10-123", "checkpoint-6", "checkpoint-7-old", "checkpoint-8", "checkpoint-9",
    ]


def test_rotation_of_missing_output_dir_is_a_no_op(tmp_path):
    assert sort_checkpoints(tmp_path / "nope") == []
    assert rotate_checkpoints(tmp_path / "nope", 1) == []


def test_clean_stale_temporary_folders_only_removes_older_ones(tmp_path):
    output_dir = _make_tree(tmp_path / "out", {2: 0})
    stale = tmp_path / "out" / ".tmp-checkpoint-4-111"
    stale.mkdir()
    (stale / "optimizer.pt").write_bytes(b"x")
    os.utime(stale, (BASE_TIME, BASE_TIME))
    current = tmp_path / "out" / ".tmp-checkpoint-6-222"
    current.mkdir()
    run_start = time.time() - 60

    removed = clean_stale_temporary_folders(output_dir, older_than=run_start)

    assert _names(removed) == [".tmp-checkpoint-4-111"]
    assert sorted(os.listdir(output_dir)) == [".tmp-checkpoint-6-222", "checkpoint-2"]
    assert get_last_checkpoint(output_dir) == os.path.join(output_dir, "checkpoint-2")
