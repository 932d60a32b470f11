#!/usr/bin/env python
"""Translation (sequence to sequence) with hf_lightning: HF's ``run_translation.py`` migrated, running offline.

A small T5 built from a config (no download) learns the bundled English-French pairs (``examples/data/translation``,
a tiny grammar with gender agreement and adjectives after the noun) with one word-level vocabulary for both
languages, trained on them at start-up. HF's structure is kept: ``HfArgumentParser`` over
``ModelArguments`` / ``DataTrainingArguments`` / ``Seq2SeqTrainingArguments``, resuming from the last
``checkpoint-N``, ``DataCollatorForSeq2Seq``, ``Seq2SeqTrainer`` with ``--predict_with_generate`` (BLEU and the
generated length from ``generate``), ``--do_train`` / ``--do_eval`` / ``--do_predict``,
``log_metrics`` / ``save_metrics`` / ``save_state``, and ``generated_predictions.txt``.

Run (needs the ``examples`` extra: ``pip install -e ".[examples]"``)::

    python examples/run_translation.py --output_dir out/translation --do_train --do_eval --do_predict \\
        --predict_with_generate --num_train_epochs 10 --learning_rate 3e-3 --per_device_train_batch_size 32 \\
        --eval_strategy epoch --save_strategy epoch --save_total_limit 1 --logging_steps 25
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np
from offline_utils import (
    DATA_DIR,
    corpus_bleu,
    load_or_train_tokenizer,
    parse_arguments,
    require_transformers,
    setup_logging,
    train_word_level,
)

from hf_lightning import (
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    default_data_collator,
    get_last_checkpoint,
    set_seed,
)

logger = logging.getLogger("run_translation")


@dataclass
class ModelArguments:
    """Which model to train: built from ``--model_type`` and ``--config_overrides``, or a local folder."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A local folder written by save_pretrained (e.g. an earlier output_dir)."}
    )
    model_type: str = field(default="t5", metadata={"help": "The encoder-decoder model type to build."})
    config_overrides: str | None = field(
        default="d_model=64,d_ff=128,d_kv=16,num_heads=4,num_layers=2,num_decoder_layers=2,dropout_rate=0.0",
        metadata={"help": "Config values for a model built from scratch, as 'key=value,key=value'."},
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "A local tokenizer folder; default: train one on --train_file."}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where `datasets` keeps its processed files."})


@dataclass
class DataTrainingArguments:
    """Which pairs to train, evaluate and predict on: ``.jsonl`` rows ``{"translation": {src: ..., tgt: ...}}``."""

    source_lang: str = field(default="en", metadata={"help": "Source language key in the translation dicts."})
    target_lang: str = field(default="fr", metadata={"help": "Target language key in the translation dicts."})
    train_file: str = field(default=str(DATA_DIR / "translation" / "train.jsonl"), metadata={"help": "A .jsonl file."})
    validation_file: str = field(default=str(DATA_DIR / "translation" / "validation.jsonl"),
                                 metadata={"help": "A .jsonl file."})
    test_file: str = field(default=str(DATA_DIR / "translation" / "test.jsonl"), metadata={"help": "A .jsonl file."})
    source_prefix: str | None = field(
        default=None, metadata={"help": "Text put before every source (T5 style, e.g. 'translate English to French: ')."}
    )
    max_source_length: int = field(default=48, metadata={"help": "Longer sources are truncated."})
    max_target_length: int = field(default=48, metadata={"help": "Longer training targets are truncated."})
    val_max_target_length: int | None = field(
        default=None,
        metadata={"help": "Target length for evaluation, and generate's max_length (default: max_target_length)."},
    )
    pad_to_max_length: bool = field(default=False, metadata={"help": "Pad to the maximum lengths, not per batch."})
    num_beams: int | None = field(default=None, metadata={"help": "Beams for generate during evaluate/predict."})
    ignore_pad_token_for_loss: bool = field(
        default=True, metadata={"help": "Padding in the labels is ignored by the loss (labels padded with -100)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only this many training pairs."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only this many evaluation pairs."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep only this many test pairs."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Redo the tokenization instead of reusing it."})

    def __post_init__(self) -> None:
        if self.val_max_target_length is None:
            self.val_max_target_length = self.max_target_length


def build_model(model_args: ModelArguments, tokenizer):
    """A ``transformers`` encoder-decoder: loaded from a local folder, or built from a config."""
    from transformers import CONFIG_MAPPING, AutoModelForSeq2SeqLM

    if model_args.model_name_or_path:
        return AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path)
    config = CONFIG_MAPPING[model_args.model_type]()
    if model_args.config_overrides:
        config.update_from_string(model_args.config_overrides)
    config.vocab_size = len(tokenizer)
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    # T5 starts decoding from the padding token.
    config.decoder_start_token_id = tokenizer.pad_token_id
    model = AutoModelForSeq2SeqLM.from_config(config)
    logger.info("Built a %s model from its config: %.2fM parameters", model_args.model_type,
                model.num_parameters() / 1e6)
    return model


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the script; returns the metrics it printed (``train_*``, ``eval_*``, ``predict_*``)."""
    require_transformers()
    import datasets

    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments))
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
    source_lang, target_lang = data_args.source_lang, data_args.target_lang
    prefix = data_args.source_prefix or ""

    def training_texts():
        for pair in raw_datasets["train"]["translation"]:
            yield prefix + pair[source_lang]
            yield pair[target_lang]

    tokenizer = load_or_train_tokenizer(
        model_args.tokenizer_name,
        [training_args.resume_from_checkpoint or last_checkpoint, model_args.model_name_or_path],
        lambda: train_word_level(training_texts(), ["<pad>", "</s>", "<unk>"], unk_token="<unk>",
                                 pad_token="<pad>", eos_token="</s>"),
    )
    model = build_model(model_args, tokenizer)
    padding = "max_length" if data_args.pad_to_max_length else False

    def preprocess_function(examples, max_target_length):
        inputs = [prefix + pair[source_lang] for pair in examples["translation"]]
        targets = [pair[target_lang] for pair in examples["translation"]]
        model_inputs = tokenizer(inputs, max_length=data_args.max_source_length, padding=padding, truncation=True)
        labels = tokenizer(text_target=targets, max_length=max_target_length, padding=padding, truncation=True)
        if padding == "max_length" and data_args.ignore_pad_token_for_loss:
            # Padding only happened here with --pad_to_max_length; the loss must not learn to predict it.
            labels["input_ids"] = [[(t if t != tokenizer.pad_token_id else -100) for t in row]
                                   for row in labels["input_ids"]]
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    def prepare(split: str, limit: int | None, max_target_length: int):
        dataset = raw_datasets[split]
        if limit is not None:
            dataset = dataset.select(range(min(len(dataset), limit)))
        with training_args.main_process_first(desc=f"{split} dataset map pre-processing"):
            return dataset.map(
                preprocess_function,
                batched=True,
                fn_kwargs={"max_target_length": max_target_length},
                remove_columns=dataset.column_names,
                load_from_cache_file=not data_args.overwrite_cache,
                desc=f"Running tokenizer on {split} dataset",
            )

    train_dataset = eval_dataset = predict_dataset = None
    if training_args.do_train:
        train_dataset = prepare("train", data_args.max_train_samples, data_args.max_target_length)
    if training_args.do_eval:
        eval_dataset = prepare("validation", data_args.max_eval_samples, data_args.val_max_target_length)
    if training_args.do_predict:
        predict_dataset = prepare("test", data_args.max_predict_samples, data_args.val_max_target_length)

    label_pad_token_id = -100 if data_args.ignore_pad_token_for_loss else tokenizer.pad_token_id
    if data_args.pad_to_max_length:
        data_collator = default_data_collator
    else:
        # Passing the model lets the collator build decoder_input_ids from the padded labels.
        data_collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=label_pad_token_id)

    def decode(ids: np.ndarray) -> list[str]:
        # -100 marks padding in labels (and in predictions joined across batches); it is no token id.
        ids = np.where(ids != -100, ids, tokenizer.pad_token_id)
        return [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]

    def compute_metrics(eval_preds):
        predictions, labels = eval_preds
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        decoded_predictions, decoded_labels = decode(predictions), decode(labels)
        lengths = [np.count_nonzero(row != tokenizer.pad_token_id) for row in predictions]
        return {"bleu": round(corpus_bleu(decoded_predictions, decoded_labels), 4),
                "gen_len": round(float(np.mean(lengths)), 4)}

    # Generation settings for evaluation during training (evaluate / predict below pass them explicitly too).
    if training_args.generation_max_length is None:
        training_args.generation_max_length = data_args.val_max_target_length
    if training_args.generation_num_beams is None:
        training_args.generation_num_beams = data_args.num_beams

    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=data_collator,
        # BLEU needs generated text; without --predict_with_generate evaluation reports the loss only (as HF).
        compute_metrics=compute_metrics if training_args.predict_with_generate else None,
    )

    results: dict[str, float] = {}
    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint or last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        results.update(metrics)

    max_length = training_args.generation_max_length
    num_beams = training_args.generation_num_beams
    # generate() options only mean something when evaluating with generate.
    gen_kwargs = {"max_length": max_length, "num_beams": num_beams} if training_args.predict_with_generate else {}

    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate(metric_key_prefix="eval", **gen_kwargs)
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        results.update(metrics)

    if training_args.do_predict:
        logger.info("*** Predict ***")
        output = trainer.predict(predict_dataset, metric_key_prefix="predict", **gen_kwargs)
        metrics = output.metrics
        metrics["predict_samples"] = len(predict_dataset)
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)
        results.update(metrics)
        if trainer.is_world_process_zero() and training_args.predict_with_generate:
            path = os.path.join(training_args.output_dir, "generated_predictions.txt")
            with open(path, "w", encoding="utf-8") as writer:
                writer.write("\n".join(decode(output.predictions)) + "\n")
            logger.info("Translations written to %s", path)

    return results


if __name__ == "__main__":
    main()
