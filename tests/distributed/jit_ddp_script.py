"""Run by the DDP SIGTERM test under torchrun: each rank sends itself SIGTERM at its own moment, inside a forward.

usage: jit_ddp_script.py <output_dir> <result_prefix> <rank0_forward> <rank1_forward>

Rank r signals itself inside its ``rank<r>_forward``-th training forward (0: never). Each rank writes
``<result_prefix>.<rank>.json`` with its step, whether it stopped on the SIGTERM, and the SIGTERM handler left
after training.
"""

import json
import os
import signal
import sys

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import hf_lightning  # noqa: E402
from hf_lightning.callbacks import jit_checkpoint  # noqa: E402
from tests.helpers.torchrun import run_then_exit  # noqa: E402
from tests.reliability._fuzz_worker import DropoutRegression, _data  # noqa: E402


def main():
    out, prefix, *forwards = sys.argv[1:]
    rank = int(os.environ.get("RANK", "0"))
    jit_checkpoint.KILL_WAIT_SECONDS = 0.0
    args = hf_lightning.TrainingArguments(
        output_dir=out, per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=12, logging_steps=3,
        save_steps=100, learning_rate=5e-2, seed=11, report_to="none", use_cpu=True, disable_tqdm=True,
        enable_jit_checkpoint=True,
    )
    model = DropoutRegression()
    left = [int(forwards[rank])]

    def inside_forward(module, inputs):
        if model.training:
            left[0] -= 1
            if left[0] == 0:
                os.kill(os.getpid(), signal.SIGTERM)

    model.inp.register_forward_pre_hook(inside_forward)
    trainer = hf_lightning.Trainer(model=model, args=args, train_dataset=_data(20, seed=5))
    trainer.train()
    with open(f"{prefix}.{rank}.json", "w") as f:
        json.dump({"global_step": trainer.state.global_step, "stopped": trainer.flow.jit.stopped,
                   "handler": repr(signal.getsignal(signal.SIGTERM))}, f)
    trainer.end()
    return trainer, model


if __name__ == "__main__":
    run_then_exit(main)  # see run_then_exit: no teardown of torch's objects
