"""Run by the FSDP2 SIGTERM tests under torchrun: SIGTERM cases, each followed by its resume, in one launch.

usage: jit_fsdp_script.py <work_dir> <plan.json>

``plan.json`` holds ``{"cases": [...], "save_override": bool}``. Each case is ``{"name": str, "signals": [s0, s1]}``
where ``s<r>`` is what rank ``r`` does: ``null`` (no SIGTERM) or ``[point, k]`` — a real SIGTERM the process
sends itself the ``k``-th time it reaches ``point``:

- ``forward`` / ``eval``: inside a training / evaluation forward (a pre-hook of the first block's layer);
- ``backward``: inside the backward (a gradient hook on the first block's layer output, i.e. inside autograd);
- ``window``: between the micro-batches of an accumulation window (HF's ``on_substep_end``);
- ``save``: while a checkpoint file of this process is written (its ``torch.save`` into the staging folder);
- ``delay``: ``k`` milliseconds after training began (a timer thread).

For each case the same processes train with ``enable_jit_checkpoint`` (HF's 3 s grace period set to 0) into
``<work_dir>/<name>/out``, then (when the run stopped on a SIGTERM) resume from ``get_last_checkpoint`` into the
same folder and train to the end. Then they train the run once uninterrupted into ``<work_dir>/reference``.
Each rank writes ``<work_dir>/<name>/rank<r>.json`` (its step, whether it stopped on the SIGTERM, the handler left
after training, the folders then, the checkpoint resumed from with its files and ``trainer_state.json``'s step and
``log_history``); rank 0 writes ``<name>/result.json`` (``log_history`` of the signalled and the finished run) and
``<name>/weights.pt`` (the full weights at the end), and the same for ``reference``. Each process also leaves its
pid in ``pid-<rank>`` (the test kills them if the launch deadlocks).

With ``save_override``, the processes then train once more with a ``Trainer`` subclass whose ``_save`` adds a file of its own
(HF's documented pattern) into ``<work_dir>/override``, calls ``save_model`` into ``<work_dir>/override/final``, and
rank 0 records which ranks called ``_save`` with which state dict (``override.json``).

Everything is an FSDP2 run on 2 CPU processes (gloo): a model of two dropout blocks, each its own FSDP group.
"""

import json
import os
import signal
import sys
import threading

import torch
import torch.distributed
from torch import nn

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import hf_lightning  # noqa: E402
from hf_lightning.callbacks import jit_checkpoint  # noqa: E402
from tests.reliability._fuzz_worker import _data  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        return x + self.drop(torch.relu(self.lin(x)))


class DropoutNet(nn.Module):
    """Dropout in every block, so a resume must restore each process's RNG exactly; each block is an FSDP group."""

    _no_split_modules = ["Block"]

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.inp = nn.Linear(4, 16)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.out = nn.Linear(16, 1)

    def forward(self, x, labels=None):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        preds = self.out(h).squeeze(-1).clone()  # not a view of the root module's output (FSDP2 warns)
        if labels is None:
            return (preds,)
        return (nn.functional.mse_loss(preds, labels), preds)


def _args(out: str) -> hf_lightning.TrainingArguments:
    # 20 rows, 2 per process and micro-batch, GA 2: windows of 2, 2, 1 micro-batches (3 steps per epoch).
    return hf_lightning.TrainingArguments(
        output_dir=out, per_device_train_batch_size=2, per_device_eval_batch_size=2, gradient_accumulation_steps=2,
        max_steps=9, logging_steps=3, eval_strategy="steps", eval_steps=2, save_steps=3, save_total_limit=2,
        learning_rate=5e-2, seed=11, report_to="none", use_cpu=True, disable_tqdm=True, enable_jit_checkpoint=True,
        ddp_timeout=120, fsdp=True, fsdp_config={"version": 2},
    )


def _full_weights(model: nn.Module) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


class _Signal:
    """Sends this process a SIGTERM the ``k``-th time ``point`` is reached; :meth:`undo` removes the patches."""

    def __init__(self, point: str, k: int) -> None:
        self.point, self.left = point, k
        self.undo_steps = []

    def hit(self) -> None:
        self.left -= 1
        if self.left == 0:
            _sigterm()

    def install(self, model: nn.Module) -> list:
        point = self.point
        if point in ("forward", "eval"):
            wanted = point == "forward"

            def inside_forward(module, inputs):
                if model.training == wanted:
                    self.hit()

            handle = model.blocks[0].lin.register_forward_pre_hook(inside_forward)
            self.undo_steps.append(handle.remove)
        elif point == "backward":
            # fully_shard replaces the parameters (a hook on one now would never run): hook the layer's output.
            def on_output(module, inputs, output):
                if model.training and output.requires_grad:
                    output.register_hook(lambda grad: self.hit())

            handle = model.blocks[0].lin.register_forward_hook(on_output)
            self.undo_steps.append(handle.remove)
        elif point == "save":
            real_save = torch.save

            def save(obj, f, *a, **kw):
                if ".tmp-checkpoint" in str(f):
                    self.hit()
                return real_save(obj, f, *a, **kw)

            torch.save = save
            self.undo_steps.append(lambda: setattr(torch, "save", real_save))
        elif point == "window":
            signal_ = self

            class AtSubstep(hf_lightning.TrainerCallback):
                def on_substep_end(self, args, state, control, **kwargs):
                    signal_.hit()

            return [AtSubstep()]
        elif point == "delay":
            delay = self.left / 1000

            class AfterDelay(hf_lightning.TrainerCallback):
                timer = None

                def on_train_begin(self, args, state, control, **kwargs):
                    self.timer = threading.Timer(delay, _sigterm)
                    self.timer.start()

                def on_train_end(self, args, state, control, **kwargs):
                    self.timer.cancel()

            return [AfterDelay()]
        else:
            raise ValueError(f"unknown point {point!r}")
        return []

    def undo(self) -> None:
        for step in self.undo_steps:
            step()


def _train(out: str, signal_: _Signal | None = None, resume: str | None = None, trainer_cls=hf_lightning.Trainer):
    model = DropoutNet()
    callbacks = signal_.install(model) if signal_ is not None else []
    trainer = trainer_cls(model=model, args=_args(out), train_dataset=_data(20, seed=5),
                          eval_dataset=_data(8, seed=6), callbacks=callbacks)
    try:
        trainer.train(resume_from_checkpoint=resume)
    finally:
        if signal_ is not None:
            signal_.undo()
    return trainer


def _write(path: str, value) -> None:
    with open(path, "w") as f:
        json.dump(value, f)


def _run_case(work: str, case: dict) -> None:
    folder = os.path.join(work, case["name"])
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, "out")
    plan = case["signals"][RANK]
    signalled = _train(out, _Signal(*plan) if plan else None)
    record = {"global_step": signalled.state.global_step, "stopped": signalled.flow.jit.stopped,
              "handler": repr(signal.getsignal(signal.SIGTERM))}
    # The processes meet here, so rank 0's rotation after the last save is done before anyone looks at out.
    stopped = torch.tensor(int(record["stopped"]))
    torch.distributed.all_reduce(stopped, op=torch.distributed.ReduceOp.MAX)
    last = hf_lightning.get_last_checkpoint(out)
    record["folders"] = sorted(os.listdir(out))
    record["last"] = last
    if last is not None:
        record["checkpoint_files"] = sorted(os.listdir(last))
        with open(os.path.join(last, "trainer_state.json")) as f:
            state = json.load(f)
        record["checkpoint_step"] = state["global_step"]
        record["checkpoint_log_history"] = state["log_history"]
    torch.distributed.barrier()
    if stopped.item():
        # A stopped run (on any process): resume from the newest checkpoint and train to the end.
        finished = _train(out, resume=last)
    else:
        finished = signalled  # the SIGTERM came too late (or never): a complete run
    weights = _full_weights(finished.model)
    record["final_step"] = finished.state.global_step
    _write(os.path.join(folder, f"rank{RANK}.json"), record)
    if RANK == 0:
        _write(os.path.join(folder, "result.json"), {"signalled": signalled.state.log_history,
                                                      "finished": finished.state.log_history})
        torch.save(weights, os.path.join(folder, "weights.pt"))


class _SavesExtraFile(hf_lightning.Trainer):
    """HF's documented pattern: ``_save`` lets the base class write the model, then adds a file of its own."""

    calls: list = []

    def _save(self, output_dir=None, state_dict=None):
        self.calls.append({"rank": RANK, "folder": os.path.basename(output_dir),
                           "state_dict": None if state_dict is None else len(state_dict)})
        super()._save(output_dir, state_dict=state_dict)
        if self.args.should_save:
            with open(os.path.join(output_dir, "extra.txt"), "w") as f:
                f.write(f"step {self.state.global_step}\n")


def _run_save_override(work: str) -> None:
    out = os.path.join(work, "override")
    trainer = _train(out, trainer_cls=_SavesExtraFile)
    trainer.save_model(os.path.join(out, "final"))
    weights = _full_weights(trainer.model)
    _write(os.path.join(out, f"calls{RANK}.json"), trainer.calls)
    if RANK == 0:
        torch.save(weights, os.path.join(out, "weights.pt"))


def main() -> int:
    work, plan_path = sys.argv[1:3]
    with open(plan_path) as f:
        plan = json.load(f)
    # For the test: the processes to kill if this launch deadlocks (torchrun starts each in a session of its own).
    _write(os.path.join(work, f"pid-{RANK}"), os.getpid())
    jit_checkpoint.KILL_WAIT_SECONDS = 0.0
    for case in plan["cases"]:
        _run_case(work, case)
    reference = _train(os.path.join(work, "reference", "out"))
    weights = _full_weights(reference.model)
    if RANK == 0:
        _write(os.path.join(work, "reference", "result.json"), {"log_history": reference.state.log_history})
        torch.save(weights, os.path.join(work, "reference", "weights.pt"))
    if plan.get("save_override"):
        _run_save_override(work)
    reference.end()
    return 0


if __name__ == "__main__":
    # As tests/helpers/torchrun.run_then_exit: no teardown of torch's objects (a gloo destructor can deadlock).
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
