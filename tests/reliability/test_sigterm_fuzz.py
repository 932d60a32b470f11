"""SIGTERM/resume fuzzing (``enable_jit_checkpoint``): a SIGTERM anywhere, a checkpoint, a clean exit, an exact resume.

Each trial signals a run 1-2 times at a random moment: inside a training forward, inside the backward (from a
gradient hook, i.e. inside autograd), between the micro-batches of an accumulation window, inside an evaluation
forward, while a checkpoint is being written (``optimizer.pt``), or after a random delay since training began;
sometimes two SIGTERMs in a row. Each signalled run must exit cleanly (exit code 0, ``train()`` / ``fit()``
returned, the SIGTERM handler found before training put back) having written ``checkpoint-<its last step>``, which
``get_last_checkpoint`` returns. The run that then resumes to the end must have weights ``torch.equal`` to an
uninterrupted run's and the same ``log_history`` (every loss — logged every 3 steps, so most stops fall inside a
logging window — grad norm, learning rate, eval loss, epoch ``==``).

The processes come from the kill fuzz's fork server (``_fuzz_worker.py``); the signals are real ``os.kill``
SIGTERMs the process sends itself at the chosen point (HF's 3 s grace period set to 0 there, so the request is
taken where the signal lands).

One random trial and three deterministic cases run in the default suite; ``pytest --run-slow`` (or ``HFL_SLOW=1``) adds the
other two deterministic cases and ``HFL_SIGTERM_TRIALS``
(default 100) more, seeded from ``HFL_SIGTERM_SEED`` (default 2000).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from tests.reliability import _fuzz_worker as worker
from tests.reliability.test_kill_fuzz import _comparable, _folders, _run, reference, server  # noqa: F401 (fixtures)

# (seed, entry point, configuration) of the trials in the default suite.
# One random trial in the default suite (the deterministic cases below cover the rest); the others run in slow mode.
_DEFAULT_TRIALS = [(1, "native", "jit_best")]
_SLOW_TRIALS = int(os.environ.get("HFL_SIGTERM_TRIALS", "100"))
_SLOW_SEED = int(os.environ.get("HFL_SIGTERM_SEED", "2000"))
# How often each point is reached in a whole run (30 steps of 2 / 2 / 1 micro-batches, so 50 forwards and 20
# two-batch windows; evaluations of one batch: 6 in "jit", 15 in "jit_best"; 7 checkpoints): k is drawn up to
# these (a k never reached gives a complete run, which is checked too).
_REACHED = {"term_forward": 50, "term_backward": 50, "term_window": 20, "term_eval": 15, "term_save": 7}


def _signal_once(server, out: Path, mode: str, config: str, point: str, k: int, tmp: Path) -> tuple[tuple, dict]:
    """One signalled run: it must exit 0 with its last step's checkpoint written; returns what happened and the
    run's result."""
    result, log = tmp / "signalled.json", tmp / "log.txt"
    result.unlink(missing_ok=True)
    code = _run(server, out, mode, config, point=point, k=k, result=result, log=log)
    what = (point, k, code)
    assert code == 0, f"{what}: {log.read_text()[-3000:]}"
    run = json.loads(result.read_text())
    # The handler found when training started (the fork server's default) is back.
    assert run["sigterm_handler"] == repr(signal.SIG_DFL), what
    if not run["jit_stopped"]:
        # The signal came after training ended, or its point was never reached: a complete run.
        assert run["global_step"] == worker.MAX_STEPS, what
        return (*what, "complete"), run
    step = run["global_step"]
    last = worker.hf_lightning.get_last_checkpoint(str(out))
    assert last is not None and os.path.basename(last) == f"checkpoint-{step}", (what, _folders(out))
    state = json.loads(Path(last, "trainer_state.json").read_text())
    assert state["global_step"] == step, what
    # Stopped at once: nothing logged after the checkpoint but HF's end-of-training summary.
    assert [e for e in run["log_history"] if "train_runtime" not in e] == state["log_history"], what
    return (*what, step), run


def _trial(server, reference, tmp_path: Path, seed: int, mode: str, config: str) -> list[tuple]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    expected, _, expected_folders = reference(mode, config)
    # The delays fall within training (measured from on_train_begin): the uninterrupted run's train_runtime.
    duration = next(entry["train_runtime"] for entry in expected["log_history"] if "train_runtime" in entry)
    out = tmp_path / "out"
    stops, result = [], None
    for _ in range(rng.randint(1, 2)):
        where = rng.choice(worker.SIGTERM_POINTS)
        if where == "term_delay":
            k = int(rng.uniform(0.0, duration) * 1000)
        else:
            k = rng.randint(1, _REACHED[where])
        point = where.replace("term_", "term2_") if rng.random() < 0.25 else where
        stop, run = _signal_once(server, out, mode, config, point, k, tmp_path)
        stops.append(stop)
        if stop[-1] == "complete":
            # Trained to the end: nothing is left to resume (a restart would resume from whatever checkpoint the
            # end left, e.g. only the best one under save_total_limit=1).
            result = run
            break
    if result is None:
        log = tmp_path / "log.txt"
        code = _run(server, out, mode, config, result=tmp_path / "result.json", log=log)
        assert code == 0, f"trial {seed} {config} {stops}: {log.read_text()[-3000:]}"
        result = json.loads((tmp_path / "result.json").read_text())

    assert _comparable(result["log_history"]) == _comparable(expected["log_history"]), f"trial {seed} {stops}"
    for name, values in expected["weights"].items():
        assert torch.equal(torch.tensor(result["weights"][name]), torch.tensor(values)), f"trial {seed} {stops}"
    # Besides the uninterrupted run's folders, only SIGTERM checkpoints may be left (they take part in rotation).
    extra = set(_folders(out)) - set(expected_folders)
    assert extra <= {f"checkpoint-{stop[-1]}" for stop in stops}, f"trial {seed} {stops}: {_folders(out)}"
    return stops


@pytest.mark.parametrize("seed,mode,config", _DEFAULT_TRIALS, ids=[f"{m}-{c}-{s}" for s, m, c in _DEFAULT_TRIALS])
def test_sigterm_anywhere_then_resumed_ends_bit_identical(server, reference, tmp_path, seed, mode, config):
    _trial(server, reference, tmp_path, seed, mode, config)


@pytest.mark.parametrize("point,k,stop", [
    # Between the two micro-batches of step 2's window: no stop mid-window, the window is stepped first.
    ("term_window", 2, 2),
    # Inside the 1st evaluation (step 5): the evaluation finishes and is logged, then checkpoint-5, between two
    # training-loss logs (steps 3 and 6): the resume must carry the window's loss sum.
    ("term_eval", 1, 5),
    # While checkpoint-4 is written: it is finished, then checkpoint-4 is written again with the logging window
    # (the loss was last logged at step 3), and the run stops at step 4.
    ("term_save", 1, 4),
    # Two SIGTERMs in a row inside the backward of step 3's last micro-batch: one checkpoint, one stop.
    pytest.param("term2_backward", 5, 3, marks=pytest.mark.slow),
    # Inside the first forward of step 3, which ends epoch 1 (windows 2, 2, 1): the checkpoint waits for the epoch
    # end.
    pytest.param("term_forward", 5, 3, marks=pytest.mark.slow),
])
def test_sigterm_regressions(server, reference, tmp_path, point, k, stop):
    """Deterministic stops whose step is known, then the exact resume."""
    expected, _, _ = reference("facade", "jit")
    out = tmp_path / "out"
    assert _signal_once(server, out, "facade", "jit", point, k, tmp_path)[0][-1] == stop
    assert _run(server, out, "facade", "jit", result=tmp_path / "result.json", log=tmp_path / "log.txt") == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert _comparable(result["log_history"]) == _comparable(expected["log_history"])
    for name, values in expected["weights"].items():
        assert torch.equal(torch.tensor(result["weights"][name]), torch.tensor(values))


@pytest.mark.slow
def test_sigterm_fuzz_many_trials(server, reference, tmp_path):
    """The opt-in long run; its figure is recorded in docs/reliability.md."""
    summary = {"trials": 0, "stops": 0, "complete_runs": 0, "by_point": {}, "seconds": 0.0}
    started = time.monotonic()
    for trial in range(_SLOW_TRIALS):
        mode = "facade" if trial % 2 == 0 else "native"
        config = "jit" if trial % 4 < 2 else "jit_best"
        stops = _trial(server, reference, tmp_path / f"trial{trial}", seed=_SLOW_SEED + trial, mode=mode,
                       config=config)
        summary["trials"] += 1
        for point, _, _, step in stops:
            if step == "complete":
                summary["complete_runs"] += 1
            else:
                summary["stops"] += 1
                summary["by_point"][point] = summary["by_point"].get(point, 0) + 1
    summary["seconds"] = round(time.monotonic() - started, 1)
    print(f"sigterm fuzz: {json.dumps(summary, sort_keys=True)}")
