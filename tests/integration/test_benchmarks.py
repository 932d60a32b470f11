"""``benchmarks/run.py``: the quick setting runs every section end to end and writes the JSON the docs describe.

No timing assertions: the numbers of a ``--quick`` run mean nothing. What is checked is that every contender
ran, the JSON has the medians and ratios, and the evaluation contenders agree with ``transformers.Trainer`` on
the metric they computed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks" / "run.py"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(RUN.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(RUN.parent))
    return module


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "results.json"
    proc = subprocess.run([sys.executable, str(RUN), "--quick", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.slow  # the quick run takes about a minute; run with --run-slow
def test_quick_run_measures_every_training_contender_in_both_settings(quick_run):
    data, _ = quick_run
    assert data["errors"] == []
    assert data["meta"]["quick"] is True
    for flow in ("on", "off"):
        contenders = data["training"]["tiny"][flow]
        assert set(contenders) == {"plain", "lightning", "hf", "hf_lightning"}
        for result in contenders.values():
            assert result["steps_per_s"]["median"] > 0
            assert result["tokens_per_s"]["median"] == pytest.approx(result["steps_per_s"]["median"] * 8 * 32)
            assert result["cpu_steps_per_s"]["median"] > 0
        for clock in ("wall", "cpu"):
            assert set(data["ratios"]["training"][f"tiny/{flow}"][clock]) >= {
                "hf_lightning/hf", "hf_lightning/lightning", "hf_lightning/plain"}


@pytest.mark.slow  # the quick run takes about a minute; run with --run-slow
def test_quick_run_evaluation_agrees_with_transformers(quick_run):
    data, _ = quick_run
    evaluation = data["evaluation"]
    for size in ("1x", "10x"):
        hf = evaluation[size]["hf"]
        assert hf["peak_rss_mb"]["median"] > 0
        # compute_metrics (ours and HF's) and the streaming metric, when present, see the same predictions.
        for contender, result in evaluation[size].items():
            assert result["accuracy"]["median"] == pytest.approx(hf["accuracy"]["median"], abs=1e-6), contender
    assert "hf_lightning" in data["ratios"]["evaluation"]["peak_rss_growth_1x_to_10x"]


@pytest.mark.slow  # the quick run takes about a minute; run with --run-slow
def test_quick_run_checkpoint_and_import_sections(quick_run):
    data, printed = quick_run
    for contender in ("hf", "hf_lightning"):
        row = data["checkpoint"][contender]
        assert {"save_seconds", "checkpoint_mb", "resume_seconds", "start_seconds"} <= set(row)
        assert data["imports"][contender]["seconds"]["median"] > 0
    assert data["ratios"]["checkpoint"]["save_seconds"]["hf_lightning/hf"] is not None
    for heading in ("Training throughput", "Evaluation", "Checkpoint", "Import time", "hf_lightning / HF"):
        assert heading in printed


def test_summary_medians_and_ratios_from_raw_records():
    report = _load("report")
    records = [
        {"section": "train", "workload": "tiny", "flow": "on", "contender": name, "result": {"steps_per_s": v}}
        for name, values in {"plain": (10.0, 12.0, 11.0), "lightning": (8.0,), "hf": (5.0,),
                             "hf_lightning": (4.0, 6.0, 5.5)}.items()
        for v in values
    ] + [
        {"section": "eval", "size": size, "contender": "hf", "result": {"peak_rss_mb": mb}}
        for size, mb in (("1x", 500.0), ("10x", 650.0))
    ] + [{"section": "train", "workload": "tiny", "flow": "on", "contender": "hf", "result": {"error": "boom"}}]
    summary = report.summarize(records)
    assert summary["training"]["tiny"]["on"]["hf_lightning"]["steps_per_s"]["median"] == 5.5
    ratios = summary["ratios"]["training"]["tiny/on"]["wall"]
    assert ratios["hf_lightning/plain"] == pytest.approx(5.5 / 11.0)
    assert ratios["hf_lightning/hf"] == pytest.approx(5.5 / 5.0)
    assert summary["ratios"]["evaluation"]["peak_rss_growth_1x_to_10x"]["hf"] == pytest.approx(0.3)
    assert "| tiny | on |" in report.markdown(summary)


def test_unknown_section_is_refused_with_the_choices(capsys):
    run = _load("run")
    with pytest.raises(SystemExit):
        run.main(["--sections", "train,speed"])
    assert "unknown ['speed']; choose from train, eval, checkpoint, import" in capsys.readouterr().err


_TURN_TAKER = """
import os, sys
sys.path.insert(0, {bench!r})
from turns import Turns
name, turns_to_take, crash_after, go, done, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *map(int, sys.argv[4:6]), sys.argv[6]
turns = Turns(go, done)
turns.pause()  # the start of the timed window
for turn in range(turns_to_take):
    if turn == crash_after:
        os._exit(3)
    with open(log, "a") as f:
        f.write(f"{{name}}{{turn}} ")
    if turn < turns_to_take - 1:
        turns.pause()
turns.finish()
with open(log, "a") as f:
    f.write(f"{{name}}-done ")
"""


def test_contenders_take_turns_one_at_a_time_and_a_crash_does_not_stall_the_others(tmp_path):
    turns = _load("turns")
    log = tmp_path / "turns.log"
    script = tmp_path / "taker.py"
    script.write_text(_TURN_TAKER.format(bench=str(RUN.parent)))
    plan = {"a": (3, -1), "b": (3, 1), "c": (2, -1)}  # b exits during its second turn
    seats, procs = [], []
    for name, (count, crash_after) in plan.items():
        seat = turns.Seat()
        go, done = seat.worker_fds
        procs.append(subprocess.Popen([sys.executable, str(script), name, str(count), str(crash_after), str(go),
                                       str(done), str(log)], pass_fds=seat.worker_fds))
        seat.started()
        seats.append(seat)
    try:
        turns.take_turns(seats, timeout=60)
    finally:
        for seat in seats:
            seat.close()
    codes = [proc.wait(timeout=60) for proc in procs]
    assert codes == [0, 3, 0]
    # Round-robin, one turn each, b gone after its first; nobody finishes (tears down) before every window ended.
    entries = log.read_text().split()
    assert entries[:6] == ["a0", "b0", "c0", "a1", "c1", "a2"]
    assert sorted(entries[6:]) == ["a-done", "c-done"]
