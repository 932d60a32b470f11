#!/usr/bin/env python
"""Text classification with hf_lightning: HF's ``run_glue.py`` migrated, running offline.

A small BERT built from a config (no download) learns to label the bundled product reviews
(``examples/data/classification``, ``positive`` / ``negative``) with a word-level tokenizer trained on them at
start-up. HF's structure is kept: ``HfArgumentParser`` over three dataclasses, resuming from the last
``checkpoint-N``, ``--do_train`` / ``--do_eval`` / ``--do_predict``, accuracy and F1 from ``compute_metrics``,
``log_metrics`` / ``save_metrics`` / ``save_state``, and ``predict_results.txt``. Your own ``.jsonl`` / ``.csv``
files work too: a ``label`` column and one text column (``sentence``, or two: ``sentence1`` and ``sentence2``).

Run (needs the ``examples`` extra: ``pip install -e ".[examples]"``)::

    python examples/run_glue.py --output_dir out/glue --do_train --do_eval --do_predict --num_train_epochs 3 \\
        --learning_rate 1e-3 --eval_strategy epoch --save_strategy epoch --save_total_limit 1 --logging_steps 10
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np
from offline_utils import (
    DATA_DIR,
    accuracy_and_f1,
    load_or_train_tokenizer,
    parse_arguments,
    require_transformers,
    setup_logging,
    train_word_level,
)

from hf_lightning import (
    DataCollatorWithPadding,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
    get_last_checkpoint,
    set_seed,
)

logger = logging.getLogger("run_glue")


@dataclass
class ModelArguments:
    """Which model to train: built from ``--model_type`` and ``--config_overrides``, or a local folder."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A local folder written by save_pretrained (e.g. an earlier output_dir)."}
    )
    model_type: str = field(default="bert", metadata={"help": "The model type to build from scratch."})
    config_overrides: str | None = field(
        default="hidden_size=64,num_hidden_layers=2,num_attention_heads=2,intermediate_size=128,"
        "max_position_embeddings=128",
        metadata={"help": "Config values for a model built from scratch, as 'key=value,key=value'."},
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "A local tokenizer folder; default: train one on --train_file."}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where `datasets` keeps its processed files."})


@dataclass
class DataTrainingArguments:
    """Which data to train, evaluate and predict on."""

    train_file: str = field(default=str(DATA_DIR / "classification" / "train.jsonl"),
                            metadata={"help": "A .jsonl or .csv file with a label column and text column(s)."})
    validation_file: str = field(default=str(DATA_DIR / "classification" / "validation.jsonl"),
                                 metadata={"help": "Same format as --train_file."})
    test_file: str = field(default=str(DATA_DIR / "classification" / "test.jsonl"),
                           metadata={"help": "Same format as --train_file (the label column is optional)."})
    max_seq_length: int = field(default=64, metadata={"help": "Longer inputs are truncated."})
    pad_to_max_length: bool = field(
        default=False, metadata={"help": "Pad every input to max_seq_length instead of per batch."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only this many training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only this many evaluation rows."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep only this many test rows."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Redo the tokenization instead of reusing it."})


def _load_raw_datasets(data_args: DataTrainingArguments, cache_dir: str | None):
    import datasets

    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    extension = data_args.train_file.rsplit(".", 1)[-1]
    builder = {"jsonl": "json", "json": "json", "csv": "csv"}.get(extension)
    if builder is None:
        raise ValueError(f"--train_file must be a .jsonl, .json or .csv file, got {data_args.train_file!r}.")
    return datasets.load_dataset(builder, data_files=files, cache_dir=cache_dir)


def _text_columns(column_names: list[str]) -> tuple[str, str | None]:
    if "sentence1" in column_names:
        return "sentence1", "sentence2" if "sentence2" in column_names else None
    if "sentence" in column_names:
        return "sentence", None
    others = [name for name in column_names if name != "label"]
    if not others:
        raise ValueError(f"The data has no text column besides 'label' (columns: {column_names}).")
    return others[0], others[1] if len(others) > 1 else None


def build_model(model_args: ModelArguments, tokenizer, label_list: list[str]):
    """A ``transformers`` sequence classifier: loaded from a local folder, or built from a config."""
    from transformers import CONFIG_MAPPING, AutoModelForSequenceClassification

    label2id = {label: index for index, label in enumerate(label_list)}
    id2label = {index: label for label, index in label2id.items()}
    if model_args.model_name_or_path:
        return AutoModelForSequenceClassification.from_pretrained(
            model_args.model_name_or_path, num_labels=len(label_list), label2id=label2id, id2label=id2label
        )
    config = CONFIG_MAPPING[model_args.model_type](num_labels=len(label_list), label2id=label2id, id2label=id2label)
    if model_args.config_overrides:
        config.update_from_string(model_args.config_overrides)
    config.vocab_size = len(tokenizer)
    config.pad_token_id = tokenizer.pad_token_id
    model = AutoModelForSequenceClassification.from_config(config)
    logger.info("Built a %s classifier from its config: %.2fM parameters, labels %s", model_args.model_type,
                model.num_parameters() / 1e6, label_list)
    return model


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the script; returns the metrics it printed (``train_*``, ``eval_*``, ``predict_*``)."""
    require_transformers()
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parse_arguments(parser, argv)
    setup_logging(training_args, logger)
    logger.debug("Training/evaluation parameters %s", training_args)

    last_checkpoint = None
    if os.path.isdir(training_args.output_dir) and training_args.do_train:
        last_checkpoint = get_last_checkpoint(training_args.output_dir)
        if last_checkpoint is not None and training_args.resume_from_checkpoint is None:
            logger.info("Checkpoint detected, resuming training at %s. To start from scratch, change --output_dir.",
                        last_checkpoint)

    set_seed(training_args.seed)

    raw_datasets = _load_raw_datasets(data_args, model_args.cache_dir)
    label_list = sorted(set(raw_datasets["train"]["label"]))
    sentence1_key, sentence2_key = _text_columns(raw_datasets["train"].column_names)

    def training_texts():
        for row in raw_datasets["train"]:
            yield row[sentence1_key] if sentence2_key is None else f"{row[sentence1_key]} {row[sentence2_key]}"

    tokenizer = load_or_train_tokenizer(
        model_args.tokenizer_name,
        [training_args.resume_from_checkpoint or last_checkpoint, model_args.model_name_or_path],
        lambda: train_word_level(training_texts(), ["[PAD]", "[UNK]", "[CLS]", "[SEP]"], unk_token="[UNK]",
                                 pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]"),
    )
    model = build_model(model_args, tokenizer, label_list)
    label_to_id = model.config.label2id
    padding = "max_length" if data_args.pad_to_max_length else False

    def preprocess_function(examples):
        texts = (examples[sentence1_key],) if sentence2_key is None else (examples[sentence1_key],
                                                                          examples[sentence2_key])
        result = tokenizer(*texts, padding=padding, max_length=data_args.max_seq_length, truncation=True)
        if "label" in examples:
            result["label"] = [label_to_id[label] if label is not None else -1 for label in examples["label"]]
        return result

    with training_args.main_process_first(desc="dataset map pre-processing"):
        raw_datasets = raw_datasets.map(
            preprocess_function,
            batched=True,
            load_from_cache_file=not data_args.overwrite_cache,
            desc="Running tokenizer on dataset",
        )

    def select(split: str, limit: int | None):
        dataset = raw_datasets[split]
        return dataset.select(range(min(len(dataset), limit))) if limit is not None else dataset

    train_dataset = select("train", data_args.max_train_samples) if training_args.do_train else None
    eval_dataset = select("validation", data_args.max_eval_samples) if training_args.do_eval else None
    predict_dataset = select("test", data_args.max_predict_samples) if training_args.do_predict else None

    def compute_metrics(p):
        predictions = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        return accuracy_and_f1(np.argmax(predictions, axis=1), p.label_ids)

    # Padded to max_length already: stack as is; otherwise pad each batch to its longest row.
    data_collator = default_data_collator if data_args.pad_to_max_length else DataCollatorWithPadding(tokenizer)

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        compute_metrics=compute_metrics,
        processing_class=tokenizer,
        data_collator=data_collator,
    )

    results: dict[str, float] = {}
    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint or last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.save_model()
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        results.update(metrics)

    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate(eval_dataset=eval_dataset)
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        results.update(metrics)

    if training_args.do_predict:
        logger.info("*** Predict ***")
        output = trainer.predict(predict_dataset, metric_key_prefix="predict")
        predictions = np.argmax(output.predictions, axis=1)
        output.metrics["predict_samples"] = len(predict_dataset)
        trainer.log_metrics("predict", output.metrics)
        trainer.save_metrics("predict", output.metrics)
        results.update(output.metrics)
        if trainer.is_world_process_zero():
            path = os.path.join(training_args.output_dir, "predict_results.txt")
            with open(path, "w") as writer:
                writer.write("index\tprediction\n")
                for index, item in enumerate(predictions):
                    writer.write(f"{index}\t{label_list[item]}\n")
            logger.info("Predictions written to %s", path)

    return results


if __name__ == "__main__":
    main()
