"""FSDP2 on 2 CPU processes (gloo) through torchrun: SIGTERM (``enable_jit_checkpoint``) and ``_save`` overrides.

Each launch runs ``jit_fsdp_script.py``: SIGTERM cases (real SIGTERMs each process sends itself at a chosen moment,
HF's 3 s grace period set to 0), each followed by its resume in the same processes, then one uninterrupted FSDP2 run
of the same arguments. For every case: both processes stop at the same step, each having written its part of one
complete ``checkpoint-<that step>`` (FSDP2 gathers the full weights and optimizer state on every process: a process
left out of the gather would hang the launch), both ``train()`` calls return and the launch exits 0; the resume ends
with weights ``torch.equal`` and a ``log_history`` ``==`` to the uninterrupted run's (dropout on).

Every launch runs with a timeout; on a deadlock the processes are killed and the test fails.

- Default suite: one launch — rank 0 signalled inside an evaluation, rank 1 only while the stop's checkpoint is
  written (so it stops through the agreement alone), and a ``Trainer`` subclass overriding ``_save`` under FSDP2.
- Slow mode: fixed cases (both in one step: in a window and an evaluation; only one rank signalled: in a backward,
  during a checkpoint write; both in an evaluation; both in a forward) and ``HFL_FSDP_SIGTERM_TRIALS`` (default 8) random ones seeded from ``HFL_FSDP_SIGTERM_SEED``
  (default 3000), in one launch.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.torchrun import launch_env

SCRIPT = Path(__file__).with_name("jit_fsdp_script.py")
ROOT = Path(__file__).resolve().parents[2]
_TIMING_KEYS = ("_runtime", "_per_second")
MAX_STEPS = 9

#: The default case: rank 0 gets its SIGTERM inside its 3rd evaluation forward (the evaluation after step 4), rank 1
#: only while it writes its part of the checkpoint that stop saves (its 2nd file in a staging folder; the 1st is
#: checkpoint-3's): at step 4's safe point only rank 0 has a request, so rank 1 stops there only through the
#: agreement. Step 4 lies inside a logging window (losses are logged every 3 steps), so the checkpoint also keeps
#: both processes' loss sums.
DEFAULT_CASE = {"name": "eval_and_saving", "signals": [["eval", 3], ["save", 2]]}
SLOW_CASES = [
    # Both within one step: between the micro-batches of a window (rank 0), in the evaluation after it (rank 1).
    {"name": "window_and_eval", "signals": [["window", 3], ["eval", 3]]},
    # Only one process gets the SIGTERM; the other learns it from the step's agreement.
    {"name": "rank1_backward_only", "signals": [None, ["backward", 5]]},
    # Inside a checkpoint write (rank 0's 2nd file of checkpoint-3) on rank 0 only: the save completes, then stop.
    {"name": "rank0_saving_only", "signals": [["save", 2], None]},
    {"name": "both_in_eval", "signals": [["eval", 5], ["eval", 2]]},
    {"name": "both_forward_same_step", "signals": [["forward", 7], ["forward", 7]]},
]
#: How often each point is reached in one run, per process (9 steps of 2 / 2 / 1 micro-batches: 15 forwards and
#: backwards, 6 two-batch windows; 4 evaluations of 2 batches; 3 saves); delays in ms over about a run's length.
_REACHED = {"forward": 15, "backward": 15, "window": 6, "eval": 8, "save": 8, "delay": 1500}


def _comparable(log_history: list[dict]) -> list[dict]:
    # The final summary's train_loss averages only the last call's steps (as in HF), and times differ.
    return [{k: v for k, v in entry.items() if not k.endswith(_TIMING_KEYS)} for entry in log_history
            if "train_runtime" not in entry]


def _kill_launch(proc: subprocess.Popen, work: Path) -> None:
    """Kill torchrun and its workers (each in a session of its own, so not in torchrun's process group)."""
    for pid_file in work.glob("pid-*"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    proc.kill()
    proc.communicate()


def _launch(work: Path, cases: list[dict], save_override: bool = False, timeout: float = 300) -> str | None:
    """One torchrun launch of the script; ``None`` when it exited 0, else what went wrong (a deadlock: killed)."""
    work.mkdir(parents=True, exist_ok=True)
    plan = work / "plan.json"
    plan.write_text(json.dumps({"cases": cases, "save_override": save_override}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
           str(work), str(plan)]
    env = launch_env()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_launch(proc, work)
        return (f"the torchrun launch did not finish within {timeout} s (a process left waiting in a collective?) "
                "and was killed")
    return None if proc.returncode == 0 else f"torchrun exited with {proc.returncode}: {err[-4000:]}"


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def _assert_case(work: Path, case: dict, must_stop: bool = True) -> tuple:
    """The checks every case passes; returns ``(name, step it stopped at or "complete")``."""
    folder, name = work / case["name"], case["name"]
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]
    # The handler found when training started is back on both processes.
    assert [r["handler"] for r in ranks] == [repr(signal.SIG_DFL)] * 2, name
    # Both processes agree: the same step, both stopped (or neither, when the signal came after the end).
    assert ranks[0]["global_step"] == ranks[1]["global_step"], (name, ranks)
    assert ranks[0]["stopped"] == ranks[1]["stopped"], (name, ranks)
    assert ranks[0]["stopped"] or not must_stop, (name, ranks)
    step, record = ranks[0]["global_step"], ranks[0]
    assert record["folders"] == ranks[1]["folders"] and record["last"] == ranks[1]["last"], (name, ranks)
    assert not [f for f in record["folders"] if not f.startswith("checkpoint-")], (name, record["folders"])
    result = json.loads((folder / "result.json").read_text())
    reference = json.loads((work / "reference" / "result.json").read_text())
    if record["stopped"]:
        assert step < MAX_STEPS, name
        # One complete checkpoint of the agreed step, with both processes' parts, is the newest.
        assert record["last"] == str(folder / "out" / f"checkpoint-{step}"), (name, record["folders"])
        assert record["checkpoint_step"] == step, name
        # HF's FSDP layout (FULL_STATE_DICT): the full weights also as pytorch_model_fsdp.bin, optimizer.bin.
        assert {"model.safetensors", "pytorch_model_fsdp.bin", "optimizer.bin", "scheduler.pt", "rng_state_0.pth",
                "rng_state_1.pth", "trainer_state.json"} <= set(record["checkpoint_files"]), (name, record["checkpoint_files"])
        # Stopped at once: nothing logged after the checkpoint but HF's end-of-training summary.
        assert _comparable(result["signalled"]) == _comparable(record["checkpoint_log_history"]), name
    else:
        assert step == MAX_STEPS, name
    # The resume (or the complete run) ends where the uninterrupted run ends, bit for bit.
    assert [r["final_step"] for r in ranks] == [MAX_STEPS] * 2, name
    assert _comparable(result["finished"]) == _comparable(reference["log_history"]), name
    expected, weights = _weights(work / "reference" / "weights.pt"), _weights(folder / "weights.pt")
    assert weights.keys() == expected.keys(), name
    for key, value in expected.items():
        assert torch.equal(weights[key], value), (name, key)
    return name, step if record["stopped"] else "complete"


@pytest.fixture(scope="module")
def default_launch(tmp_path_factory):
    """The SIGTERM case and the reference run first, then the ``_save`` override run (so each test tells its own
    failure: a deadlock in the override run leaves the SIGTERM case's results complete)."""
    work = tmp_path_factory.mktemp("fsdp_sigterm")
    return work, _launch(work, [DEFAULT_CASE], save_override=True, timeout=300)


def test_sigterm_at_different_moments_under_fsdp2_one_agreed_checkpoint_exact_resume(default_launch):
    work, failure = default_launch
    if not (work / "reference" / "weights.pt").exists():
        pytest.fail(failure or "no results")
    assert _assert_case(work, DEFAULT_CASE) == ("eval_and_saving", 4)


def test_save_override_under_fsdp2_runs_on_every_process_with_the_gathered_weights(default_launch):
    """HF's documented ``_save`` override under FSDP2: called on every process (as HF's ``save_model`` calls it),
    after the gather every process took part in; the saving process gets the full weights and writes. Before, the
    override ran on the saving process alone, whose gather then waited for the others forever."""
    import safetensors.torch

    work, failure = default_launch
    assert failure is None, failure
    out = work / "override"
    calls = [json.loads((out / f"calls{r}.json").read_text()) for r in (0, 1)]
    folders = [".tmp-checkpoint-3", ".tmp-checkpoint-6", ".tmp-checkpoint-9", "final"]
    # accelerate's FSDP2 full state dict is on rank 0 only (an empty dict elsewhere), as here.
    assert calls[0] == [{"rank": 0, "folder": f, "state_dict": 8} for f in folders]
    assert calls[1] == [{"rank": 1, "folder": f, "state_dict": 0} for f in folders]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-6",
                                                                                        "checkpoint-9"]
    for step in (6, 9):
        assert (out / f"checkpoint-{step}" / "extra.txt").read_text() == f"step {step}\n"
        # As in HF, accelerate's FSDP files are written whatever the override writes (the full optimizer state).
        assert {"pytorch_model_fsdp.bin", "optimizer.bin"} <= {p.name for p in (out / f"checkpoint-{step}").iterdir()}
    assert "inp.weight" in torch.load(out / "checkpoint-9" / "optimizer.bin", weights_only=True)["state"]
    # The override changes nothing in training; the files hold the full (gathered) weights.
    final = _weights(out / "weights.pt")
    expected = _weights(work / "reference" / "weights.pt")
    for folder in (out / "checkpoint-9", out / "final"):
        stored = safetensors.torch.load_file(folder / "model.safetensors")
        assert stored.keys() == final.keys(), folder
        for key, value in final.items():
            assert torch.equal(stored[key], value) and torch.equal(value, expected[key]), (folder, key)
    assert (out / "final" / "extra.txt").read_text() == f"step {MAX_STEPS}\n"


def _random_case(seed: int) -> dict:
    rng = random.Random(seed)
    signals = []
    for _ in range(2):
        point = rng.choice(sorted(_REACHED))
        signals.append([point, rng.randint(1, _REACHED[point])] if rng.random() < 0.75 else None)
    if signals == [None, None]:
        signals[rng.randrange(2)] = ["forward", rng.randint(1, _REACHED["forward"])]
    return {"name": f"trial_{seed}", "signals": signals}


@pytest.mark.slow
def test_sigterm_under_fsdp2_fixed_cases_and_random_trials(tmp_path):
    trials = int(os.environ.get("HFL_FSDP_SIGTERM_TRIALS", "8"))
    seed = int(os.environ.get("HFL_FSDP_SIGTERM_SEED", "3000"))
    randoms = [_random_case(seed + i) for i in range(trials)]
    failure = _launch(tmp_path, SLOW_CASES + randoms, timeout=300 + 60 * (len(SLOW_CASES) + trials))
    assert failure is None, failure
    outcomes = [_assert_case(tmp_path, case) for case in SLOW_CASES]
    outcomes += [_assert_case(tmp_path, case, must_stop=False) for case in randoms]
    print("FSDP2 SIGTERM outcomes:", outcomes, [case["signals"] for case in randoms])
