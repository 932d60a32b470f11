#!/usr/bin/env python
"""Causal language modelling with hf_lightning: HF's ``run_clm.py`` migrated, running offline.

A GPT-2 built from a config (no download) learns the bundled story corpus (``examples/data/clm``) with a byte-level
BPE tokenizer trained on it at start-up. The script keeps HF's shape: three argument dataclasses parsed by
``HfArgumentParser`` (command line, or one ``.json`` / ``.yaml`` file), resuming from the last ``checkpoint-N`` in
``--output_dir``, ``--do_train`` / ``--do_eval``, and ``log_metrics`` / ``save_metrics`` / ``save_state``. Only the
imports of ``Trainer``, ``TrainingArguments``, ``HfArgumentParser`` and friends changed from HF's script.

Run (needs the ``examples`` extra: ``pip install -e ".[examples]"``)::

    python examples/run_clm.py --output_dir out/clm --do_train --do_eval --max_steps 200 \\
        --eval_strategy steps --eval_steps 50 --save_steps 50 --save_total_limit 2 --logging_steps 10 \\
        --learning_rate 3e-3 --report_to tensorboard

Running the same command again with a larger ``--max_steps`` resumes from the last checkpoint.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from itertools import chain

from offline_utils import (
    DATA_DIR,
    load_or_train_tokenizer,
    parse_arguments,
    require_transformers,
    setup_logging,
    train_byte_level_bpe,
)

from hf_lightning import (
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
    get_last_checkpoint,
    set_seed,
)

logger = logging.getLogger("run_clm")


@dataclass
class ModelArguments:
    """Which model to train. Nothing is downloaded: a model is built from ``--model_type`` and
    ``--config_overrides``, or loaded from a local folder with ``--model_name_or_path``."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A local folder written by save_pretrained (e.g. an earlier output_dir)."}
    )
    model_type: str = field(default="gpt2", metadata={"help": "The model type to build from scratch."})
    config_overrides: str | None = field(
        default="n_embd=64,n_layer=2,n_head=4,resid_pdrop=0.0,embd_pdrop=0.0,attn_pdrop=0.0",
        metadata={"help": "Config values for a model built from scratch, as 'key=value,key=value'."},
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "A local tokenizer folder; default: train one on --train_file."}
    )
    vocab_size: int = field(default=1000, metadata={"help": "Vocabulary size of a tokenizer trained here."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where `datasets` keeps its processed files."})


@dataclass
class DataTrainingArguments:
    """Which text to train and evaluate on (one document per line)."""

    train_file: str = field(default=str(DATA_DIR / "clm" / "train.txt"), metadata={"help": "A .txt file."})
    validation_file: str = field(default=str(DATA_DIR / "clm" / "validation.txt"), metadata={"help": "A .txt file."})
    block_size: int = field(default=64, metadata={"help": "Tokens per training sequence (texts are concatenated)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only this many training blocks."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only this many evaluation blocks."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Redo the tokenization instead of reusing it."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})


def build_model(model_args: ModelArguments, tokenizer):
    """A ``transformers`` causal LM: loaded from a local folder, or built from a config (random weights)."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    if model_args.model_name_or_path:
        return AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    config = CONFIG_MAPPING[model_args.model_type]()
    if model_args.config_overrides:
        logger.info("Overriding config: %s", model_args.config_overrides)
        config.update_from_string(model_args.config_overrides)
    config.vocab_size = len(tokenizer)
    config.bos_token_id = config.eos_token_id = config.pad_token_id = tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_config(config)
    logger.info("Built a %s model from its config: %.2fM parameters", model_args.model_type,
                model.num_parameters() / 1e6)
    return model


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the script; returns the metrics it printed (train and eval, with ``perplexity``)."""
    require_transformers()
    import datasets

    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parse_arguments(parser, argv)
    setup_logging(training_args, logger)
    # HF logs every argument at INFO; here it is DEBUG (--log_level debug) so a run's output stays readable.
    logger.debug("Training/evaluation parameters %s", training_args)

    # Resume from the last checkpoint in output_dir unless told otherwise (HF's examples do the same).
    last_checkpoint = None
    if os.path.isdir(training_args.output_dir) and training_args.do_train:
        last_checkpoint = get_last_checkpoint(training_args.output_dir)
        if last_checkpoint is not None and training_args.resume_from_checkpoint is None:
            logger.info("Checkpoint detected, resuming training at %s. To start from scratch, change --output_dir.",
                        last_checkpoint)

    set_seed(training_args.seed)

    raw_datasets = datasets.load_dataset(
        "text",
        data_files={"train": data_args.train_file, "validation": data_args.validation_file},
        cache_dir=model_args.cache_dir,
    )
    tokenizer = load_or_train_tokenizer(
        model_args.tokenizer_name,
        [training_args.resume_from_checkpoint or last_checkpoint, model_args.model_name_or_path],
        lambda: train_byte_level_bpe(raw_datasets["train"]["text"], vocab_size=model_args.vocab_size),
    )
    model = build_model(model_args, tokenizer)

    def tokenize_function(examples):
        # Each line is one story: end it with the end-of-text token so the model learns where stories stop.
        return tokenizer([text + tokenizer.eos_token for text in examples["text"]])

    with training_args.main_process_first(desc="dataset map tokenization"):
        tokenized_datasets = raw_datasets.map(
            tokenize_function,
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            remove_columns=["text"],
            load_from_cache_file=not data_args.overwrite_cache,
            desc="Running tokenizer on dataset",
        )

    block_size = min(data_args.block_size, model.config.max_position_embeddings)

    def group_texts(examples):
        # Concatenate everything, then cut into block_size pieces (the remainder is dropped), as HF's run_clm does.
        concatenated = {k: list(chain(*examples[k])) for k in examples}
        total_length = (len(concatenated["input_ids"]) // block_size) * block_size
        result = {k: [t[i:i + block_size] for i in range(0, total_length, block_size)] for k, t in concatenated.items()}
        result["labels"] = [list(ids) for ids in result["input_ids"]]
        return result

    with training_args.main_process_first(desc="grouping texts together"):
        lm_datasets = tokenized_datasets.map(
            group_texts,
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            load_from_cache_file=not data_args.overwrite_cache,
            desc=f"Grouping texts in chunks of {block_size}",
        )

    train_dataset = eval_dataset = None
    if training_args.do_train:
        train_dataset = lm_datasets["train"]
        if data_args.max_train_samples is not None:
            train_dataset = train_dataset.select(range(min(len(train_dataset), data_args.max_train_samples)))
    if training_args.do_eval:
        eval_dataset = lm_datasets["validation"]
        if data_args.max_eval_samples is not None:
            eval_dataset = eval_dataset.select(range(min(len(eval_dataset), data_args.max_eval_samples)))

    def preprocess_logits_for_metrics(logits, labels):
        # Keep only the argmax per position: evaluation then gathers ints, not vocab-sized logits.
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.argmax(dim=-1)

    def compute_metrics(eval_preds):
        predictions, labels = eval_preds
        # The prediction at position t is for the token at t + 1.
        labels, predictions = labels[:, 1:].reshape(-1), predictions[:, :-1].reshape(-1)
        keep = labels != -100
        return {"accuracy": float((predictions[keep] == labels[keep]).mean())}

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        compute_metrics=compute_metrics if training_args.do_eval else None,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics if training_args.do_eval else None,
    )

    results: dict[str, float] = {}
    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint or last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()  # also saves the tokenizer, so the output folder loads with from_pretrained

        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        results.update(metrics)

    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(eval_dataset)
        try:
            perplexity = math.exp(metrics["eval_loss"])
        except OverflowError:
            perplexity = float("inf")
        metrics["perplexity"] = perplexity
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        results.update(metrics)

    return results


if __name__ == "__main__":
    main()
