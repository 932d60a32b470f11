"""Medians, ratios and the printed tables, from the list of raw measurements the driver collected."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

TRAIN_ORDER = ("plain", "lightning", "hf", "hf_lightning")
EVAL_ORDER = ("hf", "hf_lightning", "hf_lightning_streaming")
IMPORT_ORDER = ("torch", "lightning", "hf", "hf_lightning")


def _median(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _medians(records: list[dict], fields: tuple[str, ...], *keys: str) -> dict:
    """``{key values...: {field: {"median", "runs"}}}`` over the records of one section."""
    grouped: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        result = record["result"]
        for field in fields:
            if isinstance(result.get(field), (int, float)):
                grouped[tuple(record[k] for k in keys)][field].append(float(result[field]))
    out: dict = {}
    for key, values in grouped.items():
        node = out
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = {field: _median(runs) for field, runs in values.items()}
    return out


def _get(tree: dict, *path: str) -> float | None:
    node: Any = tree
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _speed_ratios(contenders: dict, field: str, stat: str = "median") -> dict[str, float | None]:
    speed = {name: _get(contenders, name, field, stat) for name in TRAIN_ORDER}
    out = {f"hf_lightning/{other}": _ratio(speed["hf_lightning"], speed[other]) for other in ("hf", "lightning", "plain")}
    out.update({f"{other}/plain": _ratio(speed[other], speed["plain"]) for other in ("hf", "lightning")})
    return out


def summarize(records: list[dict]) -> dict[str, Any]:
    """Group the raw measurements by section and contender; add the ratios the issue asks for."""
    ok = [r for r in records if "error" not in r["result"] and "skipped" not in r["result"]]
    by_section = defaultdict(list)
    for record in ok:
        by_section[record["section"]].append(record)
    training = _medians(by_section["train"], ("steps_per_s", "tokens_per_s", "cpu_steps_per_s", "startup_seconds"),
                        "workload", "flow", "contender")
    evaluation = _medians(by_section["eval"], ("seconds", "peak_rss_mb", "growth_mb", "accuracy"), "size",
                          "contender")
    checkpoint = _medians(by_section["checkpoint"], ("save_seconds", "checkpoint_mb", "resume_seconds",
                                                     "start_seconds"), "contender")
    imports = _medians(by_section["import"], ("seconds",), "contender")

    ratios: dict[str, Any] = {"training": {}, "evaluation": {}, "checkpoint": {}, "imports": {}}
    for workload, flows in training.items():
        for flow, contenders in flows.items():
            ratios["training"][f"{workload}/{flow}"] = {
                clock: _speed_ratios(contenders, field, stat)
                for clock, field, stat in (("wall", "steps_per_s", "median"), ("cpu", "cpu_steps_per_s", "median"),
                                           ("best_wall", "steps_per_s", "max"))
            }
    for size, contenders in evaluation.items():
        for field in ("seconds", "peak_rss_mb"):
            ours = _get(contenders, "hf_lightning", field, "median")
            ratios["evaluation"][f"{size}/{field}"] = {
                "hf_lightning/hf": _ratio(ours, _get(contenders, "hf", field, "median")),
                "hf_lightning_streaming/hf": _ratio(_get(contenders, "hf_lightning_streaming", field, "median"),
                                                    _get(contenders, "hf", field, "median")),
            }
    for contender in EVAL_ORDER:
        one = _get(evaluation, "1x", contender, "peak_rss_mb", "median")
        ten = _get(evaluation, "10x", contender, "peak_rss_mb", "median")
        growth = _ratio(ten, one)
        ratios["evaluation"].setdefault("peak_rss_growth_1x_to_10x", {})[contender] = (
            None if growth is None else growth - 1.0
        )
    for field in ("save_seconds", "resume_seconds", "start_seconds"):
        ratios["checkpoint"][field] = {"hf_lightning/hf": _ratio(_get(checkpoint, "hf_lightning", field, "median"),
                                                                 _get(checkpoint, "hf", field, "median"))}
    ours = _get(imports, "hf_lightning", "seconds", "median")
    ratios["imports"] = {f"hf_lightning/{other}": _ratio(ours, _get(imports, other, "seconds", "median"))
                         for other in ("hf", "lightning")}
    return {"training": training, "evaluation": evaluation, "checkpoint": checkpoint, "imports": imports,
            "ratios": ratios}


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.1f}%"


def markdown(summary: dict[str, Any]) -> str:
    """The tables ``run.py`` prints (Markdown, so they paste into ``docs/performance.md`` as they are)."""
    lines: list[str] = []
    training, ratios = summary["training"], summary["ratios"]
    if training:
        lines += ["### Training throughput (optimizer steps/s by the wall clock, median; higher is better)", "",
                  "| model | log/eval/save | plain loop | plain Lightning | HF Trainer | hf_lightning | tokens/s "
                  "(hf_lightning) | hf_lightning / HF | hf_lightning / Lightning | hf_lightning / plain |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        extra = {
            "cpu": ["### The same runs by CPU time (median steps per CPU-second: what each run itself cost)", "",
                    "| model | log/eval/save | plain loop | plain Lightning | HF Trainer | hf_lightning | "
                    "hf_lightning / HF | hf_lightning / Lightning | hf_lightning / plain | HF / plain | "
                    "Lightning / plain |",
                    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"],
            "best_wall": ["### The same runs, best of the repeats (wall clock: the run least disturbed by other "
                          "work)", "",
                          "| model | log/eval/save | plain loop | plain Lightning | HF Trainer | hf_lightning | "
                          "hf_lightning / HF | hf_lightning / Lightning | hf_lightning / plain | HF / plain | "
                          "Lightning / plain |",
                          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"],
        }
        sources = {"cpu": ("cpu_steps_per_s", "median"), "best_wall": ("steps_per_s", "max")}
        for workload, flows in training.items():
            for flow in ("on", "off"):
                contenders = flows.get(flow)
                if not contenders:
                    continue
                r = ratios["training"][f"{workload}/{flow}"]
                cells = [_fmt(_get(contenders, c, "steps_per_s", "median"), 1) for c in TRAIN_ORDER]
                tokens = _fmt(_get(contenders, "hf_lightning", "tokens_per_s", "median"), 0)
                lines.append(f"| {workload} | {flow} | " + " | ".join(cells) + f" | {tokens} | "
                             + " | ".join(_fmt(r["wall"][f"hf_lightning/{o}"], 3) for o in ("hf", "lightning", "plain"))
                             + " |")
                keys = ("hf_lightning/hf", "hf_lightning/lightning", "hf_lightning/plain", "hf/plain", "lightning/plain")
                for view, (field, stat) in sources.items():
                    cells = [_fmt(_get(contenders, c, field, stat), 1) for c in TRAIN_ORDER]
                    extra[view].append(f"| {workload} | {flow} | " + " | ".join(cells) + " | "
                                       + " | ".join(_fmt(r[view][k], 3) for k in keys) + " |")
        lines += ["", *extra["cpu"], "", *extra["best_wall"], ""]
    evaluation = summary["evaluation"]
    if evaluation:
        lines += ["### Evaluation (`evaluate()` with a token-accuracy metric, fresh process each; median)", "",
                  "| eval set | contender | seconds | peak RSS (MB) | RSS growth during evaluate (MB) |",
                  "|---|---|---:|---:|---:|"]
        for size in ("1x", "10x"):
            for contender in EVAL_ORDER:
                row = _get(evaluation, size, contender)
                if row is None:
                    continue
                lines.append(f"| {size} | {contender} | {_fmt(_get(row, 'seconds', 'median'))} | "
                             f"{_fmt(_get(row, 'peak_rss_mb', 'median'), 0)} | "
                             f"{_fmt(_get(row, 'growth_mb', 'median'), 0)} |")
        growth = ratios["evaluation"].get("peak_rss_growth_1x_to_10x", {})
        lines += ["", "Peak RSS growth from the 1× to the 10× eval set: "
                  + ", ".join(f"{c} {_pct(growth.get(c))}" for c in EVAL_ORDER if growth.get(c) is not None), ""]
    checkpoint = summary["checkpoint"]
    if checkpoint:
        lines += ["### Checkpoint (median seconds; lower is better)", "",
                  "| contender | save | checkpoint size (MB) | start → first step | resume → first step |",
                  "|---|---:|---:|---:|---:|"]
        for contender in ("hf", "hf_lightning"):
            row = checkpoint.get(contender, {})
            lines.append(f"| {contender} | {_fmt(_get(row, 'save_seconds', 'median'), 3)} | "
                         f"{_fmt(_get(row, 'checkpoint_mb', 'median'), 1)} | "
                         f"{_fmt(_get(row, 'start_seconds', 'median'), 3)} | "
                         f"{_fmt(_get(row, 'resume_seconds', 'median'), 3)} |")
        r = ratios["checkpoint"]
        lines += ["", "hf_lightning / HF: save " + _fmt(r["save_seconds"]["hf_lightning/hf"], 3)
                  + ", start " + _fmt(r["start_seconds"]["hf_lightning/hf"], 3)
                  + ", resume " + _fmt(r["resume_seconds"]["hf_lightning/hf"], 3), ""]
    imports = summary["imports"]
    if imports:
        lines += ["### Import time (fresh process, median seconds)", "",
                  "| `import torch` | `import lightning.pytorch` | `from transformers import Trainer` | "
                  "`import hf_lightning` | hf_lightning / HF | hf_lightning / Lightning |",
                  "|---:|---:|---:|---:|---:|---:|"]
        cells = [_fmt(_get(imports, c, "seconds", "median"), 2) for c in IMPORT_ORDER]
        r = ratios["imports"]
        lines.append("| " + " | ".join(cells) + f" | {_fmt(r['hf_lightning/hf'], 3)} | "
                     f"{_fmt(r['hf_lightning/lightning'], 3)} |")
        lines.append("")
    return "\n".join(lines)
