"""FSDP2 step time: hf_lightning against transformers' Trainer, the same arguments on the same 2 CPU processes.

    .venv/bin/python benchmarks/fsdp_steps.py [--quick] [--repeats N] [--workloads small,tiny] [--out results.json]

Every contender gets ``fsdp=True, fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": ["GPT2Block"]}``
(or the same sharding by hand) and the settings of :mod:`workloads` (logging, evaluation and saving off, so only
the training step is timed), under ``torchrun --nproc_per_node 2`` (gloo), one thread per process:

- ``hf_lightning`` really shards the model (``fully_shard``: each forward gathers the parameters, each backward
  reduce-scatters the gradients).
- ``hf_fsdp2`` is transformers' Trainer running its FSDP2 path on these processes. Out of the box accelerate
  turns FSDP on only for GPU-family devices; ``tests/helpers/hf_fsdp.accelerate_fsdp_on_cpu`` lifts that one
  gate (in that process only), so transformers and accelerate then run exactly the code they run on GPUs:
  ``fsdp2_prepare_model`` (``fully_shard`` on each ``GPT2Block``, then the root), the DTensor-aware gradient
  clipping, the FSDP optimizer handling. The goal compares hf_lightning with this contender: FSDP2 against FSDP2.
- ``hf`` is what transformers does with these arguments on CPU processes out of the box: its "FSDP2" run is DDP
  (the model wrapped in ``DistributedDataParallel``, gradients all-reduced, nothing sharded). Shown for context:
  DDP is less work per step than real sharding.
- ``fsdp2_loop`` is the floor for real FSDP2: a hand-written loop (forward, backward, clipping, fused AdamW, the
  scheduler) over the same model sharded by torch's ``fully_shard`` (each ``GPT2Block``, then the root), so the
  table shows how much of a difference is FSDP2 itself and how much is a trainer's loop.

Timing: rank 0 stamps wall clock and CPU time after every optimizer step (an HF-style ``TrainerCallback``'s
``on_step_end``, which both trainers fire right after the optimizer step); the step time is the mean over steps
``warmup_steps .. max_steps``, so start-up and the first steps are outside it. Every run is a fresh ``torchrun``;
hf_lightning and hf_fsdp2 run back to back (taking turns at going first), then the two context contenders. The
machine is a shared VM whose speed drifts by tens of percent between runs, so the goal's figure is the median over
``--repeats`` of the ratio within each back-to-back pair; the table shows each contender's median. The trainers must
all end with the same ``train_loss`` (checked): the same work was done. The machine is shared, so the
load average before and after is recorded, and the CPU seconds per step of rank 0 are shown beside the wall time.
``--quick`` runs the code path once on the tiny GPT-2 and a few steps (its numbers mean nothing).
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
GOAL = 1.0
CONTENDERS = ("hf_fsdp2", "hf", "hf_lightning", "fsdp2_loop")
TRAINERS = ("hf_fsdp2", "hf", "hf_lightning")
WORLD = 2


def worker(contender: str, out: str, workload_name: str, quick: bool) -> None:
    """One contender's 2-process run (inside torchrun); rank 0 writes its step stamps to ``out``."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, HERE)
    sys.path.insert(0, ROOT)
    from training import hf_style_args
    from workloads import QUICK_WORKLOADS, WORKLOADS, build_model, token_rows

    workload = (QUICK_WORKLOADS if quick else WORKLOADS)[workload_name]
    stamps: list[tuple[float, float]] = []
    # One epoch of exactly max_steps batches on each process.
    train = token_rows(workload, workload.max_steps * workload.batch_size * WORLD, seed=1)
    if contender == "fsdp2_loop":
        loss = fsdp2_loop(workload, train, stamps)
        _write(out, workload, stamps, loss, "FSDPGPT2LMHeadModel")
    if contender == "hf_fsdp2":
        from tests.helpers.hf_fsdp import accelerate_fsdp_on_cpu

        accelerate_fsdp_on_cpu()
    if contender in ("hf", "hf_fsdp2"):
        import transformers as lib
    else:
        import hf_lightning as lib

    class StepStamps(lib.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append((time.perf_counter(), time.process_time()))

    with tempfile.TemporaryDirectory() as tmp:
        args = lib.TrainingArguments(**{
            **hf_style_args(workload, flow_on=False, output_dir=tmp),
            "fsdp": True, "fsdp_config": {"version": 2, "transformer_layer_cls_to_wrap": ["GPT2Block"]},
        })
        trainer = lib.Trainer(model=build_model(workload), args=args, train_dataset=train,
                              callbacks=[StepStamps()])
        output = trainer.train()
        _write(out, workload, stamps, output.training_loss,
               type(trainer.model if contender == "hf_lightning" else trainer.model_wrapped).__name__)


def _write(out: str, workload, stamps: list[tuple[float, float]], train_loss: float, model_class: str) -> None:
    """Rank 0 writes the timed window's figures; every process then leaves."""
    if int(os.environ.get("RANK", "0")) == 0:
        first, last = stamps[workload.warmup_steps - 1], stamps[workload.max_steps - 1]
        with open(out, "w") as f:
            json.dump({"seconds_per_step": (last[0] - first[0]) / workload.timed_steps,
                       "cpu_seconds_per_step": (last[1] - first[1]) / workload.timed_steps,
                       "train_loss": train_loss, "steps": len(stamps), "model_class": model_class,
                       "world": int(os.environ.get("WORLD_SIZE", "1"))}, f)
    sys.stdout.flush()
    sys.stderr.flush()
    # As tests/helpers/torchrun.run_then_exit: leave without tearing torch down (a gloo destructor can hang at exit).
    os._exit(0)


def fsdp2_loop(workload, train, stamps: list[tuple[float, float]]) -> float:
    """The floor: a plain loop over the model sharded by torch's ``fully_shard``; returns the mean loss."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from training import _param_groups
    from workloads import LEARNING_RATE, MAX_GRAD_NORM, build_model, linear_decay

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build_model(workload)
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    model.train()
    optimizer = torch.optim.AdamW(_param_groups(model), lr=LEARNING_RATE, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.0, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_decay(workload.max_steps))
    shard = torch.utils.data.Subset(train, range(rank, len(train), WORLD))
    loader = torch.utils.data.DataLoader(shard, batch_size=workload.batch_size)
    total = torch.zeros(())
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        total += loss.detach()
        stamps.append((time.perf_counter(), time.process_time()))
    return float(total) / len(stamps)


def launch(contender: str, workload: str, quick: bool, out: str) -> dict:
    sys.path.insert(0, ROOT)
    from tests.helpers.torchrun import launch_env, python_command

    cmd = python_command(WORLD) + [os.path.abspath(__file__), "--worker", out, "--contender", contender,
                                   "--workload", workload]
    cmd += ["--quick"] if quick else []
    proc = subprocess.run(cmd, capture_output=True, text=True, env=launch_env(), cwd=ROOT, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{contender} run failed:\n{proc.stderr[-4000:]}")
    with open(out) as f:
        return json.load(f)


def measure(workload: str, repeats: int, quick: bool, tmp: str) -> dict:
    runs: dict[str, list[dict]] = {c: [] for c in CONTENDERS}
    for repeat in range(repeats):
        # hf_lightning and hf_fsdp2 run back to back (each first in every other repeat), so each pair meets about
        # the same machine; the context contenders follow.
        pair = ("hf_lightning", "hf_fsdp2") if repeat % 2 else ("hf_fsdp2", "hf_lightning")
        for contender in pair + tuple(c for c in CONTENDERS if c not in pair):
            runs[contender].append(launch(contender, workload, quick,
                                          os.path.join(tmp, f"{workload}-{contender}-{repeat}.json")))
    wall = {c: statistics.median(r["seconds_per_step"] for r in results) for c, results in runs.items()}
    cpu = {c: statistics.median(r["cpu_seconds_per_step"] for r in results) for c, results in runs.items()}
    losses = {c: results[-1]["train_loss"] for c, results in runs.items()}
    paired = [ours["seconds_per_step"] / theirs["seconds_per_step"]
              for ours, theirs in zip(runs["hf_lightning"], runs["hf_fsdp2"])]
    paired_cpu = [ours["cpu_seconds_per_step"] / theirs["cpu_seconds_per_step"]
                  for ours, theirs in zip(runs["hf_lightning"], runs["hf_fsdp2"])]
    return {
        "seconds_per_step": wall, "cpu_seconds_per_step": cpu,
        "runs": {c: [r["seconds_per_step"] for r in results] for c, results in runs.items()},
        # The goal's figure: the median over repeats of hf_lightning / hf_fsdp2 within each back-to-back pair.
        "ratio": statistics.median(paired), "cpu_ratio": statistics.median(paired_cpu),
        "paired_ratios": paired, "paired_cpu_ratios": paired_cpu,
        "ratio_of_medians": wall["hf_lightning"] / wall["hf_fsdp2"],
        "ratio_to_hf_ddp": wall["hf_lightning"] / wall["hf"],
        "ratio_to_fsdp2_loop": wall["hf_lightning"] / wall["fsdp2_loop"],
        "train_loss": losses, "model_class": {c: results[-1]["model_class"] for c, results in runs.items()},
        "same_loss": all(abs(losses[c] - losses["hf_fsdp2"]) <= 1e-4 * abs(losses["hf_fsdp2"]) for c in TRAINERS),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, few steps, one repeat (numbers mean nothing)")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--workloads", default="small,tiny", help="comma-separated names from workloads.py")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        worker(opts.contender, opts.worker, opts.workload, opts.quick)
        return
    names, repeats = opts.workloads.split(","), opts.repeats
    if opts.quick:
        names, repeats = ["tiny"], 1
    load_before = os.getloadavg()
    start = time.time()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            results[name] = measure(name, repeats, opts.quick, tmp)
    result = {"quick": opts.quick, "repeats": repeats, "goal": GOAL, "workloads": results,
              "meta": {"load_average_before": load_before, "load_average_after": os.getloadavg(),
                       "minutes": (time.time() - start) / 60}}
    print(f"FSDP2 arguments on {WORLD} CPU processes (gloo, one thread each), seconds per optimizer step, "
          f"median of {repeats} runs; load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after:")
    for name, r in results.items():
        wall, cpu = r["seconds_per_step"], r["cpu_seconds_per_step"]
        print(f"  {name}: " + "   ".join(f"{c} {wall[c]:.4f} s (CPU {cpu[c]:.4f}, {r['model_class'][c]})"
                                         for c in CONTENDERS))
        print(f"    hf_lightning / hf_fsdp2 {r['ratio']:.2f}x (median of paired runs; goal <= {GOAL}x), "
              f"CPU {r['cpu_ratio']:.2f}x, ratio of medians {r['ratio_of_medians']:.2f}x; "
              f"hf_lightning / hf (DDP) {r['ratio_to_hf_ddp']:.2f}x; "
              f"hf_lightning / fsdp2_loop {r['ratio_to_fsdp2_loop']:.2f}x; "
              f"train_loss of the trainers {'equal' if r['same_loss'] else 'DIFFERENT'}")
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump(result, f, indent=2)
    if not all(r["same_loss"] for r in results.values()):
        sys.exit("the trainers' train_loss differ")


if __name__ == "__main__":
    main()
