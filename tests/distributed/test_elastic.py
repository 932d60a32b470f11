"""Elastic restarts under ``torchrun --max-restarts 2``: the group comes back and resumes by itself, exactly.

One launch of 2 CPU processes (gloo), dropout on, GA 2, a checkpoint every 2 steps:

- attempt 0 trains from scratch; rank 1 SIGKILLs itself after optimizer step 5 (``checkpoint-4`` is the newest);
  torchrun brings the group down and starts it again;
- attempt 1 resumes from ``get_last_checkpoint(output_dir)`` (the pattern in docs/reliability.md) and finishes.

Slow variant (one attempt more): attempt 1's save of ``checkpoint-6`` hits a full disk on rank 0; both ranks stop
with ``CheckpointSaveError`` by themselves (rank 1's says another process failed), none is left waiting in a
collective, and attempt 2 resumes from ``checkpoint-4`` again and finishes.

The finished processes then train the same run uninterrupted (see ``elastic_script.py``): the resumed run's final
weights are ``torch.equal`` to it, every ``log_history`` entry ``==``.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.torchrun import launch_env

SCRIPT = Path(__file__).with_name("elastic_script.py")
ROOT = Path(__file__).resolve().parents[2]
_TIMING_KEYS = ("_runtime", "_per_second")


def _torchrun(out: Path, results: Path, *options: str, max_restarts: int = 0) -> subprocess.CompletedProcess:
    results.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           f"--max-restarts={max_restarts}", str(SCRIPT), str(out), str(results), *options]
    # torchrun shares its rendezvous store with the workers' process group by default, and a restarted group can
    # then read the previous attempt's gloo addresses from it (pytorch#135712).
    env = launch_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=str(ROOT))


def _comparable(log_history):
    return [{k: v for k, v in entry.items() if not k.endswith(_TIMING_KEYS)} for entry in log_history
            if "train_runtime" not in entry]


@pytest.mark.parametrize("full_disk", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_killed_rank_restarts_the_group_which_resumes_exactly(tmp_path, full_disk):
    out, results = tmp_path / "out", tmp_path / "results"
    faults = ["kill_rank1_at=5"] + (["enospc_at=6"] if full_disk else [])
    run = _torchrun(out, results, *faults, max_restarts=2)
    assert run.returncode == 0, run.stderr[-4000:]

    attempts = 3 if full_disk else 2
    started = sorted(p.name for p in results.iterdir() if p.name.startswith("attempt-"))
    assert started == [f"attempt-{a}-rank-{r}" for a in range(attempts) for r in range(2)]
    # Attempt 0: rank 1 SIGKILLed itself at step 5 and torchrun took the group down (it reports whichever process
    # it saw fail first: rank 1's -9, or rank 0's 1 when rank 0's collective broke first).
    assert (results / "killed-0-rank-1").read_text() == "5"
    assert "failed (exitcode: -9)" in run.stderr or "failed (exitcode: 1)" in run.stderr
    if full_disk:
        # Attempt 1: each rank raised the save error itself, after agreeing with the other that the save failed.
        rank0 = (results / "error-1-rank-0.txt").read_text()
        rank1 = (results / "error-1-rank-1.txt").read_text()
        assert rank0.startswith("CheckpointSaveError: [Errno 28] Could not save the checkpoint ")
        assert f"{out / 'checkpoint-6'}: No space left on device" in rank0 and "the size of checkpoint-4" in rank0
        assert rank1.startswith("CheckpointSaveError: ") and "another process could not write its part" in rank1
    assert not list(results.glob(f"error-{attempts - 1}-rank-*"))

    result = json.loads((results / "result.json").read_text())
    # The last attempt resumed by itself from the newest complete checkpoint and trained only what was left.
    assert result["resumed_from"] == str(out / "checkpoint-4")
    assert result["steps_run"] == [5, 6, 7, 8]
    assert _comparable(result["log_history"]) == _comparable(result["reference_log_history"])
    weights = torch.load(results / "weights.pt", weights_only=True)
    reference = torch.load(results / "reference.pt", weights_only=True)
    assert weights.keys() == reference.keys()
    for key, value in reference.items():
        assert torch.equal(weights[key], value), key
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-6", "checkpoint-8"]
