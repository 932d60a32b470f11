"""Checkpoint save and resume time for the small GPT-2, ``transformers.Trainer`` vs ``hf_lightning.Trainer``.

- ``save``: a short run with ``save_strategy="steps"`` (logging and evaluation off). One save's time is from the
  ``on_step_end`` of a saving step to the ``on_save`` that follows it: both trainers write the whole
  ``checkpoint-N`` folder (weights, optimizer, scheduler, RNG state, ``trainer_state.json``, arguments) and then
  fire ``on_save``, with nothing else in between. The median over the run's saves is reported.
- ``resume``: in a fresh process, from the ``train(resume_from_checkpoint=...)`` call to the first
  ``on_step_begin``: loading weights/optimizer/scheduler/RNG, skipping the data already seen, and the trainer's
  own start-up. ``start`` is the same without a checkpoint, so ``resume - start`` is what loading costs.

Each trainer resumes from a checkpoint it wrote itself.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import replace
from typing import Any

import torch

from training import hf_style_args
from workloads import Workload, build_model, train_data

SAVE_EVERY = 2


def _library(contender: str):
    if contender == "hf":
        import transformers

        return transformers
    import hf_lightning

    return hf_lightning


def _trainer(contender: str, workload: Workload, output_dir: str, max_steps: int, save: bool, callback):
    lib = _library(contender)
    kwargs = hf_style_args(replace(workload, warmup_steps=0, timed_steps=max_steps), False, output_dir)
    kwargs.update(save_strategy="steps" if save else "no", save_steps=SAVE_EVERY, save_total_limit=None)
    # The dataset stays the workload's full epoch, so resuming skips data mid-epoch as a real resume does.
    return lib.Trainer(model=build_model(workload), args=lib.TrainingArguments(**kwargs),
                       train_dataset=train_data(workload), callbacks=[callback])


def _folder_mb(path: str) -> float:
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, name)) for name in files)
    return total / 2**20


def run_save(contender: str, workload: Workload, output_dir: str, saves: int) -> dict[str, Any]:
    """Train ``saves * SAVE_EVERY`` steps saving every ``SAVE_EVERY``; returns the median save time."""
    torch.set_num_threads(1)
    lib = _library(contender)

    class SaveTimer(lib.TrainerCallback):
        def __init__(self) -> None:
            self.step_end = 0.0
            self.seconds: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.step_end = time.perf_counter()

        def on_save(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self.step_end)

    timer = SaveTimer()
    max_steps = saves * SAVE_EVERY
    _trainer(contender, workload, output_dir, max_steps, save=True, callback=timer).train()
    checkpoint = os.path.join(output_dir, f"checkpoint-{max_steps}")
    if len(timer.seconds) != saves or not os.path.isdir(checkpoint):
        raise RuntimeError(f"{contender} saved {len(timer.seconds)} checkpoints, expected {saves} ending in "
                           f"{checkpoint}.")
    return {"save_seconds": statistics.median(timer.seconds), "saves": timer.seconds,
            "checkpoint_mb": _folder_mb(checkpoint), "checkpoint": checkpoint}


def run_resume(contender: str, workload: Workload, output_dir: str, checkpoint: str | None) -> dict[str, Any]:
    """Seconds from ``train()`` to the first step, resuming from ``checkpoint`` (or from scratch when ``None``)."""
    torch.set_num_threads(1)
    lib = _library(contender)

    class FirstStep(lib.TrainerCallback):
        def __init__(self) -> None:
            self.first: float | None = None

        def on_step_begin(self, args, state, control, **kwargs):
            if self.first is None:
                self.first = time.perf_counter()

    first = FirstStep()
    done = int(checkpoint.rsplit("-", 1)[1]) if checkpoint else 0
    trainer = _trainer(contender, workload, output_dir, done + 1, save=False, callback=first)
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=checkpoint)
    if first.first is None:
        raise RuntimeError(f"{contender} never began a training step after resuming from {checkpoint}.")
    key = "resume_seconds" if checkpoint else "start_seconds"
    return {key: first.first - start}
