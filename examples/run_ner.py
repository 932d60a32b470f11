#!/usr/bin/env python
"""Token classification (named entities) with hf_lightning: HF's ``run_ner.py`` migrated, running offline.

A small BERT built from a config (no download) learns BIO tags for people, places and organisations in the bundled
sentences (``examples/data/ner``), with a word-level tokenizer trained on them at start-up. The test split mostly
uses names the training split never shows, so it measures what the model learned from context. HF's structure is
kept: ``HfArgumentParser`` over three dataclasses, resuming from the last ``checkpoint-N``, word-to-token label
alignment (``--label_all_tokens``), ``DataCollatorForTokenClassification``, entity-level precision / recall / F1,
``--do_train`` / ``--do_eval`` / ``--do_predict``, ``log_metrics`` / ``save_metrics`` / ``save_state``, and
``predictions.txt``.

Run (needs the ``examples`` extra: ``pip install -e ".[examples]"``)::

    python examples/run_ner.py --output_dir out/ner --do_train --do_eval --do_predict --num_train_epochs 4 \\
        --learning_rate 2e-3 --eval_strategy epoch --save_strategy epoch --save_total_limit 1 --logging_steps 10
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np
from offline_utils import (
    DATA_DIR,
    entity_scores,
    load_or_train_tokenizer,
    parse_arguments,
    require_transformers,
    setup_logging,
    train_word_level,
)

from hf_lightning import (
    DataCollatorForTokenClassification,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    get_last_checkpoint,
    set_seed,
)

logger = logging.getLogger("run_ner")


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
    """Which data to train, evaluate and predict on: ``.jsonl`` rows with a words column and a tags column."""

    train_file: str = field(default=str(DATA_DIR / "ner" / "train.jsonl"), metadata={"help": "A .jsonl file."})
    validation_file: str = field(default=str(DATA_DIR / "ner" / "validation.jsonl"),
                                 metadata={"help": "A .jsonl file."})
    test_file: str = field(default=str(DATA_DIR / "ner" / "test.jsonl"), metadata={"help": "A .jsonl file."})
    text_column_name: str = field(default="tokens", metadata={"help": "The column with the list of words."})
    label_column_name: str = field(default="ner_tags", metadata={"help": "The column with the list of tags."})
    max_seq_length: int = field(default=64, metadata={"help": "Longer inputs are truncated."})
    label_all_tokens: bool = field(
        default=False,
        metadata={"help": "Label every sub-word token of a word instead of only the first (others get -100)."},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only this many training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only this many evaluation rows."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep only this many test rows."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Redo the tokenization instead of reusing it."})


def build_model(model_args: ModelArguments, tokenizer, label_list: list[str]):
    """A ``transformers`` token classifier: loaded from a local folder, or built from a config."""
    from transformers import CONFIG_MAPPING, AutoModelForTokenClassification

    label2id = {label: index for index, label in enumerate(label_list)}
    id2label = {index: label for label, index in label2id.items()}
    if model_args.model_name_or_path:
        return AutoModelForTokenClassification.from_pretrained(
            model_args.model_name_or_path, num_labels=len(label_list), label2id=label2id, id2label=id2label
        )
    config = CONFIG_MAPPING[model_args.model_type](num_labels=len(label_list), label2id=label2id, id2label=id2label)
    if model_args.config_overrides:
        config.update_from_string(model_args.config_overrides)
    config.vocab_size = len(tokenizer)
    config.pad_token_id = tokenizer.pad_token_id
    model = AutoModelForTokenClassification.from_config(config)
    logger.info("Built a %s token classifier from its config: %.2fM parameters, %d labels", model_args.model_type,
                model.num_parameters() / 1e6, len(label_list))
    return model


def _label_list(tag_rows) -> list[str]:
    """Every tag, ``O`` first then by entity type with ``B-`` before ``I-`` (a stable, readable order)."""
    tags = {tag for row in tag_rows for tag in row}
    return sorted(tags, key=lambda tag: (tag != "O", tag.partition("-")[2], tag))


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the script; returns the metrics it printed (``train_*``, ``eval_*``, ``predict_*``)."""
    require_transformers()
    import datasets

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

    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    raw_datasets = datasets.load_dataset("json", data_files=files, cache_dir=model_args.cache_dir)
    text_column, label_column = data_args.text_column_name, data_args.label_column_name
    for name in (text_column, label_column):
        if name not in raw_datasets["train"].column_names:
            raise ValueError(f"--train_file has no {name!r} column (columns: {raw_datasets['train'].column_names}); "
                             "set --text_column_name / --label_column_name.")
    label_list = _label_list(raw_datasets["train"][label_column])

    tokenizer = load_or_train_tokenizer(
        model_args.tokenizer_name,
        [training_args.resume_from_checkpoint or last_checkpoint, model_args.model_name_or_path],
        lambda: train_word_level((" ".join(words) for words in raw_datasets["train"][text_column]),
                                 ["[PAD]", "[UNK]", "[CLS]", "[SEP]"], unk_token="[UNK]", pad_token="[PAD]",
                                 cls_token="[CLS]", sep_token="[SEP]"),
    )
    model = build_model(model_args, tokenizer, label_list)
    label_to_id = model.config.label2id
    # With --label_all_tokens, the tokens after a word's first carry I-X where the word has B-X.
    b_to_i_label = [label_to_id.get(f"I-{label[2:]}", index) if label.startswith("B-") else index
                    for index, label in enumerate(label_list)]

    def tokenize_and_align_labels(examples):
        tokenized = tokenizer(examples[text_column], truncation=True, max_length=data_args.max_seq_length,
                              is_split_into_words=True)
        labels = []
        for row, tags in enumerate(examples[label_column]):
            previous_word, label_ids = None, []
            for word_index in tokenized.word_ids(batch_index=row):
                if word_index is None:
                    label_ids.append(-100)  # [CLS], [SEP]: no label, ignored by the loss
                elif word_index != previous_word:
                    label_ids.append(label_to_id[tags[word_index]])
                else:
                    first = label_to_id[tags[word_index]]
                    label_ids.append(b_to_i_label[first] if data_args.label_all_tokens else -100)
                previous_word = word_index
            labels.append(label_ids)
        tokenized["labels"] = labels
        return tokenized

    with training_args.main_process_first(desc="dataset map pre-processing"):
        tokenized_datasets = raw_datasets.map(
            tokenize_and_align_labels,
            batched=True,
            load_from_cache_file=not data_args.overwrite_cache,
            desc="Running tokenizer on dataset",
        )

    def select(split: str, limit: int | None):
        dataset = tokenized_datasets[split]
        return dataset.select(range(min(len(dataset), limit))) if limit is not None else dataset

    train_dataset = select("train", data_args.max_train_samples) if training_args.do_train else None
    eval_dataset = select("validation", data_args.max_eval_samples) if training_args.do_eval else None
    predict_dataset = select("test", data_args.max_predict_samples) if training_args.do_predict else None

    def to_tags(predictions: np.ndarray, labels: np.ndarray) -> tuple[list[list[str]], list[list[str]]]:
        predicted, truth = [], []
        for prediction_row, label_row in zip(predictions, labels):
            keep = label_row != -100
            predicted.append([label_list[p] for p in prediction_row[keep]])
            truth.append([label_list[t] for t in label_row[keep]])
        return predicted, truth

    def compute_metrics(p):
        predicted, truth = to_tags(np.argmax(p.predictions, axis=2), p.label_ids)
        return entity_scores(truth, predicted)

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=DataCollatorForTokenClassification(tokenizer),
        compute_metrics=compute_metrics,
    )

    results: dict[str, float] = {}
    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint or last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        metrics = train_result.metrics
        trainer.save_model()
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        results.update(metrics)

    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        results.update(metrics)

    if training_args.do_predict:
        logger.info("*** Predict ***")
        predictions, labels, metrics = trainer.predict(predict_dataset, metric_key_prefix="predict")
        predicted, _ = to_tags(np.argmax(predictions, axis=2), labels)
        metrics["predict_samples"] = len(predict_dataset)
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)
        results.update(metrics)
        if trainer.is_world_process_zero():
            path = os.path.join(training_args.output_dir, "predictions.txt")
            with open(path, "w") as writer:
                for tags in predicted:
                    writer.write(" ".join(tags) + "\n")
            logger.info("Predictions written to %s", path)

    return results


if __name__ == "__main__":
    main()
