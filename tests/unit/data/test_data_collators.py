"""hf_lightning collators against transformers' own collators (5.23), on the same examples."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import transformers
from hf_lightning.data.collators import (
    DataCollatorForLanguageModeling,
    DataCollatorForMultipleChoice,
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
    DefaultDataCollator,
    default_data_collator,
    pad_features,
    pad_sequences,
)


def assert_same_batch(ours, theirs):
    assert list(ours.keys()) == list(theirs.keys())
    for key, expected in theirs.items():
        got = ours[key]
        if expected is None:
            assert got is None, key
            continue
        assert isinstance(got, torch.Tensor), key
        assert got.dtype == expected.dtype, key
        assert got.shape == expected.shape, key
        assert torch.equal(got, expected), key


# ----------------------------------------------------------------------------------------------------------------
# default_data_collator
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class _Example:
    x: list
    label: int


DEFAULT_CASES = {
    "int label": lambda: [{"x": [1.0, 2.0], "label": 0}, {"x": [3.0, 4.0], "label": 1}],
    "float label": lambda: [{"x": [1, 2], "label": 0.5}, {"x": [3, 4], "label": 1.5}],
    "numpy int label": lambda: [{"x": [1, 2], "label": np.int64(3)}, {"x": [3, 4], "label": np.int64(1)}],
    "tensor label": lambda: [{"x": [1, 2], "label": torch.tensor(3)}, {"x": [3, 4], "label": torch.tensor(1)}],
    "label_ids ints": lambda: [{"x": [1], "label_ids": [1, 2]}, {"x": [2], "label_ids": [3, 4]}],
    "label_ids floats": lambda: [{"x": [1], "label_ids": [0.1, 0.2]}, {"x": [2], "label_ids": [0.3, 0.4]}],
    "label_ids tensors": lambda: [{"label_ids": torch.tensor([1, 2])}, {"label_ids": torch.tensor([3, 4])}],
    "labels key generic": lambda: [{"x": [1], "labels": [1.0, 2.0]}, {"x": [2], "labels": [3.0, 4.0]}],
    "tensors": lambda: [{"x": torch.ones(2, 3)}, {"x": torch.zeros(2, 3)}],
    "numpy": lambda: [{"x": np.ones(3, dtype=np.float32)}, {"x": np.zeros(3, dtype=np.float32)}],
    "strings and None dropped": lambda: [
        {"x": [1, 2], "text": "a", "extra": None, "label": None, "label_ids": [1]},
        {"x": [3, 4], "text": "b", "extra": None, "label": None, "label_ids": [0]},
    ],
    "objects via vars": lambda: [_Example([1, 2], 1), _Example([3, 4], 0)],
}


@pytest.mark.parametrize("case", list(DEFAULT_CASES))
def test_default_data_collator_matches_hf(case):
    ours = default_data_collator(DEFAULT_CASES[case]())
    theirs = transformers.default_data_collator(DEFAULT_CASES[case]())
    assert_same_batch(ours, theirs)
    assert_same_batch(DefaultDataCollator()(DEFAULT_CASES[case]()), theirs)


@pytest.mark.parametrize("return_tensors", ["tf", "jax"])
def test_non_torch_non_numpy_return_tensors_are_refused(return_tensors, make_tokenizer):
    tokenizer = make_tokenizer()
    with pytest.raises(ValueError, match="return_tensors='tf'|return_tensors='jax'"):
        default_data_collator([{"x": [1]}], return_tensors=return_tensors)
    for cls in (DataCollatorWithPadding, DataCollatorForTokenClassification, DataCollatorForSeq2Seq,
                DataCollatorForLanguageModeling, DefaultDataCollator, DataCollatorForMultipleChoice):
        kwargs = {} if cls is DefaultDataCollator else {"tokenizer": tokenizer}
        with pytest.raises(ValueError, match=f"{cls.__name__}: return_tensors=.*Pass return_tensors='pt'"):
            cls(**kwargs, return_tensors=return_tensors)
    collator = DataCollatorForTokenClassification(tokenizer)
    with pytest.raises(ValueError, match="return_tensors='tf'.*Pass return_tensors='pt'"):
        collator([{"input_ids": [2, 5, 3]}], return_tensors="tf")


def assert_same_arrays(ours, theirs):
    assert list(ours.keys()) == list(theirs.keys())
    for key, expected in theirs.items():
        assert isinstance(ours[key], np.ndarray), key
        assert ours[key].dtype == np.asarray(expected).dtype, key
        np.testing.assert_array_equal(ours[key], np.asarray(expected), err_msg=key)


@pytest.mark.parametrize("case", list(DEFAULT_CASES))
def test_default_data_collator_numpy_matches_hf(case):
    theirs = transformers.default_data_collator(DEFAULT_CASES[case](), return_tensors="np")
    assert_same_arrays(default_data_collator(DEFAULT_CASES[case](), return_tensors="np"), theirs)
    assert_same_arrays(DefaultDataCollator(return_tensors="np")(DEFAULT_CASES[case]()), theirs)


def test_padding_collators_return_numpy_as_hf(make_tokenizer):
    tokenizer = make_tokenizer("bert")
    rows = [[2, 5, 6, 3], [2, 7, 3]]
    features = lambda: [{"input_ids": r, "labels": [1] * len(r)} for r in rows]  # noqa: E731
    cases = [(DataCollatorWithPadding, transformers.DataCollatorWithPadding,
              lambda: [{"input_ids": r, "label": 1} for r in rows]),
             (DataCollatorForTokenClassification, transformers.DataCollatorForTokenClassification, features),
             (DataCollatorForSeq2Seq, transformers.DataCollatorForSeq2Seq, features)]
    for ours_cls, hf_cls, make in cases:
        theirs = hf_cls(tokenizer, return_tensors="np")(make())
        assert_same_arrays(ours_cls(tokenizer, return_tensors="np")(make()), dict(theirs))
    lm = DataCollatorForLanguageModeling(tokenizer, mlm=False, return_tensors="np")([{"input_ids": r} for r in rows])
    theirs = transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False, return_tensors="np")(
        [{"input_ids": r} for r in rows])
    assert_same_arrays(lm, dict(theirs))
    # A torch-default collator asked for numpy per call, as HF's DataCollatorMixin allows.
    per_call = DataCollatorForTokenClassification(tokenizer)(features(), return_tensors="np")
    assert isinstance(per_call["input_ids"], np.ndarray)


@pytest.mark.parametrize("options", [{}, {"pad_to_multiple_of": 4}, {"padding": "max_length", "max_length": 7}],
                         ids=str)
@pytest.mark.parametrize("label_key", ["label", "labels"])
def test_multiple_choice_matches_hf(options, label_key, make_tokenizer):
    tokenizer = make_tokenizer("bert")

    def examples():
        return [{"input_ids": [[2, 5, 3], [2, 6, 7, 8, 3]], "token_type_ids": [[0, 0, 0], [0, 0, 0, 1, 1]],
                 "attention_mask": [[1, 1, 1], [1] * 5], label_key: 1},
                {"input_ids": [[2, 9, 3], [2, 3]], "token_type_ids": [[0, 0, 0], [0, 0]],
                 "attention_mask": [[1, 1, 1], [1, 1]], label_key: 0}]

    theirs = transformers.DataCollatorForMultipleChoice(tokenizer, **options)(examples())
    ours = DataCollatorForMultipleChoice(tokenizer, **options)(examples())
    assert_same_batch(ours, theirs)
    assert ours["input_ids"].shape[:2] == (2, 2)


# ----------------------------------------------------------------------------------------------------------------
# DataCollatorWithPadding (through tokenizer.pad and through the built-in padder)
# ----------------------------------------------------------------------------------------------------------------


def _classification_features(kind: str):
    rows = [[2, 5, 6, 3], [2, 7, 3], [2, 8, 9, 10, 11, 3]]
    if kind == "lists":
        return [{"input_ids": r, "label": i % 2} for i, r in enumerate(rows)]
    if kind == "tensors":
        return [{"input_ids": torch.tensor(r), "label": torch.tensor(i % 2)} for i, r in enumerate(rows)]
    if kind == "numpy":
        return [{"input_ids": np.array(r), "label_ids": [i, i]} for i, r in enumerate(rows)]
    if kind == "with masks":
        return [
            {
                "input_ids": r,
                "attention_mask": [1] * len(r),
                "token_type_ids": [0] * len(r),
                "special_tokens_mask": [1] + [0] * (len(r) - 2) + [1],
                "label": float(i),
            }
            for i, r in enumerate(rows)
        ]
    raise AssertionError(kind)


PADDING_OPTIONS = [
    {},
    {"padding": "longest"},
    {"padding": "max_length", "max_length": 9},
    {"pad_to_multiple_of": 4},
    {"padding": "max_length", "max_length": 7, "pad_to_multiple_of": 4},
]


@pytest.mark.parametrize("options", PADDING_OPTIONS, ids=str)
@pytest.mark.parametrize("kind", ["lists", "tensors", "numpy", "with masks"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_with_padding_matches_hf(options, kind, padding_side, make_tokenizer, simple_tokenizer):
    tokenizer = make_tokenizer("bert", padding_side)
    theirs = transformers.DataCollatorWithPadding(tokenizer, **options)(_classification_features(kind))
    ours = DataCollatorWithPadding(tokenizer, **options)(_classification_features(kind))
    assert_same_batch(ours, theirs)
    # Built-in padder: a tokenizer-like object with no `pad` method gives the same tensors.
    builtin = DataCollatorWithPadding(simple_tokenizer(tokenizer, padding_side), **options)
    assert_same_batch(builtin(_classification_features(kind)), theirs)


def test_builtin_padder_defaults_to_input_ids_and_attention_mask(make_tokenizer, simple_tokenizer):
    tokenizer = make_tokenizer("wordlevel")
    features = [{"input_ids": [2, 5, 3]}, {"input_ids": [2, 5, 6, 7, 3]}]
    theirs = tokenizer.pad(copy.deepcopy(features), return_tensors="pt")
    ours = pad_features(simple_tokenizer(tokenizer, with_input_names=False), features)
    assert_same_batch(ours, theirs)


def test_builtin_padder_errors(make_tokenizer, simple_tokenizer):
    tokenizer = simple_tokenizer(make_tokenizer())
    with pytest.raises(ValueError, match="no 'input_ids' key"):
        pad_features(tokenizer, [{"ids": [1]}])
    with pytest.raises(ValueError, match="padding='max_length' needs a length: pass max_length"):
        pad_features(tokenizer, [{"input_ids": [1]}], padding="max_length")
    with pytest.raises(ValueError, match="not a padding strategy"):
        DataCollatorWithPadding(tokenizer, padding="shortest")
    with pytest.raises(ValueError, match="column 'input_ids' into a tensor.*enable padding"):
        pad_features(tokenizer, [{"input_ids": [1]}, {"input_ids": [1, 2]}], padding=False)
    with pytest.raises(ValueError, match="column 'text' into a tensor"):
        pad_features(tokenizer, [{"input_ids": [1], "text": "a"}])
    tokenizer.pad_token_id = None
    with pytest.raises(ValueError, match="has no pad token"):
        pad_features(tokenizer, [{"input_ids": [1]}, {"input_ids": [1, 2]}])
    with pytest.raises(ValueError, match="empty list of examples"):
        pad_features(tokenizer, [])
    with pytest.raises(ValueError, match="Padding needs a tokenizer.*got None"):
        DataCollatorWithPadding(None)([{"input_ids": [1]}])
    with pytest.raises(TypeError, match="expects one dict per example"):
        pad_features(tokenizer, [[1, 2]])


# ----------------------------------------------------------------------------------------------------------------
# DataCollatorForTokenClassification
# ----------------------------------------------------------------------------------------------------------------


def _token_features(label_key: str | None, as_tensors: bool = False):
    rows = [[2, 5, 6, 3], [2, 7, 3], [2, 8, 9, 10, 11, 3]]
    features = []
    for r in rows:
        feature = {"input_ids": torch.tensor(r) if as_tensors else r}
        if label_key is not None:
            labels = [-100] + [1] * (len(r) - 2) + [-100]
            feature[label_key] = torch.tensor(labels) if as_tensors else labels
        features.append(feature)
    return features


@pytest.mark.parametrize("options", [{}, {"pad_to_multiple_of": 8}, {"padding": "max_length", "max_length": 10},
                                     {"label_pad_token_id": 0}], ids=str)
@pytest.mark.parametrize("label_key", ["labels", "label", None])
@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("as_tensors", [False, True])
def test_token_classification_matches_hf(options, label_key, padding_side, as_tensors, make_tokenizer,
                                         simple_tokenizer):
    tokenizer = make_tokenizer("wordlevel", padding_side)
    theirs = transformers.DataCollatorForTokenClassification(tokenizer, **options)(
        _token_features(label_key, as_tensors)
    )
    assert_same_batch(DataCollatorForTokenClassification(tokenizer, **options)(_token_features(label_key, as_tensors)),
                      theirs)
    builtin = DataCollatorForTokenClassification(simple_tokenizer(tokenizer, padding_side), **options)
    assert_same_batch(builtin(_token_features(label_key, as_tensors)), theirs)


# ----------------------------------------------------------------------------------------------------------------
# DataCollatorForSeq2Seq
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bart():
    config = transformers.BartConfig(
        vocab_size=20, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=1,
        decoder_attention_heads=1, encoder_ffn_dim=8, decoder_ffn_dim=8, max_position_embeddings=32,
        pad_token_id=0, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2,
    )
    return transformers.BartForConditionalGeneration(config)


def _seq2seq_features(label_kind: str):
    sources = [[2, 5, 6, 3], [2, 7, 3], [2, 8, 9, 10, 11, 3]]
    targets = [[5, 6, 3], [7, 8, 9, 10, 3], [11, 3]]
    if label_kind == "none key":
        return [{"input_ids": s} for s in sources]
    if label_kind == "all None":
        return [{"input_ids": s, "labels": None} for s in sources]
    if label_kind == "numpy":
        return [{"input_ids": s, "labels": np.array(t)} for s, t in zip(sources, targets)]
    if label_kind == "label key":
        return [{"input_ids": s, "label": t} for s, t in zip(sources, targets)]
    if label_kind == "equal lengths":
        return [{"input_ids": s, "labels": t[:2]} for s, t in zip(sources, targets)]
    return [{"input_ids": s, "labels": t} for s, t in zip(sources, targets)]


SEQ2SEQ_OPTIONS = [
    {},
    {"pad_to_multiple_of": 4},
    {"padding": "max_length", "max_length": 8},
    {"label_pad_token_id": 0},
]


# HF's own label padding builds a tensor from a list of numpy arrays and warns about it.
@pytest.mark.filterwarnings("ignore:Creating a tensor from a list of numpy")
@pytest.mark.parametrize("options", SEQ2SEQ_OPTIONS, ids=str)
@pytest.mark.parametrize("label_kind", ["lists", "numpy", "label key", "none key", "all None"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("with_model", [False, True])
def test_seq2seq_matches_hf(options, label_kind, padding_side, with_model, bart, make_tokenizer, simple_tokenizer):
    tokenizer = make_tokenizer("wordlevel", padding_side)
    model = bart if with_model else None
    theirs = transformers.DataCollatorForSeq2Seq(tokenizer, model=model, **options)(_seq2seq_features(label_kind))
    ours = DataCollatorForSeq2Seq(tokenizer, model=model, **options)(_seq2seq_features(label_kind))
    assert_same_batch(ours, theirs)
    builtin = DataCollatorForSeq2Seq(simple_tokenizer(tokenizer, padding_side), model=model, **options)
    assert_same_batch(builtin(_seq2seq_features(label_kind)), theirs)
    if with_model and label_kind not in ("none key", "all None"):
        assert "decoder_input_ids" in ours


def test_seq2seq_without_padding_matches_hf(make_tokenizer):
    tokenizer = make_tokenizer("wordlevel")
    features = [{"input_ids": [2, 5, 3], "labels": [5, 6]}, {"input_ids": [2, 7, 3], "labels": [7, 3]}]
    theirs = transformers.DataCollatorForSeq2Seq(tokenizer, padding=False)(copy.deepcopy(features))
    ours = DataCollatorForSeq2Seq(tokenizer, padding=False)(copy.deepcopy(features))
    assert_same_batch(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------
# DataCollatorForLanguageModeling
# ----------------------------------------------------------------------------------------------------------------


def _lm_examples(kind: str, tokenizer=None):
    rows = [[2, 5, 6, 7, 8, 3], [2, 9, 10, 3], [2, 11, 12, 13, 14, 15, 16, 3], [2, 5, 5, 6, 6, 7, 7, 3]]
    if kind == "lists":
        return [list(r) for r in rows]
    if kind == "tensors":
        return [torch.tensor(r) for r in rows]
    if kind == "dicts":
        return [{"input_ids": list(r)} for r in rows]
    if kind == "dicts with special mask":
        return [{"input_ids": list(r), "special_tokens_mask": [1] + [0] * (len(r) - 2) + [1]} for r in rows]
    if kind == "equal tensors":
        return [torch.tensor(r[:4]) for r in rows]
    raise AssertionError(kind)


LM_OPTIONS = [
    {},
    {"pad_to_multiple_of": 8},
    {"mlm_probability": 0.5},
    {"mlm_probability": 0.6, "mask_replace_prob": 0.5, "random_replace_prob": 0.4},
    {"mlm_probability": 0.6, "mask_replace_prob": 1.0, "random_replace_prob": 0.0},
    {"mlm_probability": 0.6, "mask_replace_prob": 0.0, "random_replace_prob": 1.0},
]


@pytest.mark.parametrize("options", LM_OPTIONS, ids=str)
@pytest.mark.parametrize("kind", ["lists", "tensors", "dicts", "dicts with special mask", "equal tensors"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_mlm_global_rng_matches_hf(options, kind, padding_side, make_tokenizer, simple_tokenizer):
    tokenizer = make_tokenizer("wordlevel", padding_side)
    hf = transformers.DataCollatorForLanguageModeling(tokenizer, **options)
    ours = DataCollatorForLanguageModeling(tokenizer, **options)
    builtin = DataCollatorForLanguageModeling(simple_tokenizer(tokenizer, padding_side), **options)
    for seed in (0, 1):
        torch.manual_seed(seed)
        theirs = hf(_lm_examples(kind))
        torch.manual_seed(seed)
        assert_same_batch(ours(_lm_examples(kind)), theirs)
        torch.manual_seed(seed)
        assert_same_batch(builtin(_lm_examples(kind)), theirs)


@pytest.mark.parametrize("kind", ["lists", "dicts"])
def test_mlm_own_seed_matches_hf_over_several_batches(kind, make_tokenizer, simple_tokenizer):
    tokenizer = make_tokenizer("bert")
    hf = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.4, seed=7)
    ours = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.4, seed=7)
    builtin = DataCollatorForLanguageModeling(simple_tokenizer(tokenizer), mlm_probability=0.4, seed=7)
    for _ in range(3):
        # The private generator must ignore the global RNG entirely.
        torch.manual_seed(123)
        theirs = hf(_lm_examples(kind))
        torch.manual_seed(456)
        assert_same_batch(ours(_lm_examples(kind)), theirs)
        assert_same_batch(builtin(_lm_examples(kind)), theirs)


@pytest.mark.parametrize("kind", ["lists", "tensors", "dicts", "equal tensors"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("pad_to_multiple_of", [None, 8])
def test_causal_lm_matches_hf(kind, padding_side, pad_to_multiple_of, make_tokenizer, simple_tokenizer):
    tokenizer = make_tokenizer("wordlevel", padding_side)
    theirs = transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False, pad_to_multiple_of=pad_to_multiple_of)(
        _lm_examples(kind)
    )
    ours = DataCollatorForLanguageModeling(tokenizer, mlm=False, pad_to_multiple_of=pad_to_multiple_of)(
        _lm_examples(kind)
    )
    assert_same_batch(ours, theirs)
    builtin = DataCollatorForLanguageModeling(simple_tokenizer(tokenizer, padding_side), mlm=False,
                                              pad_to_multiple_of=pad_to_multiple_of)
    assert_same_batch(builtin(_lm_examples(kind)), theirs)


def test_whole_word_mask_matches_hf(make_tokenizer):
    tokenizer = make_tokenizer("bert")
    texts = ["the cats sat on the mat", "a big dogs ran", "the red hats sat", "dogs cats hats mats"]
    encoded = tokenizer(texts, padding=True, return_offsets_mapping=True)
    examples = [{key: encoded[key][i] for key in encoded} for i in range(len(texts))]
    with pytest.warns(UserWarning):
        hf = transformers.DataCollatorForLanguageModeling(tokenizer, whole_word_mask=True, mlm_probability=0.5)
    with pytest.warns(UserWarning, match="mask_replace_prob=1"):
        ours = DataCollatorForLanguageModeling(tokenizer, whole_word_mask=True, mlm_probability=0.5)
    assert (ours.mask_replace_prob, ours.random_replace_prob) == (1.0, 0.0)
    for seed in range(4):
        torch.manual_seed(seed)
        theirs = hf(copy.deepcopy(examples))
        torch.manual_seed(seed)
        assert_same_batch(ours(copy.deepcopy(examples)), theirs)


def test_whole_word_mask_needs_offsets(make_tokenizer):
    collator = DataCollatorForLanguageModeling(make_tokenizer("bert"), whole_word_mask=True, mask_replace_prob=1.0,
                                               random_replace_prob=0.0)
    with pytest.raises(ValueError, match="needs an 'offset_mapping' column.*return_offsets_mapping=True"):
        collator([[2, 5, 3]])


def test_mlm_inside_dataloader_workers_seeds_per_worker(make_tokenizer):
    tokenizer = make_tokenizer("wordlevel")
    examples = _lm_examples("lists")
    loaders = []
    for cls in (transformers.DataCollatorForLanguageModeling, DataCollatorForLanguageModeling):
        collator = cls(tokenizer, mlm_probability=0.5, seed=3)
        loader = torch.utils.data.DataLoader(examples, batch_size=2, num_workers=2, collate_fn=collator)
        loaders.append([batch for batch in loader])
    for theirs, ours in zip(*loaders):
        assert_same_batch(dict(ours), dict(theirs))


LM_ERRORS = [
    ({"mlm_probability": 1.5}, "mlm_probability must be between 0 and 1"),
    ({"mlm_probability": None}, "mlm_probability must be between 0 and 1"),
    ({"mask_replace_prob": 0.7, "random_replace_prob": 0.4}, "must not exceed 1"),
    ({"mask_replace_prob": -0.1}, "mask_replace_prob must be between 0 and 1"),
    ({"random_replace_prob": 1.2, "mask_replace_prob": 0.0}, "random_replace_prob must be between 0 and 1"),
    ({"mlm": False, "whole_word_mask": True}, "whole_word_mask=True only applies to masked LM"),
]


@pytest.mark.parametrize("kwargs, message", LM_ERRORS)
def test_lm_collator_rejects_bad_arguments(kwargs, message, make_tokenizer):
    with pytest.raises(ValueError, match=message):
        DataCollatorForLanguageModeling(make_tokenizer(), **kwargs)


def test_mlm_needs_a_mask_token(make_tokenizer, simple_tokenizer):
    tokenizer = simple_tokenizer(make_tokenizer())
    tokenizer.mask_token_id = None
    with pytest.raises(ValueError, match="mlm=True needs a mask token.*Pass mlm=False"):
        DataCollatorForLanguageModeling(tokenizer)
    DataCollatorForLanguageModeling(tokenizer, mlm=False)


def test_mlm_needs_to_know_special_tokens(make_tokenizer, simple_tokenizer):
    tokenizer = simple_tokenizer(make_tokenizer())
    del tokenizer.all_special_ids
    collator = DataCollatorForLanguageModeling(tokenizer)
    with pytest.raises(ValueError, match="neither `get_special_tokens_mask` nor `all_special_ids`"):
        collator([[2, 5, 3]])
    collator([{"input_ids": [2, 5, 3], "special_tokens_mask": [1, 0, 1]}])


def test_pad_sequences_without_pad_token(make_tokenizer, simple_tokenizer):
    tokenizer = simple_tokenizer(make_tokenizer())
    tokenizer.pad_token_id = None
    assert pad_sequences(tokenizer, [[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    with pytest.raises(ValueError, match="different lengths and the tokenizer .* has no pad token"):
        pad_sequences(tokenizer, [[1, 2], [3]])
