"""Kill/resume fuzzing: SIGKILL a training process anywhere, restart it until done, get the uninterrupted result.

Each trial kills a run 1-3 times, either after a random delay or deterministically inside the checkpoint code (as
the model files are saved or with ``model.safetensors`` half written, while ``optimizer.pt``, ``rng_state.pth`` or
``trainer_state.json`` are written, just before or just after the folder is renamed into place, in the middle of
rotating an old folder away), restarting with ``resume_from_checkpoint=get_last_checkpoint(output_dir)`` (or
``fit(ckpt_path=...)``), from scratch when there is none. The run that finally completes must end with weights ``torch.equal`` to an uninterrupted run's, the same
``log_history`` (every loss, grad norm, learning rate and eval loss ``==``), the same checkpoint folders, and no
temporary folder left behind.

The processes are children of a ``multiprocessing`` fork server that imported torch, Lightning and hf_lightning
once (see ``_fuzz_worker.py``); they are killed with a real SIGKILL, so nothing in them gets to clean up.

One trial and the save/rotation case run in the default suite; ``pytest --run-slow`` (or ``HFL_SLOW=1``) runs ``HFL_FUZZ_TRIALS`` (default
200) more, seeded from ``HFL_FUZZ_SEED`` (default 1000; the seed picks the kill points, the delays are random).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from tests.reliability import _fuzz_worker as worker

# Deterministic kill points of the checkpoint code (see _fuzz_worker._install_kill_point).
POINTS = ["save_model", "model_file", "optimizer", "rng", "trainer_state", "publish", "published", "rotate"]
_TIMING_KEYS = ("_runtime", "_per_second")
# (seed, entry point, configuration) of the trials in the default suite.
_DEFAULT_TRIALS = [(3, "native", "best")]
_SLOW_TRIALS = int(os.environ.get("HFL_FUZZ_TRIALS", "200"))
_SLOW_SEED = int(os.environ.get("HFL_FUZZ_SEED", "1000"))


@pytest.fixture(scope="module")
def server():
    """A fork server whose children start with everything imported."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.reliability._fuzz_worker"])
    return context


def _run(server, out: Path, mode: str, config: str, *, point: str = "none", k: int = 0,
         kill_after: float | None = None, result: Path | None = None, log: Path) -> int:
    """Run one training process to its end (or kill it after ``kill_after`` seconds); return its exit code."""
    process = server.Process(target=worker.train_once, args=(str(out), mode, config, point, k,
                                                             None if result is None else str(result), str(log)))
    process.start()
    process.join(kill_after)
    if process.is_alive():
        process.kill()
    process.join(300)
    assert process.exitcode is not None, f"the training process hung; see {log}"
    return process.exitcode


@pytest.fixture(scope="module")
def reference(server, tmp_path_factory):
    """The uninterrupted run of each (entry point, configuration), made on first use: its result, how long its
    process runs and the folders it leaves."""
    runs = {}

    def get(mode: str, config: str):
        if (mode, config) not in runs:
            tmp = tmp_path_factory.mktemp(f"reference_{mode}_{config}")
            started = time.monotonic()
            code = _run(server, tmp / "out", mode, config, result=tmp / "result.json", log=tmp / "log.txt")
            duration = time.monotonic() - started
            assert code == 0, (tmp / "log.txt").read_text()[-3000:]
            runs[mode, config] = (json.loads((tmp / "result.json").read_text()), duration, _folders(tmp / "out"))
        return runs[mode, config]

    return get


def _folders(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir()) if out.exists() else []


def _describe(out: Path) -> list[str]:
    """The folders in ``out``, an incomplete ``checkpoint-N`` (no trainer_state.json) marked with ``!``."""
    return [name + ("" if not name.startswith("checkpoint-") or (out / name / "trainer_state.json").exists() else "!")
            for name in _folders(out)]


def _comparable(log_history: list[dict]) -> list[dict]:
    # The final summary's train_loss averages only the last call's steps (as in HF), and times differ.
    return [
        {key: value for key, value in entry.items() if not key.endswith(_TIMING_KEYS)}
        for entry in log_history
        if "train_runtime" not in entry
    ]


def _trial(server, reference, tmp_path: Path, seed: int, mode: str, config: str) -> list[tuple]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    expected, duration, expected_folders = reference(mode, config)
    out, log = tmp_path / "out", tmp_path / "log.txt"
    kills = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.5:
            delay = rng.uniform(0.0, duration)
            code = _run(server, out, mode, config, kill_after=delay, log=log)
            kills.append(("delay", round(delay, 3), code, _describe(out)))
        else:
            point, k = rng.choice(POINTS), rng.randint(1, 8)
            code = _run(server, out, mode, config, point=point, k=k, log=log)
            kills.append((point, k, code, _describe(out)))
        assert code in (0, -signal.SIGKILL), f"trial {seed} {config} {kills}: {log.read_text()[-3000:]}"
        # Whatever the moment of the kill, the last checkpoint is one a resume can load.
        last = worker.hf_lightning.get_last_checkpoint(str(out)) if out.exists() else None
        if last is not None:
            assert os.path.isfile(os.path.join(last, "trainer_state.json")), kills
            json.loads(Path(last, "trainer_state.json").read_text())
    code = _run(server, out, mode, config, result=tmp_path / "result.json", log=log)
    assert code == 0, f"trial {seed} {config} {kills}: {log.read_text()[-3000:]}"
    result = json.loads((tmp_path / "result.json").read_text())

    assert _comparable(result["log_history"]) == _comparable(expected["log_history"]), f"trial {seed} {kills}"
    for name, values in expected["weights"].items():
        assert torch.equal(torch.tensor(result["weights"][name]), torch.tensor(values)), f"trial {seed} {kills}"
    assert _folders(out) == expected_folders, f"trial {seed} {kills}: {_folders(out)}"
    return kills


@pytest.mark.parametrize("seed,mode,config", _DEFAULT_TRIALS, ids=[f"{m}-{c}-{s}" for s, m, c in _DEFAULT_TRIALS])
def test_killed_anywhere_then_resumed_ends_bit_identical(server, reference, tmp_path, seed, mode, config):
    _trial(server, reference, tmp_path, seed, mode, config)


@pytest.mark.parametrize("mode", ["facade", pytest.param("native", marks=pytest.mark.slow)])
def test_killed_between_the_last_save_and_its_rotation(server, reference, tmp_path, mode):
    """Found by the fuzz: the final checkpoint published, the kill before its rotation. The restart has no step
    left to train, so no save would rotate; resuming finishes the interrupted rotation."""
    expected, _, expected_folders = reference(mode, "plain")
    out, log = tmp_path / "out", tmp_path / "log.txt"
    last_save = worker.MAX_STEPS // worker.CONFIGS["plain"]["save_steps"]
    assert _run(server, out, mode, "plain", point="published", k=last_save, log=log) == -signal.SIGKILL
    assert len([name for name in _folders(out) if name.startswith("checkpoint-")]) == 3
    assert _run(server, out, mode, "plain", result=tmp_path / "result.json", log=log) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert _comparable(result["log_history"]) == _comparable(expected["log_history"])
    assert _folders(out) == expected_folders


@pytest.mark.slow
def test_kill_fuzz_many_trials(server, reference, tmp_path):
    """The opt-in long run; its figure is recorded in docs/reliability.md."""
    summary = {"trials": 0, "kills": 0, "killed_by_point": {}, "seconds": 0.0}
    started = time.monotonic()
    for trial in range(_SLOW_TRIALS):
        mode = "facade" if trial % 2 == 0 else "native"
        config = "plain" if trial % 4 < 2 else "best"
        kills = _trial(server, reference, tmp_path / f"trial{trial}", seed=_SLOW_SEED + trial, mode=mode,
                       config=config)
        summary["trials"] += 1
        for kind, _, code, _ in kills:
            if code == -signal.SIGKILL:
                summary["kills"] += 1
                summary["killed_by_point"][kind] = summary["killed_by_point"].get(kind, 0) + 1
    summary["seconds"] = round(time.monotonic() - started, 1)
    print(f"kill fuzz: {json.dumps(summary, sort_keys=True)}")
