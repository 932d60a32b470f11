"""Tokenizers built offline from a tiny in-test vocabulary, and a tokenizer-like stand-in without ``pad``."""

from __future__ import annotations

import pytest

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "##s", "big", "red", "hat"]
VOCAB = {token: i for i, token in enumerate(SPECIAL_TOKENS + WORDS)}


class SimpleTokenizer:
    """Only the attributes hf_lightning's built-in padder and masker need; no ``pad`` method."""

    def __init__(self, hf_tokenizer, padding_side: str = "right", with_input_names: bool = True):
        self.pad_token_id = hf_tokenizer.pad_token_id
        self.mask_token_id = hf_tokenizer.mask_token_id
        self.padding_side = padding_side
        self.all_special_ids = list(hf_tokenizer.all_special_ids)
        self._size = len(hf_tokenizer)
        if with_input_names:
            self.model_input_names = list(hf_tokenizer.model_input_names)

    def __len__(self) -> int:
        return self._size


def make_bert_tokenizer(padding_side: str = "right"):
    from transformers import BertTokenizerFast

    tokenizer = BertTokenizerFast(vocab=dict(VOCAB))
    tokenizer.padding_side = padding_side
    return tokenizer


def make_wordlevel_tokenizer(padding_side: str = "right"):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(dict(VOCAB), unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", VOCAB["[CLS]"]), ("[SEP]", VOCAB["[SEP]"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        padding_side=padding_side,
    )


_FACTORIES = {"bert": make_bert_tokenizer, "wordlevel": make_wordlevel_tokenizer}


@pytest.fixture
def make_tokenizer():
    """``make_tokenizer(kind="bert" | "wordlevel", padding_side="right")`` -> a fresh HF fast tokenizer."""

    def make(kind: str = "bert", padding_side: str = "right"):
        return _FACTORIES[kind](padding_side)

    return make


@pytest.fixture
def simple_tokenizer():
    """``simple_tokenizer(hf_tokenizer, ...)`` -> a :class:`SimpleTokenizer` with the same ids."""
    return SimpleTokenizer
