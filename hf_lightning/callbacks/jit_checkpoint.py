"""``JITCheckpoint``: HF's ``enable_jit_checkpoint`` — on SIGTERM, save ``checkpoint-N`` at a safe point and stop.

HF 5.x (``trainer_jit_checkpoint.py``): a SIGTERM handler starts a 3 s timer (so a SIGKILL that follows at once
does not meet a save in progress); when it fires, the next ``on_step_begin`` / ``on_pre_optimizer_step`` /
``on_step_end`` / ``on_epoch_end`` saves ``checkpoint-{global_step}`` and raises ``should_training_stop``;
``train()`` returns normally, so the script's exit code is its own (0 when it ends). The previous SIGTERM handler
is put back when training ends, and a SIGTERM after the request starts nothing more.

Here the save happens only at an optimizer-step boundary, after that step's log → evaluate → save (and, when the
step ends an epoch, after the epoch's), which is the moment a regular checkpoint is written: the resumed run draws
the same dropout masks and batches and is bit-identical. HF may save in ``on_pre_optimizer_step``, after the
window's forward passes drew their dropout masks; redoing that window after a resume draws others. The
checkpoint also keeps the training-loss sum of the current logging window (``stateful_callbacks``, so HF's
``TrainerState`` still reads the file), which the resume puts back: the next logged ``loss`` averages the whole
window, as in a run never stopped.

Under DDP / FSDP the signal may reach the processes at different moments (or only some of them). At every
safe point the processes agree by one small all-reduce whether any of them was asked to stop; then all save the
same step, and all stop. No process is left waiting in a collective. (Tested under DDP and FSDP2: under FSDP2
every process gathers the full state into the one checkpoint through the same ``CheckpointSaver``.)

Under Lightning's ``SLURMEnvironment`` with ``auto_requeue`` (a SLURM job step), the requeue signal (SIGUSR1 unless
set otherwise; ``sbatch --signal=USR1@<seconds>``) is handled the same way while training runs, and when the run
has stopped with its checkpoint on disk the main process asks SLURM to requeue the job (``scontrol requeue``, as
Lightning's own handler does). Lightning's handler would instead save a Lightning ``hpc_ckpt_*.ckpt`` in the middle
of a step, which it then loads on restart in place of the ``checkpoint-N`` folder.

The flow callback (:class:`~hf_lightning.callbacks.training_flow.HFFlowCallback`) owns one instance and calls it
at Lightning's hooks; it acts only when ``args.enable_jit_checkpoint`` is set.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import threading
from typing import TYPE_CHECKING, Any

import torch

from hf_lightning import _compat

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from hf_lightning.callbacks.log_history import TrainingLog

logger = logging.getLogger(__name__)

#: HF's grace period between the SIGTERM and the checkpoint request (``CheckpointManager(kill_wait=3)``).
KILL_WAIT_SECONDS = 3.0


class JITCheckpoint:
    """The SIGTERM handler and the stop decision of ``enable_jit_checkpoint``.

    Args:
        enabled: ``args.enable_jit_checkpoint``; when False every method is a no-op.
        kill_wait: seconds between the SIGTERM and the request (HF's 3 s); 0 requests at once.

    Attributes:
        stopped: this fit stopped on a SIGTERM (its checkpoint is written).
    """

    def __init__(self, enabled: bool, kill_wait: float | None = None) -> None:
        self.enabled = enabled
        self.kill_wait = KILL_WAIT_SECONDS if kill_wait is None else kill_wait
        self.stopped = False
        self._signalled = False
        self._requested = False
        self._installed = False
        self._previous: Any = None
        self._timer: threading.Timer | None = None
        # SLURM: the requeue signal while training runs (number, handler found), and whether it was received.
        self._requeue_signal: int | None = None
        self._previous_requeue: Any = None
        self._requeue_asked = False

    # ------------------------------------------------------------------ the handler
    def check_can_install(self) -> None:
        """Refuse before any work when the handler cannot be installed (Python sets handlers in the main thread)."""
        if self.enabled and threading.current_thread() is not threading.main_thread():
            raise ValueError(
                "enable_jit_checkpoint=True installs a SIGTERM handler, which Python allows only in the main thread; "
                "this fit runs in another thread. Train from the main thread, or remove enable_jit_checkpoint."
            )

    def install(self, trainer: pl.Trainer) -> None:
        """Install the SIGTERM handler for this fit (``on_train_start``), after Lightning registered its own.

        Lightning's handler would end the fit by a ``SystemExit`` after the batch (and broadcast from inside the
        handler under DDP); ours replaces it while training runs. A SIGTERM Lightning caught between its
        registration and now becomes our request.
        """
        self.stopped = self._signalled = self._requested = self._requeue_asked = False
        if not self.enabled:
            return
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True
        self._requeue_signal = _compat.slurm_requeue_signal(trainer)
        if self._requeue_signal is not None:
            self._previous_requeue = signal.signal(self._requeue_signal, self._on_requeue_signal)
        if _compat.take_lightning_sigterm(trainer):
            self._on_sigterm(signal.SIGTERM, None)

    def restore(self) -> None:
        """Put back the handler found at :meth:`install` (HF does it at ``on_train_end``); a pending wait is
        cancelled."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            if self._requeue_signal is not None:
                previous = self._previous_requeue
                signal.signal(self._requeue_signal, previous if previous is not None else signal.SIG_DFL)
            self._installed = False
            self._previous = self._previous_requeue = self._requeue_signal = None

    def _on_requeue_signal(self, signum: int, frame: Any) -> None:
        # SLURM's requeue signal: the same checkpoint and stop as a SIGTERM, then a requeue once the run ended.
        self._requeue_asked = True
        self._on_sigterm(signum, frame)

    def requeue(self, trainer: pl.Trainer) -> None:
        """After a stop on SLURM's requeue signal (its checkpoint on disk): ask SLURM to requeue this job, from
        the main process only, as Lightning's own requeue handler does (``scontrol requeue <job id>``)."""
        if not (self.stopped and self._requeue_asked and trainer.is_global_zero):
            return
        array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
        job_id = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ.get("SLURM_JOB_ID", "")
        if not re.fullmatch(r"[0-9_-]+", job_id):
            logger.warning("Not requeued: SLURM_JOB_ID=%r is not a SLURM job id.", job_id)
            return
        try:
            result = subprocess.run(["scontrol", "requeue", job_id], check=False).returncode
        except FileNotFoundError:
            logger.warning("Not requeued: `scontrol` was not found on PATH (job %s).", job_id)
            return
        if result == 0:
            logger.info("Requeued SLURM job %s.", job_id)
        else:
            logger.warning("Requeueing SLURM job %s failed: `scontrol requeue` exited with %s.", job_id, result)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # Only the first SIGTERM counts: a second one (an impatient orchestrator) starts no second wait or save.
        if self._signalled:
            return
        self._signalled = True
        logger.info("SIGTERM received: a checkpoint is saved at the next optimizer step after %ss.", self.kill_wait)
        if self.kill_wait <= 0:
            self._requested = True
            return
        self._timer = threading.Timer(self.kill_wait, self._request)
        self._timer.daemon = True
        self._timer.start()

    def _request(self) -> None:
        self._requested = True

    # ------------------------------------------------------------------ the safe point
    def should_stop_now(self, trainer: pl.Trainer) -> bool:
        """Whether any process was asked to stop; called at every safe point by every process (a collective).

        The processes reach the safe points in the same order, so the all-reduce pairs up; it costs one
        one-element reduction per optimizer step, only with ``enable_jit_checkpoint``.
        """
        if not self.enabled or self.stopped:
            return False
        requested = self._requested
        if trainer.world_size > 1:
            flag = torch.tensor(1 if requested else 0, device=trainer.strategy.root_device)
            requested = bool(trainer.strategy.reduce(flag, reduce_op="sum") > 0)
        return requested

    def logging_window(self, trainer: pl.Trainer, logbook: TrainingLog) -> dict[str, Any]:
        """The training-loss sums since the last log (one per process, gathered on every process) and the step of
        the last log: what a resume needs to log the same ``loss`` as a run never stopped."""
        tr_loss = logbook.tr_loss.detach()
        values = trainer.strategy.all_gather(tr_loss) if trainer.world_size > 1 else tr_loss.reshape(1)
        return {
            "args": {},
            "attributes": {
                "global_step": logbook.events.state.global_step,
                "globalstep_last_logged": logbook.globalstep_last_logged,
                "tr_loss": [float(v) for v in values.reshape(-1).tolist()],
            },
        }


__all__ = ["KILL_WAIT_SECONDS", "JITCheckpoint"]
