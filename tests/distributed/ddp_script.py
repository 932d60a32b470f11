"""Run by the DDP tests under torchrun (or plainly for one process).

usage: ddp_script.py <lib: hf|ours|user> <output_dir> <result.json> <per_device_batch> <max_steps> [resume] [ga=N]

``user`` trains hf_lightning's pieces in a ``lightning.Trainer`` built as a Lightning user would (no
``build_lightning_trainer``).
"""

import json
import os
import sys

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tests.helpers.models import lm_data, tiny_gpt2  # noqa: E402
from tests.helpers.torchrun import run_then_exit  # noqa: E402


def main():
    lib_name, out, result, batch, max_steps = sys.argv[1:6]
    resume = "resume" in sys.argv[6:]
    ga = next((int(arg[3:]) for arg in sys.argv[6:] if arg.startswith("ga=")), 1)
    if lib_name == "hf":
        import transformers as lib
    else:
        import hf_lightning as lib
    if lib_name == "user":
        return _user_built(lib, out, result, batch, max_steps)
    train, evald = lm_data(n_train=48, n_eval=10)
    args = lib.TrainingArguments(
        output_dir=out, per_device_train_batch_size=int(batch), per_device_eval_batch_size=4,
        gradient_accumulation_steps=ga, max_steps=int(max_steps), logging_steps=1, eval_strategy="steps",
        eval_steps=3, save_steps=3, save_total_limit=2, learning_rate=3e-3, report_to="none", use_cpu=True,
        disable_tqdm=True, seed=42,
    )
    model = tiny_gpt2()
    trainer = lib.Trainer(model=model, args=args, train_dataset=train, eval_dataset=evald)
    last = lib.get_last_checkpoint(out) if resume else None
    trainer.train(resume_from_checkpoint=last)
    metrics = trainer.evaluate()
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        weights = {k: v.tolist() for k, v in model.state_dict().items()}
        with open(result, "w") as f:
            json.dump({"log_history": trainer.state.log_history, "eval": metrics, "weights": weights,
                       "world": int(os.environ.get("WORLD_SIZE", "1"))}, f)
    # HF's documented last call of a distributed script: destroy the process group, so no gloo thread is still
    # running when the interpreter exits (which aborts the process).
    trainer.end()
    return trainer, model


def _user_built(lib, out, result, batch, max_steps):
    import lightning.pytorch as pl

    train, evald = lm_data(n_train=48, n_eval=10)
    args = lib.TrainingArguments(
        output_dir=out, per_device_train_batch_size=int(batch), per_device_eval_batch_size=4, max_steps=int(max_steps),
        logging_steps=1, eval_strategy="steps", eval_steps=3, save_steps=3, save_total_limit=2, learning_rate=3e-3,
        report_to="none", use_cpu=True, disable_tqdm=True, seed=42,
    )
    model = tiny_gpt2()
    module = lib.HFLightningModule(model, args)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto",
                         enable_checkpointing=False, logger=False, enable_progress_bar=False,
                         enable_model_summary=False)
    datamodule = lib.HFDataModule(args, train_dataset=train, eval_dataset=evald)
    trainer.fit(module, datamodule=datamodule)
    # A plain validate() is reported as HF's evaluate() (logged into log_history).
    metrics = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
    if int(os.environ.get("RANK", "0")) == 0:
        weights = {k: v.tolist() for k, v in model.state_dict().items()}
        with open(result, "w") as f:
            json.dump({"log_history": module.trainer_state.log_history, "eval": metrics, "weights": weights,
                       "world": trainer.world_size}, f)
    return trainer, model


if __name__ == "__main__":
    run_then_exit(main)  # see run_then_exit: no teardown of torch's objects
