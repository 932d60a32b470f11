"""Run by the tensor-parallel test: one training run of transformers' Trainer (one process, the whole model) or
ours (``parallelism_config=ParallelismConfig(tp_size=2)`` under torchrun, the model loaded with ``tp_plan="auto"``).

usage: tp_script.py <lib: hf|ours> <model_dir> <output_dir> <result.json> [save_model=DIR]

Llama has no dropout, so the two runs see the same numbers: both processes of the tensor-parallel group train on
the same batches (the one-process run's), each on half of every sharded layer.
"""

import json
import os
import sys

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tests.helpers.models import pad_collator, padded_lm_data  # noqa: E402
from tests.helpers.torchrun import run_then_exit  # noqa: E402


def save_tiny_llama(folder):
    from transformers import LlamaConfig, LlamaForCausalLM, set_seed

    set_seed(42)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    LlamaForCausalLM(config).save_pretrained(folder)


def _full_weights(model):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if any(hasattr(p, "device_mesh") for p in model.parameters()):  # a collective, on every process
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return model.state_dict()


def main():
    lib_name, model_dir, out, result = sys.argv[1:5]
    opts = dict(arg.split("=", 1) for arg in sys.argv[5:] if "=" in arg)
    from transformers import LlamaForCausalLM

    extra = {}
    if lib_name == "hf":
        import transformers as lib

        model = LlamaForCausalLM.from_pretrained(model_dir)
    else:
        import hf_lightning as lib
        from accelerate.parallelism_config import ParallelismConfig

        model = LlamaForCausalLM.from_pretrained(model_dir, tp_plan="auto")
        extra["parallelism_config"] = ParallelismConfig(tp_size=2)
    args = lib.TrainingArguments(
        output_dir=out, per_device_train_batch_size=4, per_device_eval_batch_size=4, gradient_accumulation_steps=2,
        max_steps=4, logging_steps=1, eval_strategy="steps", eval_steps=2, save_steps=2, save_total_limit=2,
        learning_rate=3e-3, max_grad_norm=0.5, report_to="none", use_cpu=True, disable_tqdm=True, seed=42, **extra,
    )
    trainer = lib.Trainer(model=model, args=args, train_dataset=padded_lm_data(n=40, seed=1),
                          eval_dataset=padded_lm_data(n=10, seed=2), data_collator=pad_collator)
    trainer.train()
    weights = _full_weights(trainer.model)
    if "save_model" in opts:
        trainer.save_model(opts["save_model"])
    if int(os.environ.get("RANK", "0")) == 0:
        strategy = type(trainer._pl_trainer.strategy).__name__ if lib_name == "ours" else None
        with open(result, "w") as f:
            json.dump({"log_history": trainer.state.log_history, "strategy": strategy,
                       "weights": {k: v.tolist() for k, v in weights.items()}}, f)
    return trainer


if __name__ == "__main__":
    run_then_exit(main)  # see run_then_exit: no teardown of torch's objects
