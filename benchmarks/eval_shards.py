"""Sharded evaluation: wall time of ``evaluate()`` on 2 DDP processes against 1 process, same eval set.

    .venv/bin/python benchmarks/eval_shards.py [--quick] [--repeats N] [--rows N] [--out results.json]

Each process runs on one CPU thread (gloo), as each would own one device: two processes evaluate half the set each
and exchange their results batch by batch, so the goal is a wall time of at most 0.6x one process's. Every run is
a fresh ``torchrun`` (or plain) process that builds the ``small`` GPT-2 of :mod:`workloads`, runs one untimed
``evaluate()`` (process-group and model set-up) and then ``--evals`` timed ones; a run's figure is the median of
its timed evaluations; in each repeat the two layouts run back to back (alternating first). The machine is a
shared VM whose speed drifts by tens of percent between runs, so the goal's figure is the median over ``--repeats``
of the ratio within each back-to-back pair; the table also shows each layout's median.
Both layouts must report the same ``eval_loss`` (the one-process number; checked, printed). The CPU seconds of the
main process are shown beside the wall time: on a shared machine two processes get two shares of the CPU, so the
CPU time per process (about half, plus the exchange) is the figure that does not depend on the load. ``--quick``
runs the code path once on the tiny GPT-2 and a few rows (its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GOAL = 0.6


def worker(out: str, workload_name: str, rows: int, evals: int) -> None:
    """One layout's run (inside torchrun for 2 processes); rank 0 writes the timings to ``out``."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, HERE)
    sys.path.insert(0, ROOT)
    from workloads import SEED, WORKLOADS, build_model, eval_data

    import hf_lightning

    workload = WORKLOADS[workload_name]
    with tempfile.TemporaryDirectory() as tmp:
        args = hf_lightning.TrainingArguments(
            output_dir=tmp, per_device_eval_batch_size=workload.batch_size, report_to="none", use_cpu=True,
            disable_tqdm=True, seed=SEED,
        )
        trainer = hf_lightning.Trainer(model=build_model(workload), args=args, eval_dataset=eval_data(workload, rows))
        trainer.evaluate()  # process group, DDP wrapping, first allocations
        seconds, cpu_seconds, loss = [], [], None
        for _ in range(evals):
            start, cpu_start = time.perf_counter(), time.process_time()
            metrics = trainer.evaluate()
            seconds.append(time.perf_counter() - start)
            cpu_seconds.append(time.process_time() - cpu_start)
            loss = metrics["eval_loss"]
        if int(os.environ.get("RANK", "0")) == 0:
            with open(out, "w") as f:
                json.dump({"seconds": seconds, "cpu_seconds": cpu_seconds, "eval_loss": loss,
                           "world": int(os.environ.get("WORLD_SIZE", "1"))}, f)
        trainer.end()
    sys.stdout.flush()
    sys.stderr.flush()
    # As tests/helpers/torchrun.run_then_exit: leave without tearing torch down (a gloo destructor can hang at exit).
    os._exit(0)


def launch(nproc: int, workload: str, rows: int, evals: int, out: str) -> dict:
    sys.path.insert(0, ROOT)
    from tests.helpers.torchrun import launch_env, python_command

    cmd = python_command(nproc) + [os.path.abspath(__file__), "--worker", out, "--workload", workload,
                                   "--rows", str(rows), "--evals", str(evals)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=launch_env(), cwd=ROOT, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{nproc}-process run failed:\n{proc.stderr[-4000:]}")
    with open(out) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, few rows, one repeat (numbers mean nothing)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=256, help="eval rows (odd counts are fine)")
    parser.add_argument("--evals", type=int, default=3, help="timed evaluate() calls per run")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--workload", default="small", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        worker(opts.worker, opts.workload, opts.rows, opts.evals)
        return
    workload, rows, evals, repeats = "small", opts.rows, opts.evals, opts.repeats
    if opts.quick:
        workload, rows, evals, repeats = "tiny", 13, 1, 1
    runs: dict[int, list[dict]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            for nproc in ((1, 2) if repeat % 2 == 0 else (2, 1)):
                runs[nproc].append(launch(nproc, workload, rows, evals, os.path.join(tmp, f"{nproc}-{repeat}.json")))
    median = {n: statistics.median(statistics.median(r["seconds"]) for r in results) for n, results in runs.items()}
    cpu = {n: statistics.median(statistics.median(r["cpu_seconds"]) for r in results) for n, results in runs.items()}
    losses = {n: results[-1]["eval_loss"] for n, results in runs.items()}
    paired = [statistics.median(two["seconds"]) / statistics.median(one["seconds"])
              for one, two in zip(runs[1], runs[2])]
    result = {
        "workload": workload, "rows": rows, "evals_per_run": evals, "repeats": repeats, "quick": opts.quick,
        "seconds": {f"{n}_process": median[n] for n in median},
        "runs": {f"{n}_process": [r["seconds"] for r in results] for n, results in runs.items()},
        "ratio_2_over_1": statistics.median(paired), "paired_ratios": paired,
        "ratio_of_medians": median[2] / median[1], "goal": GOAL,
        "cpu_seconds_per_process": {f"{n}_process": cpu[n] for n in cpu},
        "eval_loss": {f"{n}_process": losses[n] for n in losses},
    }
    same = abs(losses[2] - losses[1]) <= 1e-5 * abs(losses[1])
    print(f"evaluate() on {rows} rows, {workload} GPT-2, one thread per process, median of {repeats} runs:")
    print(f"  1 process    {median[1]:.3f} s   (CPU {cpu[1]:.3f} s)")
    print(f"  2 processes  {median[2]:.3f} s   (CPU {cpu[2]:.3f} s per process)   ratio {result['ratio_2_over_1']:.2f}x "
          f"(median of paired runs; goal <= {GOAL}x; ratio of medians {result['ratio_of_medians']:.2f}x)")
    print(f"  eval_loss    1 process {losses[1]:.6f}, 2 processes {losses[2]:.6f} ({'equal' if same else 'DIFFERENT'})")
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump(result, f, indent=2)
    if not same:
        sys.exit("2-process eval_loss differs from the 1-process one")


if __name__ == "__main__":
    main()
