"""Run by the FSDP tests under torchrun: one FSDP2 training run of transformers' Trainer or ours.

usage: fsdp_script.py <lib: hf|hf_fsdp|ours> <output_dir> <result.json> [max_steps=N] [ga=N] [sdt=FULL|SHARDED] [resume]
    [evaluate] [save_model=DIR]
    [fsdp=0]   (fsdp=0: no fsdp arguments, a plain run, e.g. one process resuming an FSDP checkpoint)
    [dropout=0] [bf16] [ac] [offload]   (no dropout; bf16 mixed precision; fsdp_config activation_checkpointing;
    fsdp_config cpu_offload)
    [best] [lr=X]   (load_best_model_at_end on eval_loss, lower is better; the learning rate)
    [pc=R,S]   (ours only: parallelism_config=ParallelismConfig(dp_replicate_size=R, dp_shard_size=S))

The data has rows of different lengths, so each process's window holds a different number of label tokens and
``num_items_in_batch`` must be summed across processes (``average_tokens_across_devices``). Dropout is on.
"""

import json
import os
import sys

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tests.helpers.models import pad_collator, padded_lm_data  # noqa: E402
from tests.helpers.torchrun import run_then_exit  # noqa: E402


def _model(dropout=0.1):
    from transformers import GPT2Config, GPT2LMHeadModel, set_seed

    set_seed(42)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96, n_positions=16, resid_pdrop=dropout,
                        embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def _full_weights(model):
    if hasattr(model, "reshard"):  # an FSDP2 module: gather the shards (a collective, on every process)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return model.state_dict()


def main():
    lib_name, out, result = sys.argv[1:4]
    opts = dict(arg.split("=", 1) for arg in sys.argv[4:] if "=" in arg)
    resume = "resume" in sys.argv[4:]
    if lib_name == "hf_fsdp":  # transformers' real FSDP2 code on the CPU processes (see tests/helpers/hf_fsdp.py)
        from tests.helpers.hf_fsdp import accelerate_fsdp_on_cpu

        accelerate_fsdp_on_cpu()
    if lib_name.startswith("hf"):
        import transformers as lib
    else:
        import hf_lightning as lib
    train = padded_lm_data(n=40, seed=1)
    evald = padded_lm_data(n=10, seed=2)
    fsdp = {}
    if opts.get("fsdp", "1") == "1":
        fsdp = {"fsdp": True, "fsdp_config": {
            "version": 2, "transformer_layer_cls_to_wrap": ["GPT2Block"],
            "state_dict_type": f"{opts.get('sdt', 'FULL')}_STATE_DICT",
            "activation_checkpointing": "ac" in sys.argv[4:], "cpu_offload": "offload" in sys.argv[4:]}}
    world = int(os.environ.get("WORLD_SIZE", "1"))
    best = {"load_best_model_at_end": True, "metric_for_best_model": "eval_loss",
            "greater_is_better": False} if "best" in sys.argv[4:] else {}
    if "pc" in opts:
        from accelerate.parallelism_config import ParallelismConfig

        replicate, shard = (int(n) for n in opts["pc"].split(","))
        fsdp["parallelism_config"] = ParallelismConfig(dp_replicate_size=replicate, dp_shard_size=shard)
    args = lib.TrainingArguments(
        output_dir=out, per_device_train_batch_size=int(opts.get("batch", 4 if world > 1 else 8)),
        per_device_eval_batch_size=4, gradient_accumulation_steps=int(opts.get("ga", 2)),
        max_steps=int(opts.get("max_steps", 4)), logging_steps=1, eval_strategy="steps", eval_steps=2,
        save_steps=2, save_total_limit=2, learning_rate=float(opts.get("lr", 3e-3)), max_grad_norm=0.5,
        report_to="none", use_cpu=True, disable_tqdm=True, seed=42, bf16="bf16" in sys.argv[4:], **best, **fsdp,
    )
    model = _model(float(opts.get("dropout", 0.1)))
    trainer = lib.Trainer(model=model, args=args, train_dataset=train, eval_dataset=evald,
                          data_collator=pad_collator)
    if lib_name.startswith("hf"):
        from transformers.trainer_utils import get_last_checkpoint
    else:
        get_last_checkpoint = lib.get_last_checkpoint
    last = get_last_checkpoint(out) if resume else None
    trainer.train(resume_from_checkpoint=last)
    metrics = trainer.evaluate() if "evaluate" in sys.argv[4:] else None
    meshes = sorted({tuple(p.device_mesh.shape) for p in trainer.model.parameters() if hasattr(p, "device_mesh")})
    weights = _full_weights(trainer.model)
    rank = int(os.environ.get("RANK", "0"))
    if "save_model" in opts:
        trainer.save_model(opts["save_model"])
    if rank == 0:
        with open(result, "w") as f:
            json.dump({"log_history": trainer.state.log_history, "world": world,
                       "weights": {k: v.tolist() for k, v in weights.items()},
                       "model_class": type(trainer.model).__name__, "eval": metrics,
                       "best_model_checkpoint": trainer.state.best_model_checkpoint,
                       "strategy": type(trainer._pl_trainer.strategy).__name__ if lib_name == "ours" else None,
                       "meshes": meshes}, f)
    return trainer, model


if __name__ == "__main__":
    run_then_exit(main)  # see run_then_exit: no teardown of torch's objects
