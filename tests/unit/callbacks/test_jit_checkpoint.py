"""``enable_jit_checkpoint`` in one process: HF's handler semantics (grace period, one save, handler restored)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import lightning.pytorch as pl
import pytest
import torch

import hf_lightning
from hf_lightning.callbacks import jit_checkpoint
from hf_lightning.callbacks.checkpoint_saver import CheckpointSaver
from hf_lightning.callbacks.jit_checkpoint import JITCheckpoint
from tests.reliability._fuzz_worker import DropoutRegression, _data


@pytest.fixture
def previous_handler():
    """A SIGTERM handler installed before training, which records its calls; the original is put back after."""
    calls = []
    original = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    handler = signal.getsignal(signal.SIGTERM)
    yield handler, calls
    signal.signal(signal.SIGTERM, original)


class _SigtermAt(hf_lightning.TrainerCallback):
    """Sends this process ``times`` SIGTERMs when the step after ``step`` begins."""

    def __init__(self, step: int, times: int) -> None:
        self.step, self.times = step, times

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGTERM)


def test_enable_jit_checkpoint_is_accepted(tmp_path):
    assert hf_lightning.TrainingArguments(output_dir=str(tmp_path), enable_jit_checkpoint=True).enable_jit_checkpoint


def test_sigterm_saves_once_stops_cleanly_and_restores_the_previous_handler(tmp_path, monkeypatch, previous_handler):
    """Two SIGTERMs as step 4 begins: step 4 finishes, one checkpoint-4 is written (the second SIGTERM starts no
    second save; save_strategy="no" does not prevent it, as in HF), train() returns normally, and the handler
    installed before training is back, never called."""
    handler, calls = previous_handler
    monkeypatch.setattr(jit_checkpoint, "KILL_WAIT_SECONDS", 0.0)
    saves = []
    original_save = CheckpointSaver.save
    monkeypatch.setattr(CheckpointSaver, "save", lambda self, *a, **kw: (saves.append(1), original_save(self, *a, **kw)))
    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=30,
        logging_steps=3, save_strategy="no", learning_rate=5e-2, seed=11, report_to="none", use_cpu=True,
        disable_tqdm=True, enable_jit_checkpoint=True,
    )
    trainer = hf_lightning.Trainer(model=DropoutRegression(), args=args, train_dataset=_data(20, seed=5),
                                   callbacks=[_SigtermAt(step=3, times=2)])
    output = trainer.train()
    assert output.global_step == trainer.state.global_step == 4
    assert len(saves) == 1
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-4"]
    assert json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())["global_step"] == 4
    assert signal.getsignal(signal.SIGTERM) is handler
    assert calls == []


def test_the_request_waits_hfs_grace_period_and_a_second_sigterm_starts_nothing(previous_handler):
    handler, _ = previous_handler
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    jit = JITCheckpoint(enabled=True, kill_wait=0.4)
    jit.install(trainer)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert not jit.should_stop_now(trainer)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.6)
        assert jit.should_stop_now(trainer)
    finally:
        jit.restore()
    assert signal.getsignal(signal.SIGTERM) is handler
    assert jit_checkpoint.KILL_WAIT_SECONDS == 3.0 and JITCheckpoint(enabled=True).kill_wait == 3.0


def test_disabled_installs_nothing(previous_handler):
    handler, _ = previous_handler
    jit = JITCheckpoint(enabled=False)
    jit.install(pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False))
    assert signal.getsignal(signal.SIGTERM) is handler
    jit.restore()
    assert signal.getsignal(signal.SIGTERM) is handler


def test_refused_outside_the_main_thread():
    errors = []

    def run():
        try:
            JITCheckpoint(enabled=True).check_can_install()
        except ValueError as error:
            errors.append(str(error))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "enable_jit_checkpoint" in errors[0] and "main thread" in errors[0]


def test_under_lightnings_slurm_environment_sigterm_still_checkpoints_and_requeue_signal_is_taken_over(
        tmp_path, monkeypatch, previous_handler):
    """A SLURM job step (environment as srun sets it): Lightning's SLURMEnvironment with auto-requeue; while
    training runs its requeue signal (SIGUSR1) is ours, SIGTERM (sbatch --signal=TERM@<s>, or a preemption) still
    ends in the SIGTERM checkpoint and a clean stop with no requeue, and both handlers are what they were before
    the fit afterwards."""
    handler, calls = previous_handler
    for key, value in {"SLURM_NTASKS": "1", "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_PROCID": "0",
                       "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(jit_checkpoint, "KILL_WAIT_SECONDS", 0.0)
    usr1_before = signal.getsignal(signal.SIGUSR1)
    seen = {}

    class Probe(hf_lightning.TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            seen["sigusr1"] = signal.getsignal(signal.SIGUSR1)

    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=30,
        logging_steps=3, save_steps=100, learning_rate=5e-2, seed=11, report_to="none", use_cpu=True,
        disable_tqdm=True, enable_jit_checkpoint=True,
    )
    pl_trainer = hf_lightning.build_lightning_trainer(args, callbacks=[_SigtermAt(step=2, times=1), Probe()],
                                                      enable_progress_bar=False, logger=False)
    module = hf_lightning.HFLightningModule(DropoutRegression(), args)
    pl_trainer.fit(module, datamodule=hf_lightning.HFDataModule(args, train_dataset=_data(20, seed=5)))
    assert getattr(seen["sigusr1"], "__func__", None) is JITCheckpoint._on_requeue_signal
    assert pl_trainer.global_step == 3 and sorted(os.listdir(tmp_path)) == ["checkpoint-3"]
    assert signal.getsignal(signal.SIGTERM) is handler and calls == []
    assert signal.getsignal(signal.SIGUSR1) == usr1_before


class _SignalAt(hf_lightning.TrainerCallback):
    """Sends this process ``signum`` once, when the step after ``step`` begins; records the handler of ``watch``."""

    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum, self.handlers = step, signum, []

    def on_step_begin(self, args, state, control, **kwargs):
        self.handlers.append(signal.getsignal(self.signum))
        if state.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def _slurm_job(monkeypatch, tmp_path, job_id="4242"):
    """The environment srun sets for a one-task job step, and a fake ``scontrol`` on PATH recording its calls."""
    for key, value in {"SLURM_NTASKS": "1", "SLURM_JOB_ID": job_id, "SLURM_JOB_NAME": "train", "SLURM_PROCID": "0",
                       "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost"}.items():
        monkeypatch.setenv(key, value)
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol_calls.txt"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_slurms_requeue_signal_saves_at_a_step_boundary_requeues_and_the_requeued_run_resumes_exactly(
        tmp_path, monkeypatch):
    """Under Lightning's SLURMEnvironment (auto-requeue on SIGUSR1, ``sbatch --signal=USR1@<s>``), the requeue
    signal in the middle of training ends like a SIGTERM: checkpoint-3 at the step boundary and a clean stop, then
    ``scontrol requeue <job id>`` once, from the main process. No Lightning ``hpc_ckpt`` is written anywhere, and the
    requeued job resumed from ``get_last_checkpoint`` ends equal to a run never interrupted (dropout on)."""
    calls = _slurm_job(monkeypatch, tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(jit_checkpoint, "KILL_WAIT_SECONDS", 0.0)
    usr1_before = signal.getsignal(signal.SIGUSR1)

    def run(out, callbacks=(), resume=None, jit=True):
        args = hf_lightning.TrainingArguments(
            output_dir=str(out), per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=6,
            logging_steps=2, save_steps=100, learning_rate=5e-2, seed=11, report_to="none", use_cpu=True,
            disable_tqdm=True, enable_jit_checkpoint=jit,
        )
        trainer = hf_lightning.Trainer(model=DropoutRegression(), args=args, train_dataset=_data(40, seed=5),
                                       callbacks=list(callbacks))
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    signaller = _SignalAt(step=2, signum=signal.SIGUSR1)
    stopped = run(tmp_path / "out", [signaller])
    assert stopped.state.global_step == 3 and sorted(os.listdir(tmp_path / "out")) == ["checkpoint-3"]
    assert calls.read_text().split("\n") == ["requeue 4242", ""]
    assert getattr(signaller.handlers[0], "__func__", None) is JITCheckpoint._on_requeue_signal
    assert signal.getsignal(signal.SIGUSR1) == usr1_before
    assert not [p for p in tmp_path.rglob("*") if p.suffix == ".ckpt" or p.name.startswith("hpc_ckpt")]

    resumed = run(tmp_path / "out", resume=hf_lightning.get_last_checkpoint(str(tmp_path / "out")))
    whole = run(tmp_path / "whole", jit=False)
    assert resumed.state.global_step == 6 and calls.read_text().count("requeue") == 1
    assert resumed.state.log_history[:-1] == whole.state.log_history[:-1]
    for name, value in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value), name


def test_without_slurm_the_requeue_signal_is_left_alone(tmp_path, monkeypatch, previous_handler):
    """Outside a SLURM job step nothing but SIGTERM is taken over; no requeue is attempted."""
    for key in ("SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_JOB_NAME"):
        monkeypatch.delenv(key, raising=False)
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    usr1_before = signal.getsignal(signal.SIGUSR1)
    jit = JITCheckpoint(enabled=True, kill_wait=0.0)
    jit.install(trainer)
    try:
        assert signal.getsignal(signal.SIGUSR1) == usr1_before
    finally:
        jit.restore()


def test_a_sigterm_lightnings_handler_caught_before_training_started_becomes_the_request(tmp_path, monkeypatch):
    """Between Lightning's handler registration and on_train_start (here: while the train loader is built) a
    SIGTERM reaches Lightning's handler; it becomes the request, and Lightning's SystemExit never comes."""
    monkeypatch.setattr(jit_checkpoint, "KILL_WAIT_SECONDS", 0.0)

    class SignalledDataModule(hf_lightning.HFDataModule):
        def train_dataloader(self):
            os.kill(os.getpid(), signal.SIGTERM)
            return super().train_dataloader()

    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=30,
        logging_steps=3, save_strategy="no", learning_rate=5e-2, seed=11, report_to="none", use_cpu=True,
        disable_tqdm=True, enable_jit_checkpoint=True,
    )
    pl_trainer = hf_lightning.build_lightning_trainer(args, enable_progress_bar=False, logger=False)
    module = hf_lightning.HFLightningModule(DropoutRegression(), args)
    pl_trainer.fit(module, datamodule=SignalledDataModule(args, train_dataset=_data(20, seed=5)))
    assert pl_trainer.global_step == 1 and sorted(os.listdir(tmp_path)) == ["checkpoint-1"]
    assert not pl_trainer.received_sigterm
