"""``trainer/reporting.py``: HF's metric printout and results files, from plain dicts."""

from __future__ import annotations

import json

from hf_lightning.trainer.reporting import metrics_format, print_metrics, write_metrics


def test_metrics_format():
    formatted = metrics_format({"train_runtime": 3723.5, "total_flos": 3 << 30, "loss": 0.123456,
                                "gpu_mem_peak": 5 << 20, "steps": 4})
    assert formatted == {"train_runtime": "1:02:03.50", "total_flos": "3GF", "loss": 0.1235, "gpu_mem_peak": "5MB",
                         "steps": 4}


def test_print_metrics_aligns_sorted_keys(capsys):
    print_metrics("eval", {"eval_loss": 0.5, "epoch": 1.0})
    assert capsys.readouterr().out.splitlines() == ["***** eval metrics *****", "  epoch     =       1.0",
                                                    "  eval_loss =       0.5"]


def test_write_metrics_merges_all_results(tmp_path):
    write_metrics(str(tmp_path), "train", {"train_loss": 1.0})
    write_metrics(str(tmp_path), "eval", {"eval_loss": 2.0})
    write_metrics(str(tmp_path), "test", {"test_loss": 3.0}, combined=False)
    assert json.loads((tmp_path / "eval_results.json").read_text()) == {"eval_loss": 2.0}
    assert json.loads((tmp_path / "all_results.json").read_text()) == {"train_loss": 1.0, "eval_loss": 2.0}
