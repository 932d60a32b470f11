"""Data-pipeline parity: column filtering, default collators, samplers and loader options against HF's Trainer.

Each test trains the same tiny model on the same data with ``transformers.Trainer`` and ``hf_lightning.Trainer``
(CPU, dropout 0, one thread) and compares ``log_history``, weights and the HF callback event sequence.
"""

from __future__ import annotations

import random

import pytest
import torch

from tests.helpers.models import (
    DictDataset,
    lm_data,
    pad_collator,
    padded_lm_data,
    tiny_gpt2,
)
from tests.helpers.parity import assert_log_history_equal, assert_parity, assert_weights_close, run, run_pair

WORDS = [f"w{i}" for i in range(58)]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[BOS]"]


# ---------------------------------------------------------------------------------------------- builders
def word_tokenizer(with_cls_sep: bool = False):
    """A ``PreTrainedTokenizerFast`` over a WordLevel vocabulary built in memory (nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if with_cls_sep:
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
        )
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def sentences(n: int, min_words: int = 3, max_words: int = 12, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))) for _ in range(n)]


def tokenized_rows(tokenizer, n: int, seed: int = 0, num_labels: int | None = None) -> list[dict]:
    """Variable-length tokenized rows (python lists, no padding); an int ``label`` when ``num_labels``."""
    rng = random.Random(seed + 1)
    rows = []
    for text in sentences(n, seed=seed):
        row = {"input_ids": tokenizer(text)["input_ids"]}
        if num_labels is not None:
            row["label"] = rng.randrange(num_labels)
        rows.append(row)
    return rows


def gpt2_64():
    return tiny_gpt2(vocab=len(SPECIALS) + len(WORDS), n_positions=32)


def gpt2_96():
    return tiny_gpt2(vocab=96, n_positions=32)


def bert_classifier_64():
    from transformers import BertConfig, BertForSequenceClassification, set_seed

    set_seed(42)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=len(SPECIALS) + len(WORDS), max_position_embeddings=32, num_labels=3,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0)
    return BertForSequenceClassification(config)


def bert_mlm_64():
    from transformers import BertConfig, BertForMaskedLM, set_seed

    set_seed(42)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=len(SPECIALS) + len(WORDS), max_position_embeddings=32,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0)
    return BertForMaskedLM(config)


def lm_rows_with_extras(n: int = 24, seed: int = 0) -> list[dict]:
    """Fixed-length LM rows plus a string and an int column the model's forward does not take."""
    train, _ = lm_data(n_train=n, n_eval=0, seed=seed)
    return [
        {"input_ids": row["input_ids"].tolist(), "attention_mask": row["attention_mask"].tolist(),
         "labels": row["labels"].tolist(), "text": f"row {i}", "idx": i}
        for i, row in enumerate(train.rows)
    ]


class ListIterable(torch.utils.data.IterableDataset):
    """An iterable (length-less) dataset over a fixed list of rows."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def __iter__(self):
        return iter(self.rows)


BASE = dict(per_device_train_batch_size=4, logging_steps=1, learning_rate=3e-3, save_strategy="no")


# ---------------------------------------------------------------------------------------------- columns
@pytest.mark.parametrize("kind", ["datasets", "torch"])
def test_remove_unused_columns_drops_extra_columns(tmp_path, kind):
    """A ``text`` (str) and an ``idx`` (int) column reach neither model: removed from a datasets.Dataset,
    filtered per example for a torch Dataset of dicts (HF's RemoveColumnsCollator)."""
    rows = lm_rows_with_extras()
    if kind == "datasets":
        import datasets

        train = datasets.Dataset.from_list(rows)
    else:
        train = DictDataset(rows)
    hf, ours = run_pair(lambda: tiny_gpt2(), tmp_path, train_dataset=train,
                        args=dict(BASE, gradient_accumulation_steps=2, num_train_epochs=2))
    assert_parity(hf, ours)
    assert ours.train_output.global_step == 6


def _collator_needing_extra_column(features: list[dict]) -> dict:
    # Uses the `keep` column, which the model's forward does not accept: only works when columns are kept.
    keep = torch.tensor([f["keep"] for f in features], dtype=torch.long)
    ids = torch.tensor([f["input_ids"] for f in features])
    labels = torch.tensor([f["labels"] for f in features])
    labels[:, : int(keep.min())] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


@pytest.mark.parametrize("kind", ["datasets", "torch"])
def test_remove_unused_columns_false_keeps_columns_for_custom_collator(tmp_path, kind):
    rows = [dict(r, keep=1 + r["idx"] % 5) for r in lm_rows_with_extras()]
    if kind == "datasets":
        import datasets

        train = datasets.Dataset.from_list(rows)
    else:
        train = DictDataset(rows)
    hf, ours = run_pair(
        lambda: tiny_gpt2(), tmp_path, train_dataset=train,
        args=dict(BASE, gradient_accumulation_steps=2, num_train_epochs=1, remove_unused_columns=False),
        trainer_kwargs=dict(data_collator=_collator_needing_extra_column),
    )
    assert_parity(hf, ours)


# ---------------------------------------------------------------------------------------------- collators
def test_default_collator_pads_with_processing_class(tmp_path):
    """``processing_class=<tokenizer>`` and no collator: both pick DataCollatorWithPadding (rows differ in length,
    ``label`` is renamed to ``labels``); eval runs through the same collator."""
    tokenizer = word_tokenizer()
    train = DictDataset(tokenized_rows(tokenizer, 30, seed=1, num_labels=3))
    evald = DictDataset(tokenized_rows(tokenizer, 10, seed=2, num_labels=3))
    hf, ours = run_pair(
        bert_classifier_64, tmp_path, train_dataset=train, eval_dataset=evald,
        args=dict(BASE, gradient_accumulation_steps=2, num_train_epochs=2, eval_strategy="epoch",
                  per_device_eval_batch_size=4),
        trainer_kwargs=dict(processing_class=tokenizer),
    )
    assert_parity(hf, ours)
    assert "eval_loss" in ours.log_history[-2]
    # Rows of different lengths only batch through a padding collator, so ours must have picked one too.
    from transformers import DataCollatorWithPadding as HFPadding

    assert isinstance(hf.trainer.data_collator, HFPadding)


def _run_each_with_own_collator(make_model, tmp_path, make_collator, **kwargs):
    """Run HF with transformers' collator class and ours with hf_lightning's (same arguments)."""
    import transformers

    import hf_lightning

    results = []
    for kind, lib in (("hf", transformers), ("ours", hf_lightning)):
        collator = make_collator(lib)
        assert type(collator).__module__.split(".")[0] == lib.__name__
        results.append(run(kind, make_model, tmp_path, trainer_kwargs=dict(data_collator=collator), **kwargs))
    return results


def test_causal_lm_collator_mlm_false(tmp_path):
    tokenizer = word_tokenizer()
    train = DictDataset(tokenized_rows(tokenizer, 26, seed=3))
    hf, ours = _run_each_with_own_collator(
        gpt2_64, tmp_path, lambda lib: lib.DataCollatorForLanguageModeling(tokenizer, mlm=False),
        train_dataset=train, args=dict(BASE, gradient_accumulation_steps=3, num_train_epochs=2),
    )
    assert_parity(hf, ours)


def test_masked_lm_collator_with_seed(tmp_path):
    """MLM masking from a seeded private generator: the same masks on both sides, epoch after epoch."""
    tokenizer = word_tokenizer(with_cls_sep=True)
    train = DictDataset(tokenized_rows(tokenizer, 22, seed=4))
    hf, ours = _run_each_with_own_collator(
        bert_mlm_64, tmp_path,
        lambda lib: lib.DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.3, seed=7),
        train_dataset=train, args=dict(BASE, gradient_accumulation_steps=2, num_train_epochs=2),
    )
    assert_parity(hf, ours)


# ---------------------------------------------------------------------------------------------- samplers
def test_group_by_length_sampling(tmp_path):
    hf, ours = run_pair(
        gpt2_96, tmp_path, train_dataset=padded_lm_data(n=40),
        args=dict(BASE, gradient_accumulation_steps=2, num_train_epochs=2,
                  train_sampling_strategy="group_by_length"),
        trainer_kwargs=dict(data_collator=pad_collator),
    )
    assert_parity(hf, ours)


def test_group_by_length_4x_name_maps_to_5x_strategy(tmp_path):
    """4.x ``group_by_length=True`` is ours only (HF 5.23 no longer takes it); it must train as the 5.x name."""
    import transformers

    import hf_lightning

    with pytest.raises(TypeError, match="group_by_length"):
        transformers.TrainingArguments(output_dir=str(tmp_path / "x"), group_by_length=True)
    with pytest.warns(FutureWarning, match="group_by_length"):
        mapped = hf_lightning.TrainingArguments(output_dir=str(tmp_path / "y"), group_by_length=True)
    assert mapped.train_sampling_strategy == "group_by_length"

    common = dict(BASE, gradient_accumulation_steps=2, num_train_epochs=2)
    kwargs = dict(train_dataset=padded_lm_data(n=40), trainer_kwargs=dict(data_collator=pad_collator))
    with pytest.warns(FutureWarning, match="group_by_length"):
        legacy = run("ours", gpt2_96, tmp_path / "legacy", args=dict(common, group_by_length=True), **kwargs)
    current = run("ours", gpt2_96, tmp_path / "current", args=dict(common, train_sampling_strategy="group_by_length"),
                  **kwargs)
    assert_log_history_equal(current.log_history, legacy.log_history, rtol=0)
    assert_weights_close(current.state_dict, legacy.state_dict, rtol=0, atol=0)


@pytest.mark.parametrize("extra", [
    dict(train_sampling_strategy="sequential"),
    dict(data_seed=7),
    dict(data_seed=7, dataloader_drop_last=True),
    dict(dataloader_drop_last=True, gradient_accumulation_steps=3),
], ids=["sequential", "data_seed", "data_seed+drop_last", "drop_last+ga3"])
def test_sampler_and_loader_options(tmp_path, extra):
    """37 rows, B=4: ``dataloader_drop_last`` leaves 9 batches per epoch (10 without)."""
    hf, ours = run_pair(
        gpt2_96, tmp_path, train_dataset=padded_lm_data(n=37),
        args=dict(BASE, num_train_epochs=2, **{"gradient_accumulation_steps": 2, **extra}),
        trainer_kwargs=dict(data_collator=pad_collator),
    )
    assert_parity(hf, ours)


# ---------------------------------------------------------------------------------------------- iterable datasets
def _lm_rows(n: int) -> list[dict]:
    train, _ = lm_data(n_train=n, n_eval=0)
    return train.rows


def test_iterable_dataset_whole_windows(tmp_path):
    """16 rows, B=4, GA=2: each pass over the data is exactly 2 windows; max_steps=5 runs 3 loop epochs (the third
    one stops early). ``epoch`` counts micro-batches over ``max_steps * GA`` as HF does."""
    hf, ours = run_pair(
        lambda: tiny_gpt2(), tmp_path, train_dataset=ListIterable(_lm_rows(16)),
        args=dict(BASE, gradient_accumulation_steps=2, max_steps=5),
    )
    assert_parity(hf, ours)
    assert [round(e["epoch"], 4) for e in hf.log_history[:5]] == [0.2, 0.4, 1.2, 1.4, 2.2]




def test_iterable_dataset_partial_window_carries_over(tmp_path):
    """HF quirk P11 reproduced: 18 rows, B=4: 5 micro-batches per pass, GA=2 leaves a one-batch window at the end of each pass."""
    hf, ours = run_pair(
        lambda: tiny_gpt2(), tmp_path, train_dataset=ListIterable(_lm_rows(18)),
        args=dict(BASE, gradient_accumulation_steps=2, max_steps=5),
    )
    assert_parity(hf, ours)


def test_group_by_length_with_iterable_dataset_is_refused(tmp_path):
    """A documented difference: HF 5.23 only warns that group_by_length is ignored for a dataset without a length
    and trains in the dataset's own order; we refuse before any work, naming the argument."""
    import hf_lightning

    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True,
                                          max_steps=3, train_sampling_strategy="group_by_length")
    with pytest.raises(ValueError, match="group_by_length"):
        hf_lightning.Trainer(model=tiny_gpt2(), args=args, train_dataset=ListIterable(_lm_rows(16)))


# ---------------------------------------------------------------------------------------------- eval datasets
def test_eval_dataset_dict_with_steps_strategy(tmp_path):
    """``eval_dataset={"a": ..., "b": ...}``: each set evaluated in order at every eval step, keys ``eval_a_*``."""
    train, eval_a = lm_data(n_train=24, n_eval=8)
    _, eval_b = lm_data(n_train=0, n_eval=6, seed=9)
    hf, ours = run_pair(
        lambda: tiny_gpt2(), tmp_path, train_dataset=train, eval_dataset={"a": eval_a, "b": eval_b},
        args=dict(BASE, gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=2, eval_strategy="steps",
                  eval_steps=2, per_device_eval_batch_size=4),
    )
    assert_parity(hf, ours, events=False)
    evals = [e for e in ours.log_history if any(k.startswith("eval_") for k in e)]
    assert [sorted(k for k in e if k.endswith("_loss")) for e in evals[:2]] == [["eval_a_loss"], ["eval_b_loss"]]
    assert len(evals) == 2 * 3




def test_eval_dataset_dict_callback_event_order(tmp_path):
    train, eval_a = lm_data(n_train=8, n_eval=4)
    _, eval_b = lm_data(n_train=0, n_eval=4, seed=9)
    hf, ours = run_pair(
        lambda: tiny_gpt2(), tmp_path, train_dataset=train, eval_dataset={"a": eval_a, "b": eval_b},
        args=dict(BASE, num_train_epochs=1, eval_strategy="epoch", per_device_eval_batch_size=4),
    )
    assert ours.events == hf.events


def test_eval_batch_size_not_dividing_the_eval_set(tmp_path):
    """11 eval rows with batches of 4 (4, 4, 3): eval_loss is the per-sample mean, not the mean of batch means."""
    eval_rows = padded_lm_data(n=11, seed=8)
    hf, ours = run_pair(
        gpt2_96, tmp_path, train_dataset=padded_lm_data(n=16), eval_dataset=eval_rows,
        args=dict(BASE, num_train_epochs=1, eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=4),
        trainer_kwargs=dict(data_collator=pad_collator),
    )
    assert_parity(hf, ours)
    evals = [e["eval_loss"] for e in ours.log_history if "eval_loss" in e]
    assert len(evals) == 2
