"""``benchmarks/fsdp_steps.py --quick``: the FSDP2 step-time benchmark runs every contender end to end on 2
processes (its numbers mean nothing); hf_lightning and transformers' FSDP2 path really shard, transformers' default
CPU run is DDP, and every trainer ends with the same ``train_loss``."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_run_times_hf_fsdp2_hf_ddp_hf_lightning_and_a_plain_fsdp2_loop(tmp_path):
    out = tmp_path / "fsdp_steps.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fsdp_steps.py"), "--quick", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    data = json.loads(out.read_text())
    assert data["quick"] is True and set(data["workloads"]) == {"tiny"}
    tiny = data["workloads"]["tiny"]
    assert set(tiny["seconds_per_step"]) == {"hf_fsdp2", "hf", "hf_lightning", "fsdp2_loop"}
    assert all(v > 0 for v in tiny["seconds_per_step"].values())
    # One repeat: the paired ratio is the ratio of the two runs.
    assert tiny["ratio"] == pytest.approx(tiny["seconds_per_step"]["hf_lightning"] / tiny["seconds_per_step"]["hf_fsdp2"])
    assert tiny["paired_ratios"] == [tiny["ratio"]]
    # Out of the box HF's "FSDP2" on CPU processes is DDP; with accelerate's gate lifted it is fully_shard, as ours.
    assert tiny["model_class"]["hf"] == "DistributedDataParallel"
    assert tiny["model_class"]["hf_fsdp2"].startswith("FSDP")
    assert tiny["model_class"]["hf_lightning"].startswith("FSDP")
    assert tiny["same_loss"]
    for contender in ("hf", "hf_lightning"):
        assert tiny["train_loss"][contender] == pytest.approx(tiny["train_loss"]["hf_fsdp2"], rel=1e-4)
    assert len(data["meta"]["load_average_before"]) == 3
    assert "hf_lightning / hf_fsdp2" in proc.stdout
