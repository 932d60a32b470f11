"""Run by the elastic-restart test under ``torchrun --max-restarts``: train, resume by itself after a restart.

usage: elastic_script.py <output_dir> <result_dir> [kill_rank1_at=K] [enospc_at=M]

The resume pattern under test (docs/reliability.md): the first attempt starts fresh, a restarted attempt
(``TORCHELASTIC_RESTART_COUNT`` > 0) resumes from ``get_last_checkpoint(output_dir)``, or starts fresh when no
complete checkpoint exists yet. Faults, each on one attempt only:

- ``kill_rank1_at=K``: on attempt 0, rank 1 SIGKILLs itself at the end of optimizer step K;
- ``enospc_at=M``: on attempt 1, rank 0's ``optimizer.pt`` of ``checkpoint-M`` hits a full disk (ENOSPC).

Every attempt leaves ``attempt-<a>-rank-<r>`` in the result folder; a rank whose ``train()`` raises writes its
error to ``error-<a>-rank-<r>.txt`` and exits with 1. When the run finishes, the same processes train again from
scratch, uninterrupted, into ``<output_dir>-reference`` (a second launch would cost an interpreter start per
process; the resumed run stays the first fit of its processes, as in a user's job), and rank 0 writes
``result.json``: both runs' ``log_history``, the checkpoint resumed from and the optimizer steps this attempt ran,
and ``weights.pt`` / ``reference.pt``.
"""

import errno
import json
import os
import signal
import sys

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import hf_lightning  # noqa: E402
from tests.reliability._fuzz_worker import DropoutRegression, _data  # noqa: E402


class _Steps(hf_lightning.TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


class _KillAt(hf_lightning.TrainerCallback):
    def __init__(self, step: int, marker: str):
        self.step = step
        self.marker = marker

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            # Left for the test: which process killed itself, at which step (torchrun reports whichever rank of
            # the group it sees fail first, often the survivor whose collective broke).
            with open(self.marker, "w") as f:
                f.write(str(state.global_step))
            os.kill(os.getpid(), signal.SIGKILL)


def _full_disk_at(step: int) -> None:
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if str(f).endswith("optimizer.pt") and f".tmp-checkpoint-{step}" in str(f):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real_save(obj, f, *args, **kwargs)

    torch.save = save


def _trainer(out, callbacks):
    args = hf_lightning.TrainingArguments(
        output_dir=out, per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=8, save_steps=2,
        save_total_limit=2, logging_steps=1, learning_rate=5e-2, seed=11, report_to="none", use_cpu=True,
        disable_tqdm=True,
    )
    model = DropoutRegression()
    return hf_lightning.Trainer(model=model, args=args, train_dataset=_data(20, seed=3), callbacks=callbacks), model


def main():
    out, result_dir = sys.argv[1:3]
    options = dict(arg.split("=") for arg in sys.argv[3:])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank = int(os.environ.get("RANK", "0"))
    open(os.path.join(result_dir, f"attempt-{attempt}-rank-{rank}"), "w").close()
    steps = _Steps()
    callbacks = [steps]
    if attempt == 0 and rank == 1 and "kill_rank1_at" in options:
        callbacks.append(_KillAt(int(options["kill_rank1_at"]), os.path.join(result_dir, "killed-0-rank-1")))
    if attempt == 1 and rank == 0 and "enospc_at" in options:
        _full_disk_at(int(options["enospc_at"]))
    trainer, model = _trainer(out, callbacks)
    # The pattern: a restarted attempt resumes from the newest complete checkpoint, if there is one.
    resume = hf_lightning.get_last_checkpoint(out) if attempt > 0 and os.path.isdir(out) else None
    try:
        trainer.train(resume_from_checkpoint=resume)
    except Exception as err:  # noqa: BLE001 - recorded for the test, then the attempt fails
        with open(os.path.join(result_dir, f"error-{attempt}-rank-{rank}.txt"), "w") as f:
            f.write(f"{type(err).__name__}: {err}")
        return trainer, model, 1
    reference, reference_model = _trainer(out + "-reference", [])
    reference.train()
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(result_dir, "weights.pt"))
        torch.save(reference_model.state_dict(), os.path.join(result_dir, "reference.pt"))
        with open(os.path.join(result_dir, "result.json"), "w") as f:
            json.dump({"log_history": trainer.state.log_history, "resumed_from": resume, "steps_run": steps.steps,
                       "reference_log_history": reference.state.log_history}, f)
    trainer.end()
    return (trainer, model, reference, reference_model), 0


if __name__ == "__main__":
    # As tests/helpers/torchrun.run_then_exit: no teardown of torch's objects (a gloo destructor can deadlock).
    kept = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(kept[-1])
