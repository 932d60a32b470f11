"""A tiny script shaped like the end of HF's ``examples/pytorch/run_*.py`` (train, save, metrics, state, evaluate,
model card). The test runs it as is (hf_lightning) and with the import below pointed at ``transformers``."""

import sys

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification

from hf_lightning import Trainer, TrainingArguments


def rows(n, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, 60, (8,), generator=g)
        out.append({"input_ids": ids, "attention_mask": torch.ones(8, dtype=torch.long), "labels": int(ids[0] > 30)})
    return out


def compute_metrics(p):
    return {"accuracy": float((np.argmax(p.predictions, -1) == p.label_ids).mean())}


def main(output_dir):
    torch.set_num_threads(1)
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, num_labels=2)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                             num_train_epochs=2, eval_strategy="epoch", logging_steps=2, save_strategy="no",
                             use_cpu=True, report_to="none", disable_tqdm=True, seed=3)
    trainer = Trainer(model=model, args=args, train_dataset=rows(16, 1), eval_dataset=rows(8, 2),
                      compute_metrics=compute_metrics)
    train_result = trainer.train()
    trainer.save_model()
    metrics = train_result.metrics
    metrics["train_samples"] = 16
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    metrics = trainer.evaluate()
    metrics["eval_samples"] = 8
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    kwargs = {"finetuned_from": "tiny-bert", "tasks": "text-classification", "dataset_tags": "glue",
              "dataset_args": "mrpc", "dataset": "GLUE MRPC", "language": "en"}
    trainer.create_model_card(**kwargs)


if __name__ == "__main__":
    main(sys.argv[1])
