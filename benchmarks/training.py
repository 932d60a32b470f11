"""Training throughput: the same GPT-2 run through four loops, timestamped after every optimizer step.

Contenders (all with the settings in :mod:`workloads`):

- ``plain``: a hand-written PyTorch loop, the floor: forward, backward, clip, fused AdamW step (over HF's two
  parameter groups, as every contender), scheduler step, ``zero_grad``; with the flow on it also averages the loss for a log entry every ``logging_steps`` (one
  ``.item()`` per log), evaluates on the eval set and ``torch.save``s model + optimizer + scheduler.
- ``lightning``: a plain ``lightning.Trainer`` with automatic optimization (``gradient_clip_val``, a step-interval
  scheduler); with the flow on, ``self.log`` every step into an in-memory logger written every ``logging_steps``,
  a ``LearningRateMonitor``, ``val_check_interval`` and ``ModelCheckpoint(every_n_train_steps)``.
- ``hf``: ``transformers.Trainer``; ``hf_lightning``: ``hf_lightning.Trainer`` — the same ``TrainingArguments``
  (``logging_steps``, ``eval_strategy``/``save_strategy="steps"`` when on, ``"no"`` when off).

Timing: each contender records a stamp right after optimizer step *k* (after the scheduler step
and ``zero_grad``, before any log/eval/save that step triggers): the plain loop in its body, Lightning from a
``Callback.on_train_batch_end`` (which runs before Lightning's logging, validation and ``ModelCheckpoint``), both
HF-style trainers from a ``TrainerCallback.on_step_end`` (which both fire before their log → evaluate → save).
Throughput is measured over steps ``warmup_steps .. max_steps``: start-up (imports, model build, ``Trainer``
construction, Lightning's setup, the first steps' allocations) is outside the window for everyone, and every
log/eval/save fired inside the window is inside it for everyone.

Each stamp holds the wall clock and the process's CPU time (``time.process_time``). With one thread the CPU
time is what the run itself cost, whatever else the (shared, 2-core) machine was doing; ``steps_per_s`` is the
wall-clock figure, ``cpu_steps_per_s`` the CPU-time one.

In a full run the four contenders of a setting take turns inside the window (:mod:`turns`): a :class:`StepClock`
with ``turns`` pauses every ``turn_steps`` steps and leaves the paused time out of both clocks.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import torch

from turns import Turns
from workloads import LEARNING_RATE, MAX_GRAD_NORM, SEED, Workload, build_model, eval_data, linear_decay, train_data

CONTENDERS = ("plain", "lightning", "hf", "hf_lightning")


def hf_style_args(workload: Workload, flow_on: bool, output_dir: str) -> dict[str, Any]:
    """``TrainingArguments`` keywords shared by ``transformers`` and ``hf_lightning``."""
    on = flow_on
    return dict(
        output_dir=output_dir,
        per_device_train_batch_size=workload.batch_size,
        per_device_eval_batch_size=workload.batch_size,
        max_steps=workload.max_steps,
        learning_rate=LEARNING_RATE,
        weight_decay=0.0,
        max_grad_norm=MAX_GRAD_NORM,
        lr_scheduler_type="linear",
        warmup_steps=0,
        seed=SEED,
        report_to="none",
        use_cpu=True,
        # No progress bar for anyone (HF then prints each log entry, as does ours).
        disable_tqdm=True,
        dataloader_num_workers=0,
        logging_strategy="steps" if on else "no",
        logging_steps=workload.logging_steps,
        eval_strategy="steps" if on else "no",
        eval_steps=workload.eval_save_steps,
        save_strategy="steps" if on else "no",
        save_steps=workload.eval_save_steps,
        save_total_limit=1,
    )


class StepClock:
    """Stamps (wall clock, CPU time) right after every optimizer step; with ``turns``, takes turns in the window.

    With ``turns`` the contender pauses after the stamp of step ``warmup_steps`` and then every ``turn_steps``
    steps, and the paused time is subtracted from every later stamp, so differences between stamps are this
    contender's own running time. After the stamp of ``max_steps`` it waits for the other contenders to finish.
    """

    def __init__(self, workload: Workload, turns: Turns | None = None) -> None:
        self.stamps: list[tuple[float, float]] = []
        self.turns = turns
        self.first, self.last, self.every = workload.warmup_steps, workload.max_steps, workload.turn_steps
        self._paused_wall = self._paused_cpu = 0.0

    def tick(self) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.stamps.append((wall - self._paused_wall, cpu - self._paused_cpu))
        step = len(self.stamps)
        if self.turns is None or step < self.first:
            return
        if step == self.last:
            self.turns.finish()
        elif (step - self.first) % self.every == 0:
            self.turns.pause()
            self._paused_wall += time.perf_counter() - wall
            self._paused_cpu += time.process_time() - cpu


def _step_clock_callback(base: type, clock: StepClock):
    class StepStamps(base):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick()

    return StepStamps()


def _train_hf_style(lib, workload: Workload, flow_on: bool, workdir: str, clock: StepClock) -> None:
    """``lib.Trainer`` with ``lib.TrainingArguments`` (``lib`` is ``transformers`` or ``hf_lightning``)."""
    args = lib.TrainingArguments(**hf_style_args(workload, flow_on, workdir))
    trainer = lib.Trainer(
        model=build_model(workload), args=args, train_dataset=train_data(workload),
        eval_dataset=eval_data(workload) if flow_on else None,
        callbacks=[_step_clock_callback(lib.TrainerCallback, clock)],
    )
    trainer.train()


def train_hf(workload: Workload, flow_on: bool, workdir: str, clock: StepClock) -> None:
    import transformers

    _train_hf_style(transformers, workload, flow_on, workdir, clock)


def train_hf_lightning(workload: Workload, flow_on: bool, workdir: str, clock: StepClock) -> None:
    import hf_lightning

    _train_hf_style(hf_lightning, workload, flow_on, workdir, clock)


def _loader(dataset, batch_size: int, shuffle: bool) -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(SEED)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator)


def _param_groups(model: torch.nn.Module) -> list[dict]:
    """HF's two AdamW groups: weights that decay, and biases / LayerNorm parameters that do not.

    ``TrainingArguments(weight_decay=0.0)`` still gives HF's Trainer these two groups (both with decay 0), and the
    fused AdamW then runs once per group; the plain contenders step the same groups so that every loop does the
    same optimizer work. Written here rather than imported from hf_lightning (whose
    ``optim.grouping.build_param_groups`` gives the same two sets for GPT-2) so the plain contenders import neither
    hf_lightning nor Lightning.
    """
    no_decay = {id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()}
    no_decay |= {id(p) for name, p in model.named_parameters() if name.endswith("bias")}
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if id(p) not in no_decay], "weight_decay": 0.0},
            {"params": [p for p in params if id(p) in no_decay], "weight_decay": 0.0}]


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(_param_groups(model), lr=LEARNING_RATE, betas=(0.9, 0.999), eps=1e-8,
                             weight_decay=0.0, fused=True)


def train_plain(workload: Workload, flow_on: bool, workdir: str, clock: StepClock) -> None:
    model = build_model(workload)
    model.train()
    optimizer = _optimizer(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_decay(workload.max_steps))
    loader = _loader(train_data(workload), workload.batch_size, shuffle=True)
    eval_loader = _loader(eval_data(workload), workload.batch_size, shuffle=False) if flow_on else None
    history: list[dict] = []
    running_loss = torch.zeros(())
    for step, batch in enumerate(loader, start=1):
        loss = model(**batch).loss
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        running_loss += loss.detach()
        clock.tick()
        if not flow_on:
            continue
        if step % workload.logging_steps == 0:
            history.append({"loss": running_loss.item() / workload.logging_steps, "grad_norm": grad_norm.item(),
                            "learning_rate": scheduler.get_last_lr()[0], "step": step})
            running_loss.zero_()
        if step % workload.eval_save_steps == 0:
            history.append({"eval_loss": _plain_evaluate(model, eval_loader), "step": step})
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "step": step},
                       os.path.join(workdir, "checkpoint.pt"))
        if step == workload.max_steps:
            break


def _plain_evaluate(model: torch.nn.Module, loader) -> float:
    model.eval()
    total, batches = torch.zeros(()), 0
    with torch.no_grad():
        for batch in loader:
            total += model(**batch).loss
            batches += 1
    model.train()
    return total.item() / max(batches, 1)


def train_lightning(workload: Workload, flow_on: bool, workdir: str, clock: StepClock) -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
    from lightning.pytorch.loggers import Logger

    class MemoryLogger(Logger):
        """Keeps logged metrics in a list (the counterpart of HF's ``log_history`` with ``report_to="none"``)."""

        def __init__(self) -> None:
            super().__init__()
            self.history: list[dict] = []

        @property
        def name(self) -> str:
            return "memory"

        @property
        def version(self) -> int:
            return 0

        def log_metrics(self, metrics, step=None) -> None:
            self.history.append({**metrics, "step": step})

        def log_hyperparams(self, params, *args, **kwargs) -> None:
            pass

    class LanguageModel(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = build_model(workload)

        def training_step(self, batch, batch_idx):
            loss = self.model(**batch).loss
            if flow_on:
                self.log("train_loss", loss, on_step=True, on_epoch=False)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("eval_loss", self.model(**batch).loss, on_step=False, on_epoch=True)

        def configure_optimizers(self):
            optimizer = _optimizer(self.model)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_decay(workload.max_steps))
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    class StepStamps(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            clock.tick()

    callbacks: list = [StepStamps()]
    if flow_on:
        callbacks += [LearningRateMonitor(logging_interval="step"),
                      ModelCheckpoint(dirpath=workdir, every_n_train_steps=workload.eval_save_steps, save_top_k=1)]
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, precision="32-true", max_steps=workload.max_steps, max_epochs=1,
        gradient_clip_val=MAX_GRAD_NORM, gradient_clip_algorithm="norm",
        logger=MemoryLogger() if flow_on else False, log_every_n_steps=workload.logging_steps,
        val_check_interval=workload.eval_save_steps if flow_on else None, num_sanity_val_steps=0,
        enable_checkpointing=flow_on, enable_progress_bar=False, enable_model_summary=False,
        callbacks=callbacks, default_root_dir=workdir,
    )
    trainer.fit(
        LanguageModel(),
        train_dataloaders=_loader(train_data(workload), workload.batch_size, shuffle=True),
        val_dataloaders=_loader(eval_data(workload), workload.batch_size, shuffle=False) if flow_on else None,
    )


TRAINERS: dict[str, Callable[[Workload, bool, str, StepClock], None]] = {
    "plain": train_plain,
    "lightning": train_lightning,
    "hf": train_hf,
    "hf_lightning": train_hf_lightning,
}


def run_training(contender: str, workload: Workload, flow_on: bool, workdir: str,
                 turns: Turns | None = None) -> dict[str, Any]:
    """One timed training run; returns steps/s and tokens/s over the timed window (wall clock and CPU time).

    With ``turns`` the run takes turns with the other contenders of its setting inside the window (:mod:`turns`).
    """
    torch.set_num_threads(1)
    started = time.perf_counter()
    clock = StepClock(workload, turns)
    TRAINERS[contender](workload, flow_on, workdir, clock)
    stamps = clock.stamps
    if len(stamps) != workload.max_steps:
        raise RuntimeError(f"{contender} ran {len(stamps)} optimizer steps, expected {workload.max_steps}.")
    # stamps[k - 1] is taken right after optimizer step k.
    first, last = stamps[workload.warmup_steps - 1], stamps[workload.max_steps - 1]
    wall, cpu = last[0] - first[0], last[1] - first[1]
    return {
        "steps_per_s": workload.timed_steps / wall,
        "tokens_per_s": workload.timed_steps * workload.tokens_per_step / wall,
        "cpu_steps_per_s": workload.timed_steps / cpu,
        "timed_seconds": wall,
        "timed_cpu_seconds": cpu,
        "startup_seconds": stamps[0][0] - started,
    }
