"""Run by test_eval_shards.py, under torchrun or plainly (the one-process reference).

usage: eval_shard_script.py <output_dir> <result prefix> [fsdp]

Every process writes ``<result prefix>.<rank>.pkl``: what each evaluation phase returned and handed to
``compute_metrics``, and which examples this process read from each eval set in each phase. The test runs the
one-process reference in its own process through :func:`run`. With ``fsdp``, the processes run every phase under
FSDP2 (``fsdp_config`` version 2), so each forward gathers the parameters from both processes.
"""

import os
import pickle
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tests.helpers.models import READS, DictDataset, RecordingDataset, lm_data, pad_collator, padded_lm_data, tiny_gpt2  # noqa: E402
from tests.helpers.torchrun import run_then_exit  # noqa: E402


def numpy_tree(value):
    if isinstance(value, (list, tuple)):
        return type(value)(numpy_tree(v) for v in value)
    if isinstance(value, dict):
        return {k: numpy_tree(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return value


def run(out, fsdp=False):
    """Every phase's results, and the trainers (kept alive by the caller, see the bottom of the file)."""
    import torchmetrics
    from torchmetrics.classification import MulticlassAccuracy

    import hf_lightning as lib

    train = DictDataset([{k: v.tolist() for k, v in row.items()} for row in lm_data(n_train=16, n_eval=0)[0].rows])
    # 11 variable-length rows: the two shares (6 and 5) fall on batch boundaries of 3, so every batch is a
    # one-process batch. 10 fixed-length rows: shares [0-2] [3 4] and [5] [6-8] [9], so the batch [3, 4, 5] is split
    # between the processes and process 0 runs one batch fewer.
    var = RecordingDataset(padded_lm_data(n=11).rows, "var")
    fixed_rows = [{k: v.tolist() for k, v in row.items()} for row in lm_data(n_train=0, n_eval=10, seed=7)[1].rows]
    fixed = RecordingDataset(fixed_rows, "fixed")
    results, calls = {}, []

    def compute_metrics(pred):
        calls.append(numpy_tree({"predictions": pred.predictions, "label_ids": pred.label_ids,
                                 "inputs": pred.inputs, "losses": pred.losses}))
        batches = pred.predictions if isinstance(pred.predictions, list) else [pred.predictions]
        return {"mean_logit": float(np.mean([batch.mean() for batch in batches])), "rows": int(len(pred.label_ids))}

    class Tokens(torchmetrics.Metric):
        # A sum: double-counted examples would show.
        def __init__(self):
            super().__init__()
            self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

        def update(self, preds, target):
            self.count += (target != -100).sum()

        def compute(self):
            return self.count

    def args(**kw):
        # The same global training batch (8) on one process and on two.
        base = dict(output_dir=out, per_device_train_batch_size=8 // int(os.environ.get("WORLD_SIZE", "1")), per_device_eval_batch_size=3, max_steps=1,
                    learning_rate=0.0, eval_strategy="steps", eval_steps=1, save_strategy="no", logging_steps=1,
                    report_to="none", use_cpu=True, disable_tqdm=True, seed=42,
                    include_for_metrics=["inputs", "loss"])
        if fsdp:
            base.update(fsdp=True, fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": ["GPT2Block"]})
        base.update(kw)
        return lib.TrainingArguments(**base)

    def phase(name, run):
        READS.clear()
        calls.clear()
        value = run()
        results[name] = {"value": numpy_tree(value), "calls": list(calls), "reads": dict(READS)}

    model = tiny_gpt2()
    streaming = {"tokens": Tokens(), "accuracy": MulticlassAccuracy(num_classes=100, ignore_index=-100)}
    trainer = lib.Trainer(model=model, args=args(), train_dataset=train, eval_dataset={"var": var, "fixed": fixed},
                          data_collator=pad_collator, compute_metrics=compute_metrics, metrics=streaming)

    def logged_evals():
        trainer.train()
        return [e for e in trainer.state.log_history if any(k.startswith("eval_") for k in e)]

    phase("train", logged_evals)
    phase("evaluate", lambda: trainer.evaluate())
    phase("predict", lambda: tuple(trainer.predict(var)))

    listed = lib.Trainer(model=model, args=args(eval_strategy="no", eval_do_concat_batches=False,
                                             eval_accumulation_steps=2),
                         data_collator=pad_collator, compute_metrics=compute_metrics)
    phase("evaluate_lists", lambda: listed.evaluate(fixed))
    phase("predict_lists", lambda: tuple(listed.predict(fixed)))

    totals = {}

    def batch_metrics(pred, compute_result):
        for key, value in (("rows", len(pred.label_ids)), ("loss_sum", float(pred.losses.sum())),
                           ("label_sum", int((pred.label_ids * (pred.label_ids != -100)).sum()))):
            totals[key] = totals.get(key, 0) + value
        if compute_result:
            result, _ = dict(totals), totals.clear()
            return result
        return {}

    batched = lib.Trainer(model=model, args=args(eval_strategy="no", batch_eval_metrics=True,
                                              include_for_metrics=["loss"]),
                          data_collator=pad_collator, compute_metrics=batch_metrics)
    phase("batch_metrics", lambda: batched.evaluate(var))

    # load_best_model_at_end: the best checkpoint is the first (this learning rate overshoots: the loss goes up), so
    # evaluate() after training reports its weights, loaded into the (sharded) model, not the last step's.
    best = lib.Trainer(model=tiny_gpt2(), args=args(max_steps=2, learning_rate=0.05, save_strategy="steps",
                                                   save_steps=1, load_best_model_at_end=True,
                                                   metric_for_best_model="loss", greater_is_better=False,
                                                   include_for_metrics=[]),
                       train_dataset=train, eval_dataset=fixed, data_collator=pad_collator)

    def best_model_evaluation():
        best.train()
        evals = [e["eval_loss"] for e in best.state.log_history if "eval_loss" in e]
        return {"evals": evals, "best": os.path.basename(best.state.best_model_checkpoint),
                "after": best.evaluate()}

    phase("best", best_model_evaluation)

    return results, (trainer, listed, batched, best, model)


def main():
    out, prefix = sys.argv[1:3]
    results, kept = run(out, fsdp="fsdp" in sys.argv[3:])
    with open(f"{prefix}.{os.environ.get('RANK', '0')}.pkl", "wb") as f:
        pickle.dump({"world": int(os.environ.get("WORLD_SIZE", "1")), "results": results,
                     "model_class": type(kept[0].model).__name__}, f)
    kept[0].end()
    return kept


if __name__ == "__main__":
    run_then_exit(main)  # see run_then_exit: no teardown of torch's objects
