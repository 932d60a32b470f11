"""Run by test_seq2seq_fsdp.py: a tiny T5 (tied embeddings, dropout on) trained and evaluated with
``predict_with_generate`` by transformers' Seq2SeqTrainer or ours, under torchrun (FSDP2) or in one process.

usage: seq2seq_fsdp_script.py <lib: hf|ours> <output_dir> <result prefix> [fsdp=0] [save_model=DIR]
       (fsdp=0: DDP)
       seq2seq_fsdp_script.py ours <output_dir> <result prefix> reference=DIR   (one process, no training: the
       weights saved in DIR by a 2-process run, evaluated and predicted; the test runs it in its own process)

Phases: ``train()`` (4 steps, GA 2, generate-based evaluation at steps 2 and 4, ``checkpoint-4``), ``evaluate()``,
``predict()`` on the eval set. Every process writes ``<result prefix>.<rank>.json``: ``log_history``, the full
final weights, ``evaluate()``'s metrics, ``predict()``'s outputs and metrics, the eval rows this process read per
phase, and the shape of every ``generate`` output it produced per phase (with the ``synced_gpus`` it was called
with).

The data makes the processes' generations end at different steps: the model's generation config stops at any of
several end tokens (``eos_token_id`` is a list), so rows stop after different numbers of tokens, and a batch ends
when its last row does. The 13 eval rows (eval batch 4) are not a multiple of 2 and, sharded, give process 0 two
batches ([0-3] [4-6]) and process 1 three ([7] [8-11] [12]). The targets all have 5 tokens, so a one-process batch
split between the processes ([4-7]) has the same loss and the same label padding either way (sharded evaluation
recombines a split batch's loss as the sample-weighted mean of its parts); the sources' lengths differ.
"""

import json
import os
import sys

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tests.helpers.models import READS, DictDataset, RecordingDataset  # noqa: E402
from tests.helpers.torchrun import run_then_exit  # noqa: E402

VOCAB = 48
PAD, EOS = 0, 1
# Generation stops at any of these: an untrained model emits one after a few steps, a different number per row.
STOP_TOKENS = list(range(1, 13))
MAX_LENGTH = 10
GENERATED: list[dict] = []


def rows(n, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        src = torch.randint(13, VOCAB, (int(torch.randint(2, 8, (1,), generator=g)),), generator=g).tolist()
        tgt = torch.randint(13, VOCAB, (4,), generator=g).tolist()
        out.append({"input_ids": src + [EOS], "labels": tgt + [EOS]})
    return out


def collate(features):
    width = max(len(f["input_ids"]) for f in features)
    label_width = max(len(f["labels"]) for f in features)
    return {
        "input_ids": torch.tensor([f["input_ids"] + [PAD] * (width - len(f["input_ids"])) for f in features]),
        "attention_mask": torch.tensor([[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"]))
                                        for f in features]),
        "labels": torch.tensor([f["labels"] + [-100] * (label_width - len(f["labels"])) for f in features]),
    }


def tiny_t5():
    from transformers import T5Config, T5ForConditionalGeneration, set_seed

    set_seed(42)
    config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                      num_heads=4, dropout_rate=0.1, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD)
    model = T5ForConditionalGeneration(config)
    model.generation_config.eos_token_id = STOP_TOKENS
    return model


def record_generate():
    """Wrap T5's ``generate`` (the class's, so FSDP's registered forward method calls it) to record each output;
    returns the function that puts the original back."""
    from transformers import T5ForConditionalGeneration

    original = T5ForConditionalGeneration.generate

    def restore():
        T5ForConditionalGeneration.generate = original

    def generate(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        GENERATED.append({"rows": int(out.shape[0]), "length": int(out.shape[1]),
                          "synced_gpus": kwargs.get("synced_gpus")})
        return out

    T5ForConditionalGeneration.generate = generate
    return restore


def full_weights(model):
    if hasattr(model, "reshard"):  # FSDP2: gather the shards (a collective, on every process)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return model.state_dict()


def tolist(value):
    if value is None:
        return None
    if isinstance(value, tuple):
        return [tolist(v) for v in value]
    return value.tolist()


def run(lib_name, out, opts, world=1):
    """Train (unless ``reference``), evaluate and predict; the results and what is kept alive (see the bottom)."""
    fsdp = {}
    if world > 1 and opts.get("fsdp", "1") == "1":
        fsdp = {"fsdp": True, "fsdp_config": {"version": 2, "transformer_layer_cls_to_wrap": ["T5Block"]}}
    if lib_name == "hf":
        import transformers as lib

        if fsdp:
            from tests.helpers.hf_fsdp import accelerate_fsdp_on_cpu

            accelerate_fsdp_on_cpu()
    else:
        import hf_lightning as lib
    restore = record_generate()
    args = lib.Seq2SeqTrainingArguments(
        output_dir=out, per_device_train_batch_size=4 if world > 1 else 8, per_device_eval_batch_size=4,
        gradient_accumulation_steps=2, max_steps=4, logging_steps=1, eval_strategy="steps", eval_steps=2,
        save_strategy="steps", save_steps=4, learning_rate=3e-3, max_grad_norm=0.5, report_to="none", use_cpu=True,
        disable_tqdm=True, seed=42, predict_with_generate=True, generation_max_length=MAX_LENGTH, **fsdp,
    )
    if "reference" in opts:
        # The one-process reference: the 2-process run's saved weights, read as a user would.
        from transformers import T5ForConditionalGeneration

        model = T5ForConditionalGeneration.from_pretrained(opts["reference"])
    else:
        model = tiny_t5()
    if lib_name == "hf" and fsdp:
        # accelerate 1.x cannot shard transformers 5.x's T5 as it is: encoder/decoder.embed_tokens are modules of
        # their own holding the tied `shared.weight`, left to the root group while `shared` goes to the tail group,
        # and torch refuses a parameter in two groups. Made the same module (transformers 4.x's layout), the
        # parameters and the groups are those ours builds, so HF's real FSDP2 code runs as the reference.
        model.encoder.embed_tokens = model.decoder.embed_tokens = model.shared
    train = DictDataset(rows(32, seed=1))
    evald = RecordingDataset(rows(13, seed=2), "eval")

    def compute_metrics(pred):
        # Generated tokens that are not padding: differs with any generated token or dropped/repeated row.
        tokens = [[t for t in row if t not in (PAD, -100)] for row in pred.predictions.tolist()]
        return {"generated_tokens": float(sum(len(t) for t in tokens)), "rows": float(len(tokens)),
                "token_sum": float(sum(sum(t) for t in tokens))}

    trainer = lib.Seq2SeqTrainer(model=model, args=args, train_dataset=train, eval_dataset=evald,
                                 data_collator=collate, compute_metrics=compute_metrics)
    result = {"world": world, "reads": {}, "generated": {}}
    phases = [("evaluate", trainer.evaluate), ("predict", lambda: trainer.predict(evald))]
    if "reference" not in opts:
        phases.insert(0, ("train", trainer.train))
    for phase, call in phases:
        READS.clear()
        GENERATED.clear()
        value = call()
        result["reads"][phase] = list(READS["eval"])
        result["generated"][phase] = list(GENERATED)
        if phase == "evaluate":
            result["evaluate"] = value
    result.update(
        log_history=trainer.state.log_history, model_class=type(trainer.model).__name__,
        predictions=tolist(value.predictions), label_ids=tolist(value.label_ids), predict_metrics=value.metrics,
        weights={k: v.tolist() for k, v in full_weights(trainer.model).items()},
    )
    if "save_model" in opts:
        trainer.save_model(opts["save_model"])
    restore()
    return result, (trainer, model)


def main():
    lib_name, out, prefix = sys.argv[1:4]
    opts = dict(arg.split("=", 1) for arg in sys.argv[4:] if "=" in arg)
    result, kept = run(lib_name, out, opts, world=int(os.environ.get("WORLD_SIZE", "1")))
    with open(f"{prefix}.{os.environ.get('RANK', '0')}.json", "w") as f:
        json.dump(result, f)
    return kept


if __name__ == "__main__":
    run_then_exit(main)  # see run_then_exit: no teardown of torch's objects
