"""HF's metric reports for scripts: the aligned printout, ``{split}_results.json`` and ``all_results.json``.

The functions behind ``Trainer.metrics_format`` / ``log_metrics`` / ``save_metrics`` (HF keeps them in
``trainer_pt_utils``). They take plain dicts, so a Lightning-native script can report like an HF one.
"""

from __future__ import annotations

import json
import os
from typing import Any


def metrics_format(metrics: dict[str, Any]) -> dict[str, Any]:
    """HF's human-readable metric values: runtimes as ``h:mm:ss.cc``, memory in MB, FLOPs in GF, floats rounded.

    Example:
        >>> metrics_format({"train_runtime": 3723.5, "total_flos": 3 << 30, "loss": 0.123456})
        {'train_runtime': '1:02:03.50', 'total_flos': '3GF', 'loss': 0.1235}
    """
    out = dict(metrics)
    for key, value in out.items():
        if "_mem_" in key:
            out[key] = f"{value >> 20}MB"
        elif "_runtime" in key:
            seconds = int(value)
            hundredths = round((value - seconds) * 100)
            out[key] = f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{hundredths:02d}"
        elif key == "total_flos":
            out[key] = f"{int(value) >> 30}GF"
        elif isinstance(value, float):
            out[key] = round(value, 4)
    return out


def print_metrics(split: str, metrics: dict[str, Any]) -> None:
    """Print ``metrics`` in HF's aligned ``***** {split} metrics *****`` block, keys sorted."""
    print(f"***** {split} metrics *****")
    formatted = metrics_format(metrics)
    width = max((len(k) for k in formatted), default=0)
    for key in sorted(formatted):
        print(f"  {key: <{width}} = {formatted[key]:>9}")


def write_metrics(output_dir: str, split: str, metrics: dict[str, Any], combined: bool = True) -> None:
    """Write ``{split}_results.json`` and, with ``combined``, merge ``metrics`` into ``all_results.json``."""
    with open(os.path.join(output_dir, f"{split}_results.json"), "w") as f:
        json.dump(metrics, f, indent=4, sort_keys=True)
    if combined:
        all_path = os.path.join(output_dir, "all_results.json")
        merged = {}
        if os.path.exists(all_path):
            with open(all_path) as f:
                merged = json.load(f)
        merged.update(metrics)
        with open(all_path, "w") as f:
            json.dump(merged, f, indent=4, sort_keys=True)
