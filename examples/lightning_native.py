#!/usr/bin/env python
"""The Lightning-native path: HF's training semantics inside a plain ``lightning.Trainer``.

The same review classification as ``run_glue.py`` (a small BERT built from a config, the bundled
``examples/data/classification`` data, a word-level tokenizer trained at start-up), but assembled from Lightning
parts instead of the HF-style ``Trainer``:

- ``build_lightning_trainer(args, callbacks=[...])``: a ``lightning.Trainer`` configured from ``TrainingArguments``
  (HF's logging / evaluation / save cadence, ``checkpoint-N`` folders, rotation, TensorBoard), with a Lightning
  callback of our own (:class:`ThroughputMonitor`) and any other ``lightning.Trainer`` keyword;
- ``HFLightningModule``: the ``LightningModule`` around the HF model, subclassed here to add a ``predict_step``;
  evaluation metrics stream through ``torchmetrics`` (accuracy, macro F1) instead of gathering every logit;
- ``HFDataModule``: the ``LightningDataModule`` with HF's collator, column filtering and seeded sampling;
- ``trainer.fit(module, datamodule=dm, ckpt_path=<checkpoint-N folder>)`` resumes like HF's
  ``train(resume_from_checkpoint=...)``.

The script keeps HF's example shape (``HfArgumentParser`` over three dataclasses, ``get_last_checkpoint``,
``--do_train`` / ``--do_eval`` / ``--do_predict``, ``*_results.json`` and ``trainer_state.json``).

Run (needs the ``examples`` extra: ``pip install -e ".[examples]"``)::

    python examples/lightning_native.py --output_dir out/native --do_train --do_eval --do_predict \\
        --num_train_epochs 3 --learning_rate 1e-3 --eval_strategy epoch --save_strategy epoch --save_total_limit 1
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field

import lightning.pytorch as pl
import torch
from offline_utils import (
    DATA_DIR,
    load_or_train_tokenizer,
    parse_arguments,
    require_transformers,
    setup_logging,
    train_word_level,
)

from hf_lightning import (
    DataCollatorWithPadding,
    HFDataModule,
    HfArgumentParser,
    HFLightningModule,
    TrainingArguments,
    build_lightning_trainer,
    get_last_checkpoint,
)
from hf_lightning.callbacks.training_flow import HFFlowCallback

logger = logging.getLogger("lightning_native")


@dataclass
class ModelArguments:
    """The model, built from a config (nothing is downloaded)."""

    model_type: str = field(default="bert", metadata={"help": "The model type to build from scratch."})
    config_overrides: str | None = field(
        default="hidden_size=64,num_hidden_layers=2,num_attention_heads=2,intermediate_size=128,"
        "max_position_embeddings=128",
        metadata={"help": "Config values, as 'key=value,key=value'."},
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where `datasets` keeps its processed files."})


@dataclass
class DataTrainingArguments:
    """The labelled data: ``.jsonl`` rows with ``sentence`` and ``label``."""

    train_file: str = field(default=str(DATA_DIR / "classification" / "train.jsonl"), metadata={"help": ".jsonl"})
    validation_file: str = field(default=str(DATA_DIR / "classification" / "validation.jsonl"),
                                 metadata={"help": ".jsonl"})
    test_file: str = field(default=str(DATA_DIR / "classification" / "test.jsonl"), metadata={"help": ".jsonl"})
    max_seq_length: int = field(default=64, metadata={"help": "Longer inputs are truncated."})


class ThroughputMonitor(pl.Callback):
    """A Lightning callback of the user's own: optimizer steps and samples per second, printed at the end.

    With hf_lightning, one Lightning training batch is one optimizer step (the gradient-accumulation window of
    micro-batches), so ``on_train_batch_end`` fires once per HF step and ``trainer.global_step`` is HF's
    ``state.global_step``.
    """

    def __init__(self) -> None:
        self.samples = 0
        self.steps = 0
        self.started = 0.0
        self.summary: dict[str, float] = {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.samples, self.steps, self.started = 0, 0, time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # `batch` is the window: a list of micro-batches.
        self.samples += sum(len(micro["input_ids"]) for micro in batch)
        self.steps += 1

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        self.summary = {"steps": self.steps, "samples": self.samples, "global_step": trainer.global_step,
                        "steps_per_second": self.steps / elapsed, "samples_per_second": self.samples / elapsed}
        print(f"[ThroughputMonitor] {self.steps} optimizer steps, {self.samples} samples, "
              f"{self.summary['samples_per_second']:.1f} samples/s (global_step {trainer.global_step})")


class ReviewClassifier(HFLightningModule):
    """``HFLightningModule`` plus a ``predict_step``: the class id of each row, for ``trainer.predict``."""

    def predict_step(self, batch: dict, batch_idx: int) -> dict[str, torch.Tensor]:
        inputs = {key: value for key, value in batch.items() if key != "labels"}
        predictions = self.model(**inputs).logits.argmax(dim=-1)
        return {"predictions": predictions, "labels": batch.get("labels")}


def build_model(model_args: ModelArguments, tokenizer, label_list: list[str]):
    from transformers import CONFIG_MAPPING, AutoModelForSequenceClassification

    label2id = {label: index for index, label in enumerate(label_list)}
    config = CONFIG_MAPPING[model_args.model_type](
        num_labels=len(label_list), label2id=label2id, id2label={i: label for label, i in label2id.items()}
    )
    if model_args.config_overrides:
        config.update_from_string(model_args.config_overrides)
    config.vocab_size = len(tokenizer)
    config.pad_token_id = tokenizer.pad_token_id
    return AutoModelForSequenceClassification.from_config(config)


def streaming_metrics(num_classes: int) -> dict:
    """``torchmetrics`` updated per evaluation batch (reported as ``eval_accuracy`` / ``eval_f1``)."""
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

    return {"accuracy": MulticlassAccuracy(num_classes=num_classes, average="micro"),
            "f1": MulticlassF1Score(num_classes=num_classes, average="macro")}


def write_metrics(output_dir: str, split: str, metrics: dict) -> None:
    """Print and save ``metrics`` as HF's ``log_metrics`` / ``save_metrics`` do (``{split}_results.json``)."""
    print(f"***** {split} metrics *****")
    width = max((len(key) for key in metrics), default=0)
    for key in sorted(metrics):
        value = metrics[key]
        print(f"  {key: <{width}} = {round(value, 4) if isinstance(value, float) else value:>9}")
    with open(os.path.join(output_dir, f"{split}_results.json"), "w") as f:
        json.dump(metrics, f, indent=4, sort_keys=True)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the script; returns the train / eval / predict metrics."""
    require_transformers()
    import datasets

    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parse_arguments(parser, argv)
    setup_logging(training_args, logger)
    if training_args.do_eval and not training_args.do_train:
        raise ValueError("lightning_native.py evaluates the model it has just trained: add --do_train, or use "
                         "run_glue.py --model_name_or_path <folder> --do_eval to evaluate a saved model.")

    last_checkpoint = None
    if os.path.isdir(training_args.output_dir) and training_args.do_train:
        last_checkpoint = get_last_checkpoint(training_args.output_dir)
        if last_checkpoint is not None and training_args.resume_from_checkpoint is None:
            logger.info("Checkpoint detected, resuming training at %s.", last_checkpoint)

    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    raw_datasets = datasets.load_dataset("json", data_files=files, cache_dir=model_args.cache_dir)
    label_list = sorted(set(raw_datasets["train"]["label"]))
    checkpoint = training_args.resume_from_checkpoint or last_checkpoint
    tokenizer = load_or_train_tokenizer(
        None, [checkpoint],
        lambda: train_word_level(raw_datasets["train"]["sentence"], ["[PAD]", "[UNK]", "[CLS]", "[SEP]"],
                                 unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]"),
    )

    def preprocess(examples):
        result = tokenizer(examples["sentence"], max_length=data_args.max_seq_length, truncation=True)
        result["label"] = [label_list.index(label) for label in examples["label"]]
        return result

    tokenized = raw_datasets.map(preprocess, batched=True, desc="Running tokenizer on dataset")

    # build_lightning_trainer seeds (args.seed) as HF's Trainer does, so build it before the model.
    throughput = ThroughputMonitor()
    trainer = build_lightning_trainer(training_args, callbacks=[throughput])
    model = build_model(model_args, tokenizer, label_list)
    module = ReviewClassifier(model, training_args, metrics=streaming_metrics(len(label_list)))
    datamodule = HFDataModule(
        training_args,
        train_dataset=tokenized["train"] if training_args.do_train else None,
        # do_eval is also on whenever eval_strategy evaluates during training (HF's rule).
        eval_dataset=tokenized["validation"] if training_args.do_eval else None,
        test_dataset=tokenized["test"] if training_args.do_predict else None,
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
    )
    # HF's state (log_history, best metric) lives in the flow callback build_lightning_trainer installed.
    flow = next(callback for callback in trainer.callbacks if isinstance(callback, HFFlowCallback))

    results: dict[str, float] = {}
    if training_args.do_train:
        trainer.fit(module, datamodule=datamodule, ckpt_path=checkpoint)
        model.save_pretrained(training_args.output_dir)
        tokenizer.save_pretrained(training_args.output_dir)
        metrics = dict(flow.train_output.metrics, train_samples=len(tokenized["train"]))
        write_metrics(training_args.output_dir, "train", metrics)
        flow.state.save_to_json(os.path.join(training_args.output_dir, "trainer_state.json"))
        results.update(metrics)

    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        # HF's evaluation (Lightning's validation loop over the eval set), logged into log_history.
        metrics = dict(flow.evaluate(), eval_samples=len(tokenized["validation"]))
        write_metrics(training_args.output_dir, "eval", metrics)
        results.update(metrics)

    if training_args.do_predict:
        logger.info("*** Predict ***")
        outputs = trainer.predict(module, dataloaders=datamodule.test_dataloader())
        predictions = torch.cat([output["predictions"] for output in outputs])
        labels = torch.cat([output["labels"] for output in outputs])
        metrics = {"predict_accuracy": float((predictions == labels).float().mean()),
                   "predict_samples": len(predictions)}
        write_metrics(training_args.output_dir, "predict", metrics)
        with open(os.path.join(training_args.output_dir, "predict_results.txt"), "w") as writer:
            writer.write("index\tprediction\n")
            for index, item in enumerate(predictions.tolist()):
                writer.write(f"{index}\t{label_list[item]}\n")
        results.update(metrics)

    results["throughput_global_step"] = throughput.summary.get("global_step", 0)
    return results


if __name__ == "__main__":
    main()
