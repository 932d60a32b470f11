"""An IterableDataset train and eval set under torchrun, run by test_iterable_dispatch.py (HF's or ours).

usage: dispatch_script.py <lib: hf|ours> <output_dir> <result.json> [dispatch=0] [split=1] [batch=N] [eval=0]
       [save=N] [resume=N (from output_dir/checkpoint-N)]

A stream of 19 rows whose rows draw from the global RNG as they are produced, a collator that draws, GPT-2 with
dropout, per-device batch 2, GA 2, 2 processes: process 0 reads 2 batches a round, the last round holds 3 rows
(completed from the first round). Two iterable eval sets, 8 rows (whole rounds) and 7 rows (a short last round),
evaluated every 2 steps and once more at the end from a fixed RNG state. Rank 0 also records the one-process
evaluation of the final model from that same RNG state (a plain loop over a DataLoader).
"""

import json
import os
import sys

import torch

from tests.helpers.models import NoisyStream, gpt2_dropout, noisy_collator
from tests.helpers.torchrun import run_then_exit

torch.set_num_threads(1)


def accuracy(pred):
    logits, labels = pred.predictions, pred.label_ids
    hits = (logits[:, :-1].argmax(-1) == labels[:, 1:]) & (labels[:, 1:] != -100)
    return {"hits": int(hits.sum()), "rows": int(labels.shape[0])}


def one_process_eval(model, datasets: dict) -> dict:
    """HF's one-process eval_loss for each set: the batch losses, each repeated batch-size times, averaged (the
    collator's random draws: the same as an evaluation's on process 0 after the same RNG reset)."""
    import numpy as np

    model.eval()
    metrics = {}
    for name, dataset in datasets.items():
        losses = []
        for batch in torch.utils.data.DataLoader(dataset, batch_size=2, collate_fn=noisy_collator):
            with torch.no_grad():
                # HF 5.x passes the batch's label count to the loss in evaluation too (GPT-2: unshifted labels).
                loss = model(**batch, num_items_in_batch=batch["labels"].ne(-100).sum()).loss
            losses.append(loss.repeat(batch["input_ids"].shape[0]).numpy())
        metrics[f"eval_{name}_loss"] = np.concatenate(losses).mean().item()
    return metrics


def main():
    lib_name, out, result = sys.argv[1:4]
    options = dict(arg.split("=") for arg in sys.argv[4:])
    if lib_name == "hf":
        import transformers as lib
    else:
        import hf_lightning as lib
    accelerator_config = {}
    if options.get("dispatch") == "0":
        accelerator_config["dispatch_batches"] = False
    if options.get("split") == "1":
        accelerator_config["split_batches"] = True
    args = lib.TrainingArguments(
        output_dir=out, per_device_train_batch_size=int(options.get("batch", 2)), per_device_eval_batch_size=2,
        gradient_accumulation_steps=2, max_steps=5, logging_steps=1, eval_steps=2,
        eval_strategy="no" if options.get("eval") == "0" else "steps",
        save_steps=int(options.get("save", 3)), learning_rate=3e-3, report_to="none", use_cpu=True,
        disable_tqdm=True, seed=42,
        remove_unused_columns=False, accelerator_config=accelerator_config,
    )
    model = gpt2_dropout()
    evals = {"even": NoisyStream(8), "odd": NoisyStream(7)}
    trainer = lib.Trainer(model=model, args=args, train_dataset=NoisyStream(19), eval_dataset=evals,
                          data_collator=noisy_collator, compute_metrics=accuracy)
    trainer.train(resume_from_checkpoint=f"{out}/checkpoint-{options['resume']}" if "resume" in options else None)
    torch.manual_seed(0)
    metrics = trainer.evaluate()
    rank = int(os.environ.get("RANK", "0"))
    # After the same RNG reset, the one-process evaluation; every process draws the same as any other here.
    torch.manual_seed(0)
    single = one_process_eval(model, evals)
    if rank == 0:
        weights = {k: v.tolist() for k, v in model.state_dict().items()}
        with open(result, "w") as f:
            json.dump({"log_history": trainer.state.log_history, "eval": metrics, "single": single,
                       "weights": weights, "world": int(os.environ.get("WORLD_SIZE", "1")),
                       "checkpoints": sorted(p for p in os.listdir(out) if p.startswith("checkpoint-"))}, f)
    return trainer, model


if __name__ == "__main__":
    run_then_exit(main)  # see run_then_exit: no teardown of torch's objects
