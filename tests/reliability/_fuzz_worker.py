"""The training process the kill/resume fuzz test starts, kills and restarts.

It runs in a child of a ``multiprocessing`` fork server that imported torch, Lightning and hf_lightning once, so a
restart costs milliseconds instead of an interpreter start. Each run resumes from ``get_last_checkpoint`` when
there is one (``train(resume_from_checkpoint=...)`` or ``fit(ckpt_path=...)``), and may be told to SIGKILL itself
at the k-th time it reaches a chosen point of the checkpoint code. On success it writes the final weights and
``log_history`` to ``result`` (atomically), so a run killed while writing them leaves no result.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time

import torch
from torch import nn

import hf_lightning
from hf_lightning.checkpointing import writer as fmt
from hf_lightning.checkpointing import rotation
from hf_lightning.state import TrainerState
from tests.helpers.models import DictDataset

# Run shape: 20 rows / batch 4 = 5 micro-batches, GA 2 → windows of 2, 2, 1 (3 optimizer steps per epoch, a short
# last window); 30 steps = 10 epochs, so checkpoints land mid-epoch and at epoch boundaries.
MAX_STEPS = 30
#: "plain": a checkpoint every 2 steps, 2 kept, an evaluation every 5 steps. "best": an evaluation every 2 steps, a
#: checkpoint every 4, only 1 kept besides the best (rotation protects it), the best loaded at the end and the
#: others deleted then (HF's save_total_limit=1 rule).
#: "jit" / "jit_best" (the SIGTERM fuzz): the same with ``enable_jit_checkpoint`` and a loss logged every 3 steps,
#: so a SIGTERM checkpoint usually lands inside a logging window.
CONFIGS = {
    "plain": dict(save_steps=2, save_total_limit=2, eval_strategy="steps", eval_steps=5),
    "best": dict(save_steps=4, save_total_limit=1, eval_strategy="steps", eval_steps=2, load_best_model_at_end=True),
    "jit": dict(save_steps=4, save_total_limit=2, eval_strategy="steps", eval_steps=5, logging_steps=3,
                enable_jit_checkpoint=True),
    "jit_best": dict(save_steps=4, save_total_limit=1, eval_strategy="steps", eval_steps=2, logging_steps=3,
                     load_best_model_at_end=True, enable_jit_checkpoint=True),
}
#: Where the SIGTERM fuzz signals a run (see _install_sigterm_point): the k-th training forward, backward (inside
#: autograd, from a gradient hook), first micro-batch of a window (between it and the next one), evaluation
#: forward, or checkpoint write (as optimizer.pt is written); or after k milliseconds of training.
SIGTERM_POINTS = ["term_forward", "term_backward", "term_window", "term_eval", "term_save", "term_delay"]


class DropoutRegression(nn.Module):
    """An HF-convention model whose loss depends on the RNG (dropout), so a resume must restore it exactly."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.inp = nn.Linear(4, 16)
        self.drop = nn.Dropout(0.2)
        self.out = nn.Linear(16, 1)

    def forward(self, x, labels=None):
        preds = self.out(self.drop(torch.relu(self.inp(x)))).squeeze(-1)
        if labels is None:
            return (preds,)
        return (nn.functional.mse_loss(preds, labels), preds)


def _data(n: int, seed: int) -> DictDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = x.sum(-1) * 0.5 + 0.1 * torch.randn(n, generator=g)
    return DictDataset([{"x": x[i], "labels": y[i]} for i in range(n)])


def _args(out: str, config: str) -> hf_lightning.TrainingArguments:
    values = {"logging_steps": 1, **CONFIGS[config]}
    return hf_lightning.TrainingArguments(
        output_dir=out, per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=MAX_STEPS,
        learning_rate=5e-2, seed=11, report_to="none", use_cpu=True, disable_tqdm=True, **values,
    )


def _sigterm(times: int = 1) -> None:
    for _ in range(times):
        os.kill(os.getpid(), signal.SIGTERM)


def _install_sigterm_point(point: str, k: int, model: nn.Module, times: int) -> list:
    """Send this process ``times`` SIGTERMs the ``k``-th time it reaches ``point`` (see :data:`SIGTERM_POINTS`);
    returns HF callbacks the run needs for it."""
    countdown = [k]

    def hit() -> None:
        countdown[0] -= 1
        if countdown[0] == 0:
            _sigterm(times)

    if point in ("term_forward", "term_eval"):
        wanted = point == "term_forward"

        def inside_forward(module, inputs):
            if model.training == wanted:
                hit()

        # A pre-hook of the first layer: the signal lands inside the model's forward.
        model.inp.register_forward_pre_hook(inside_forward)
    elif point == "term_backward":
        model.inp.weight.register_hook(lambda grad: hit())
    elif point == "term_save":
        original_torch_save = torch.save

        def save(obj, f, *a, **kw):
            if str(f).endswith("optimizer.pt"):
                hit()
            return original_torch_save(obj, f, *a, **kw)

        torch.save = save
    elif point == "term_window":
        class AtSubstep(hf_lightning.TrainerCallback):
            def on_substep_end(self, args, state, control, **kwargs):
                hit()

        return [AtSubstep()]
    elif point == "term_delay":
        class AfterDelay(hf_lightning.TrainerCallback):
            timer = None

            def on_train_begin(self, args, state, control, **kwargs):
                self.timer = threading.Timer(k / 1000, _sigterm, args=(times,))
                self.timer.start()

            def on_train_end(self, args, state, control, **kwargs):
                self.timer.cancel()

        return [AfterDelay()]
    return []


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _Countdown:
    """Kills the process the ``k``-th time :meth:`hit` is called."""

    def __init__(self, k: int) -> None:
        self.left = k

    def hit(self) -> None:
        self.left -= 1
        if self.left == 0:
            _kill()


def _install_kill_point(point: str, k: int) -> None:
    """Patch one place of the checkpoint code to SIGKILL the process the ``k``-th time it is reached."""
    countdown = _Countdown(k)
    if point == "save_model":
        original_save_model = fmt.save_model_files

        def save_model_files(*a, **kw):
            countdown.hit()
            return original_save_model(*a, **kw)

        fmt.save_model_files = save_model_files
    elif point == "model_file":
        import safetensors.torch

        original_save_file = safetensors.torch.save_file

        def save_file(tensors, filename, *a, **kw):
            if countdown.left == 1:
                # Half a weights file on disk, then die.
                original_save_file(tensors, filename, *a, **kw)
                with open(filename, "r+b") as f:
                    f.truncate(os.path.getsize(filename) // 2)
            countdown.hit()
            return original_save_file(tensors, filename, *a, **kw)

        safetensors.torch.save_file = save_file
    elif point in ("optimizer", "rng"):
        suffix = "optimizer.pt" if point == "optimizer" else "rng_state.pth"
        original_torch_save = torch.save

        def save(obj, f, *a, **kw):
            if str(f).endswith(suffix):
                countdown.hit()
            return original_torch_save(obj, f, *a, **kw)

        torch.save = save
    elif point == "trainer_state":
        original_to_json = TrainerState.save_to_json

        def save_to_json(self, path):
            # Half a file first: a kill here leaves a truncated trainer_state.json in the temporary folder.
            if countdown.left == 1:
                with open(path, "w") as f:
                    f.write('{"global_step": ')
            countdown.hit()
            return original_to_json(self, path)

        TrainerState.save_to_json = save_to_json
    elif point in ("publish", "published"):
        original_publish = fmt._publish

        def publish(temporary, final, **kwargs):
            if point == "publish":
                countdown.hit()
            original_publish(temporary, final, **kwargs)
            if point == "published":
                countdown.hit()

        fmt._publish = publish
    elif point == "rotate":
        original_rmtree = rotation.shutil.rmtree

        def rmtree(path, *a, **kw):
            if str(path).endswith(".deleting") and countdown.left == 1:
                # Delete one file, then die: the folder being rotated away is left half deleted.
                files = sorted(os.listdir(path))
                if files:
                    os.remove(os.path.join(path, files[0]))
                _kill()
            if str(path).endswith(".deleting"):
                countdown.hit()
            return original_rmtree(path, *a, **kw)

        shutil.rmtree = rmtree
    elif point != "none":
        raise ValueError(f"unknown kill point {point!r}")


def train_once(out: str, mode: str, config: str = "plain", point: str = "none", k: int = 0,
               result: str | None = None, log: str | None = None) -> None:
    """Train (resuming from the last complete checkpoint in ``out``), optionally killing itself on the way.

    Args:
        out: The output directory.
        mode: ``"facade"`` (``Trainer.train``) or ``"native"`` (``lightning.Trainer.fit``).
        config: A key of :data:`CONFIGS`.
        point: Where to kill (see :func:`_install_kill_point`), or ``"none"``.
        k: Kill the ``k``-th time ``point`` is reached.
        result: Where to write ``{"weights": ..., "log_history": ...}`` after a finished run.
        log: A file that receives this process's stdout and stderr.
    """
    if log is not None:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    torch.set_num_threads(1)
    # The SIGTERM points: "term_<where>" signals once, "term2_<where>" twice in a row.
    term_point, term_times = point, 1
    if point.startswith("term2_"):
        term_point, term_times = "term_" + point[len("term2_"):], 2
    if term_point.startswith("term_"):
        # No grace period: the request is taken at the moment the signal arrives (HF waits 3 s).
        from hf_lightning.callbacks import jit_checkpoint

        jit_checkpoint.KILL_WAIT_SECONDS = 0.0
    else:
        _install_kill_point(point, k)
    last = hf_lightning.get_last_checkpoint(out) if os.path.isdir(out) else None
    args = _args(out, config)
    model = DropoutRegression()
    callbacks = _install_sigterm_point(term_point, k, model, term_times) if term_point.startswith("term_") else []
    train, evald = _data(20, seed=5), _data(8, seed=6)
    if mode == "facade":
        trainer = hf_lightning.Trainer(model=model, args=args, train_dataset=train, eval_dataset=evald,
                                       callbacks=callbacks)
        trainer.train(resume_from_checkpoint=last)
        flow = trainer.flow
    else:
        pl_trainer = hf_lightning.build_lightning_trainer(args, callbacks=callbacks, enable_progress_bar=False,
                                                          logger=False)
        module = hf_lightning.HFLightningModule(model, args)
        datamodule = hf_lightning.HFDataModule(args, train_dataset=train, eval_dataset=evald)
        pl_trainer.fit(module, datamodule=datamodule, ckpt_path=last)
        flow = next(cb for cb in pl_trainer.callbacks if type(cb).__name__ == "HFFlowCallback")
    log_history = flow.state.log_history
    if result is not None:
        weights = {name: value.tolist() for name, value in model.state_dict().items()}
        temporary = f"{result}.{os.getpid()}.tmp"
        with open(temporary, "w") as f:
            json.dump({"weights": weights, "log_history": log_history, "finished_at": time.time(),
                       "global_step": flow.state.global_step, "jit_stopped": flow.jit.stopped,
                       "sigterm_handler": repr(signal.getsignal(signal.SIGTERM))}, f)
        os.replace(temporary, result)
