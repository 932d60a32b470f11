#!/usr/bin/env python
"""``make demo``: train a small GPT-2 with ``examples/run_clm.py``, stop, resume from the last checkpoint, and
summarise.

Two runs of the same script, in one process, as you would type them:

1. ``run_clm.py --output_dir demo_output --max_steps 120 ...``: trains from scratch, prints the loss and learning
   rate every 10 steps, evaluates (loss, next-token accuracy) and saves ``checkpoint-N`` every 40 steps, keeps
   the last two (``--save_total_limit 2``), writes TensorBoard logs, then reports the eval perplexity.
2. The same command with ``--max_steps 200``: ``run_clm.py`` finds ``checkpoint-120`` with
   ``get_last_checkpoint`` and continues from it (weights, optimizer, scheduler, RNG, data order) to step 200.

A table at the end compares the two runs and lists what was left on disk. About a minute on 2 CPU cores.

Run: ``python examples/demo.py [--output_dir DIR] [--first_steps N] [--total_steps M]``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run_clm  # noqa: E402  (examples/ is not a package; the scripts import each other by file name)

from hf_lightning import HfArgumentParser  # noqa: E402

MARKER = ".hf_lightning_demo"


@dataclass
class DemoArguments:
    """The demo's own options; every training setting is in :func:`run_clm_argv`."""

    output_dir: str = field(default="demo_output", metadata={"help": "Where both runs write (wiped first)."})
    first_steps: int = field(default=120, metadata={"help": "Optimizer steps of the first run."})
    total_steps: int = field(default=200, metadata={"help": "Steps reached by the resumed run."})


def run_clm_argv(output_dir: str, max_steps: int, every: int) -> list[str]:
    """The ``run_clm.py`` command line of one demo run (both runs differ only in ``--max_steps``).

    ``every`` is the evaluation and save interval: a third of the first run, so the first run evaluates and saves
    three times and the rotation (``--save_total_limit 2``) deletes its first checkpoint.
    """
    return [
        "--output_dir", output_dir,
        "--do_train", "--do_eval",
        "--max_steps", str(max_steps),
        "--per_device_train_batch_size", "16",
        "--per_device_eval_batch_size", "16",
        "--learning_rate", "3e-3",
        "--lr_scheduler_type", "constant_with_warmup",
        "--warmup_steps", "20",
        "--logging_steps", "10",
        "--eval_strategy", "steps",
        "--eval_steps", str(every),
        "--save_steps", str(every),
        "--save_total_limit", "2",
        "--report_to", "tensorboard",
        "--seed", "42",
    ]


def _prepare_output_dir(output_dir: str) -> None:
    """Start from an empty folder, deleting only a folder an earlier demo made (it holds the marker file)."""
    path = Path(output_dir)
    if path.exists() and any(path.iterdir()):
        if not (path / MARKER).is_file():
            raise SystemExit(
                f"{output_dir} exists and was not written by this demo, so it is left alone. Remove it (make clean) "
                "or pass another --output_dir."
            )
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text("written by examples/demo.py; the next demo run deletes this folder\n")


def _banner(text: str) -> None:
    print(f"\n{'=' * 100}\n{text}\n{'=' * 100}", flush=True)


def _checkpoints(output_dir: str) -> list[str]:
    names = [p.name for p in Path(output_dir).glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    return sorted(names, key=lambda name: int(name.split("-")[-1]))


def _summary(runs: list[tuple[str, dict]], output_dir: str) -> str:
    rows = [("run", "steps", "train loss", "eval loss", "eval accuracy", "perplexity")]
    for name, metrics in runs:
        rows.append((
            name,
            f"{metrics['first_step']} -> {metrics['global_step']}",
            f"{metrics['train_loss']:.4f}",
            f"{metrics['eval_loss']:.4f}",
            f"{metrics['eval_accuracy']:.4f}",
            f"{metrics['perplexity']:.3f}",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    runs_dir = os.path.join(output_dir, "runs")
    tensorboard_runs = sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []
    lines += [
        "",
        f"checkpoints left    {', '.join(_checkpoints(output_dir)) or 'none'}  (save_total_limit=2)",
        f"final model         {os.path.abspath(output_dir)}  (model.safetensors, config.json, tokenizer.json)",
        f"TensorBoard logs    {len(tensorboard_runs)} runs in {runs_dir}  (tensorboard --logdir {runs_dir})",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[tuple[str, dict]]:
    """Run the demo; returns ``[(run name, metrics)]`` for the two runs (what the table shows)."""
    parser = HfArgumentParser(DemoArguments, prog="python examples/demo.py",
                              description="Train, stop, resume and summarise examples/run_clm.py.")
    (demo,) = parser.parse_args_into_dataclasses(argv, look_for_args_file=False)
    if not 0 < demo.first_steps < demo.total_steps:
        raise SystemExit(
            f"--first_steps ({demo.first_steps}) must be positive and below --total_steps ({demo.total_steps}): "
            "the second run resumes from the first and continues."
        )
    _prepare_output_dir(demo.output_dir)

    runs = []
    every = max(demo.first_steps // 3, 1)
    for index, (name, steps) in enumerate((("1: from scratch", demo.first_steps), ("2: resumed", demo.total_steps))):
        argv_run = run_clm_argv(demo.output_dir, steps, every)
        _banner(f"[{index + 1}/2] python examples/run_clm.py {' '.join(argv_run)}")
        metrics = run_clm.main(argv_run)
        state = json.loads((Path(demo.output_dir) / "trainer_state.json").read_text())
        metrics["first_step"] = runs[-1][1]["global_step"] if runs else 0
        metrics["global_step"] = state["global_step"]
        runs.append((name, metrics))

    _banner("Summary")
    print(_summary(runs, demo.output_dir), flush=True)
    return runs


if __name__ == "__main__":
    main()
