"""``parallelism_config=ParallelismConfig(tp_size=2)`` on 2 CPU processes (gloo) through torchrun, against
transformers' own one-process run of the same model and data.

HF's Trainer refuses any ``ParallelismConfig`` on CPU processes (accelerate's ``MULTI_CPU``), so its tensor-parallel
run cannot be the reference here; both processes of a tensor-parallel group train on the one-process run's batches,
so HF's one-process run is (the tiny Llama has no dropout).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.parity import assert_log_history_equal
from tests.helpers.torchrun import launch_env

SCRIPT = Path(__file__).with_name("tp_script.py")
ROOT = Path(__file__).resolve().parents[2]


def _env():
    return launch_env()


@pytest.mark.slow
def test_tp_size_2_matches_hf_one_process_run(tmp_path):
    from transformers import LlamaForCausalLM

    model_dir = tmp_path / "model"
    subprocess.run([sys.executable, str(SCRIPT), "save", str(model_dir)], check=True, env=_env(), cwd=str(ROOT),
                   capture_output=True)
    hf = [sys.executable, str(SCRIPT), "hf", str(model_dir), str(tmp_path / "hf"), str(tmp_path / "hf.json")]
    ours = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT), "ours",
            str(model_dir), str(tmp_path / "ours"), str(tmp_path / "ours.json"), f"save_model={tmp_path / 'final'}"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                              cwd=str(ROOT)) for cmd in (hf, ours)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-4000:]
    hf, ours = (json.loads((tmp_path / name).read_text()) for name in ("hf.json", "ours.json"))
    assert ours["strategy"] == "HFTensorParallelStrategy"
    # Every step's loss, the full gradient's norm (clipped: max_grad_norm=0.5 is below each), the learning rate and
    # eval_loss; num_items_in_batch is counted once per group although both processes count it.
    assert_log_history_equal(hf["log_history"], ours["log_history"], skip_keys=("total_flos",))
    # HF sums total_flos over every process, the two of a tensor-parallel group included (they count one batch).
    assert ours["log_history"][-1]["total_flos"] == pytest.approx(2 * hf["log_history"][-1]["total_flos"])
    assert all(row["grad_norm"] > 0.5 for row in ours["log_history"] if "grad_norm" in row)
    # A split layer sums its halves in another order than one process does; Adam's normalised step turns those
    # last-bit differences of near-zero gradients into differences of up to ~1e-5 in a few weights (lr 3e-3).
    assert sorted(ours["weights"]) == sorted(hf["weights"])
    for key, value in hf["weights"].items():
        torch.testing.assert_close(torch.tensor(ours["weights"][key]), torch.tensor(value), rtol=1e-5, atol=5e-5,
                                   msg=key)
    names = sorted(p.name for p in (tmp_path / "ours").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["checkpoint-2", "checkpoint-4"]
    # save_model() gathers the split layers into a whole model that from_pretrained reads back.
    saved = LlamaForCausalLM.from_pretrained(tmp_path / "final").state_dict()
    for key, value in saved.items():
        torch.testing.assert_close(value, torch.tensor(ours["weights"][key]), rtol=0, atol=0, msg=key)
