"""``benchmarks/eval_shards.py --quick``: the 2-process evaluation benchmark runs end to end (its numbers mean
nothing) and both layouts report the one-process ``eval_loss``."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_run_times_one_and_two_processes(tmp_path):
    out = tmp_path / "eval_shards.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "eval_shards.py"), "--quick", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    data = json.loads(out.read_text())
    assert data["quick"] is True and data["rows"] == 13
    assert set(data["seconds"]) == {"1_process", "2_process"} and all(v > 0 for v in data["seconds"].values())
    # One repeat: the paired ratio is the ratio of the two runs.
    assert data["ratio_2_over_1"] == pytest.approx(data["seconds"]["2_process"] / data["seconds"]["1_process"])
    assert data["paired_ratios"] == [data["ratio_2_over_1"]]
    assert data["eval_loss"]["2_process"] == pytest.approx(data["eval_loss"]["1_process"], rel=1e-5)
    assert "ratio" in proc.stdout
