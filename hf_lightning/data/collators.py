"""Batch collators that give the same tensors as transformers' data collators (5.23).

Every collator returns torch tensors, or numpy arrays with ``return_tensors="np"`` (HF's two options; the
arrays are the torch batch converted, so the masking draws stay torch's). Padding goes through
``tokenizer.pad(...)`` when the tokenizer has one (any HF tokenizer, so the output is exactly HF's ``BatchEncoding``); otherwise a built-in padder is used
that needs only a few attributes of a *tokenizer-like* object:

- ``pad_token_id`` and ``padding_side`` (``"right"`` if missing) -- always;
- ``model_input_names`` (default ``["input_ids", "attention_mask"]``), ``pad_token_type_id`` (default 0) and
  ``model_max_length`` (for ``padding="max_length"`` without ``max_length``) -- optional;
- for masked-LM: ``mask_token_id``, ``__len__`` (vocabulary size for random replacement) and either
  ``get_special_tokens_mask(ids, already_has_special_tokens=True)`` or ``all_special_ids``.

The random draws of :class:`DataCollatorForLanguageModeling` are made in HF's order with HF's shapes, so the
same seed gives bit-identical masks.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "DataCollatorForLanguageModeling",
    "DataCollatorForMultipleChoice",
    "DataCollatorForSeq2Seq",
    "DataCollatorForTokenClassification",
    "DataCollatorWithPadding",
    "DefaultDataCollator",
    "default_data_collator",
    "pad_features",
    "pad_sequences",
]

#: Label value that PyTorch losses (and HF models) skip.
IGNORE_INDEX = -100

# `model_max_length` of a tokenizer without a real limit is a huge sentinel (~1e30); treat it as "no limit".
_NO_LENGTH_LIMIT = int(1e20)


# --------------------------------------------------------------------------------------------------------------
# Shared checks
# --------------------------------------------------------------------------------------------------------------


def _check_return_tensors(return_tensors: Any, owner: str) -> None:
    if return_tensors not in ("pt", "np"):
        raise ValueError(
            f"{owner}: return_tensors={return_tensors!r} is not supported; hf_lightning collators build torch "
            "tensors or numpy arrays. Pass return_tensors='pt' (the default) or 'np'."
        )


def _finish(batch: Any, return_tensors: str) -> Any:
    """The batch as built (torch), or with every tensor as a numpy array for ``return_tensors="np"``."""
    if return_tensors != "np":
        return batch
    return {key: value.numpy() if isinstance(value, torch.Tensor) else value for key, value in batch.items()}


def _padding_mode(padding: Any) -> str:
    """Normalise HF's ``padding`` argument (bool, str or ``PaddingStrategy``) to one of three strings."""
    # PaddingStrategy is a str enum; reading `.value` keeps this module free of transformers.
    value = getattr(padding, "value", padding)
    if value is True or value == "longest":
        return "longest"
    if value is False or value == "do_not_pad":
        return "do_not_pad"
    if value == "max_length":
        return "max_length"
    raise ValueError(
        f"padding={padding!r} is not a padding strategy; use True / 'longest', 'max_length' or False / 'do_not_pad'."
    )


def _round_up(length: int, multiple: int | None) -> int:
    if multiple is None or length % multiple == 0:
        return length
    return (length // multiple + 1) * multiple


def _to_python(value: Any) -> Any:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_to_python(item) for item in value]
    return value


def _has_scalars(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_has_scalars(item) for item in value)
    return True


def _column_to_tensor(name: str, values: list[Any], dtype: torch.dtype | None = None) -> torch.Tensor:
    # An all-empty column would default to float32; HF makes it int64 because it holds (absent) token ids.
    if dtype is None and not _has_scalars(values):
        dtype = torch.int64
    try:
        return torch.tensor(values, dtype=dtype)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"Could not turn the batch column {name!r} into a tensor ({error}). Its rows must be numbers or "
            "equal-length lists: enable padding (padding=True or 'max_length'), or drop the column (e.g. keep "
            "remove_unused_columns=True)."
        ) from error


# --------------------------------------------------------------------------------------------------------------
# Padding
# --------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _fast_tokenizer_pad_warning_silenced(tokenizer: Any) -> Iterator[None]:
    # HF fast tokenizers warn once that `pad` after encoding is slower than padding while encoding; HF's own
    # collators switch that warning off around the call, so the logs look the same as HF's here.
    flags = getattr(tokenizer, "deprecation_warnings", None)
    if not isinstance(flags, dict):
        yield
        return
    key = "Asking-to-pad-a-fast-tokenizer"
    previous = flags.get(key, False)
    flags[key] = True
    try:
        yield
    finally:
        flags[key] = previous


def _model_input_names(tokenizer: Any) -> list[str]:
    names = getattr(tokenizer, "model_input_names", None)
    return list(names) if names else ["input_ids", "attention_mask"]


def _require_pad_token_id(tokenizer: Any) -> int:
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None or pad_id < 0:
        raise ValueError(
            f"The tokenizer ({type(tokenizer).__name__}) has no pad token, so the batch cannot be padded. Set one "
            "(e.g. `tokenizer.pad_token = tokenizer.eos_token`) or give it a `pad_token_id`."
        )
    return pad_id


def _target_length(tokenizer: Any, lengths: list[int], mode: str, max_length: int | None) -> int | None:
    if mode == "do_not_pad":
        return None
    if mode == "longest":
        return max(lengths)
    if max_length is not None:
        return max_length
    limit = getattr(tokenizer, "model_max_length", None)
    if limit is None or limit > _NO_LENGTH_LIMIT:
        raise ValueError(
            "padding='max_length' needs a length: pass max_length=... to the collator, or give the tokenizer a "
            "finite `model_max_length`."
        )
    return int(limit)


def _builtin_pad(
    tokenizer: Any,
    features: Sequence[Mapping[str, Any]],
    padding: Any,
    max_length: int | None,
    pad_to_multiple_of: int | None,
) -> dict[str, torch.Tensor]:
    input_names = _model_input_names(tokenizer)
    main = input_names[0]
    columns = {key: [_to_python(feature[key]) for feature in features] for key in features[0].keys()}
    if main not in columns:
        raise ValueError(
            f"Cannot pad: the examples have no {main!r} key (they have {sorted(columns)}). Tokenize the dataset "
            "first, or use default_data_collator for already-padded data."
        )
    sequences = columns[main]
    lengths = [len(seq) for seq in sequences]
    mode = _padding_mode(padding)
    target = _target_length(tokenizer, lengths, mode, max_length)

    if "attention_mask" in input_names and "attention_mask" not in columns:
        columns["attention_mask"] = [[1] * n for n in lengths]

    if target is not None:
        pad_id = _require_pad_token_id(tokenizer)
        target = _round_up(target, pad_to_multiple_of)
        fills = {
            main: pad_id,
            "attention_mask": 0,
            "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0),
            "special_tokens_mask": 1,
        }
        left = getattr(tokenizer, "padding_side", "right") == "left"
        for key, fill in fills.items():
            if key not in columns:
                continue
            # Every padded column grows by the main input's shortfall, as HF's tokenizer `pad` does.
            columns[key] = [
                ([fill] * (target - n) + row) if left else (row + [fill] * (target - n))
                for row, n in zip(columns[key], lengths)
            ]
    return {key: _column_to_tensor(key, values) for key, values in columns.items()}


def pad_features(
    tokenizer: Any,
    features: Sequence[Mapping[str, Any]],
    padding: Any = True,
    max_length: int | None = None,
    pad_to_multiple_of: int | None = None,
) -> Mapping[str, torch.Tensor]:
    """Pad a list of tokenized examples into a batch of tensors.

    With an HF tokenizer this is ``tokenizer.pad(features, ..., return_tensors="pt")`` (its ``BatchEncoding`` is
    returned as is). With a tokenizer-like object without ``pad``, the built-in padder pads the main input with
    ``pad_token_id``, ``attention_mask`` with 0 (adding it when the tokenizer's inputs include it),
    ``token_type_ids`` with ``pad_token_type_id`` and ``special_tokens_mask`` with 1, on ``padding_side``; every
    other key is converted to a tensor unpadded.

    Args:
        tokenizer: An HF tokenizer or a tokenizer-like object (see the module docstring).
        features: One mapping per example.
        padding: ``True``/``"longest"``, ``"max_length"`` or ``False``/``"do_not_pad"``.
        max_length: Target length for ``padding="max_length"``.
        pad_to_multiple_of: Round the padded length up to a multiple of this.

    Returns:
        A mapping of column name to tensor.

    Raises:
        ValueError: No examples, no tokenizer, no main input key, no pad token while padding, or a column that
            cannot be stacked into a tensor.
    """
    if len(features) == 0:
        raise ValueError("Cannot collate an empty list of examples.")
    if tokenizer is None:
        raise ValueError(
            "Padding needs a tokenizer (or a tokenizer-like object with `pad_token_id` and `padding_side`), got "
            "None. Pass the tokenizer, or use default_data_collator for examples that are already padded."
        )
    pad = getattr(tokenizer, "pad", None)
    if callable(pad):
        with _fast_tokenizer_pad_warning_silenced(tokenizer):
            return pad(
                features,
                padding=padding,
                max_length=max_length,
                pad_to_multiple_of=pad_to_multiple_of,
                return_tensors="pt",
            )
    if not isinstance(features[0], Mapping):
        raise TypeError(
            f"pad_features expects one dict per example, got {type(features[0]).__name__}. Pass a list of dicts "
            "such as {'input_ids': [...]}."
        )
    return _builtin_pad(tokenizer, features, padding, max_length, pad_to_multiple_of)


def pad_sequences(tokenizer: Any, examples: Sequence[Any], pad_to_multiple_of: int | None = None) -> torch.Tensor:
    """Stack bare token-id sequences into a ``(batch, length)`` tensor, padding only when needed.

    Lists, tuples and numpy arrays become int64 tensors; tensors keep their dtype. Shorter rows are padded
    with ``tokenizer.pad_token_id`` on ``tokenizer.padding_side`` (this path never calls ``tokenizer.pad``, as
    in HF).

    Args:
        tokenizer: Anything with ``pad_token_id`` (and ``padding_side``, default ``"right"``).
        examples: One sequence of token ids per example.
        pad_to_multiple_of: Round the length up to a multiple of this.

    Returns:
        The batch tensor.

    Raises:
        ValueError: The rows need padding and the tokenizer has no pad token.
    """
    if len(examples) == 0:
        raise ValueError("Cannot collate an empty list of examples.")
    rows = [
        torch.tensor(example, dtype=torch.long) if isinstance(example, (list, tuple, np.ndarray)) else example
        for example in examples
    ]
    longest = max(row.size(0) for row in rows)
    if all(row.size(0) == longest for row in rows) and _round_up(longest, pad_to_multiple_of) == longest:
        return torch.stack(rows, dim=0)
    if getattr(tokenizer, "pad_token_id", None) is None:
        raise ValueError(
            f"The examples have different lengths and the tokenizer ({type(tokenizer).__name__}) has no pad "
            "token to pad them with. Set one (e.g. `tokenizer.pad_token = tokenizer.eos_token`)."
        )
    length = _round_up(longest, pad_to_multiple_of)
    batch = rows[0].new_full((len(rows), length), tokenizer.pad_token_id)
    left = getattr(tokenizer, "padding_side", "right") == "left"
    for i, row in enumerate(rows):
        if left:
            batch[i, length - row.size(0) :] = row
        else:
            batch[i, : row.size(0)] = row
    return batch


def _pad_labels(rows: Sequence[Any], length: int, fill: int, padding_side: str) -> list[list[Any]]:
    padded = []
    for row in rows:
        values = _to_python(row)
        filler = [fill] * (length - len(values))
        padded.append(filler + values if padding_side == "left" else values + filler)
    return padded


# --------------------------------------------------------------------------------------------------------------
# default_data_collator
# --------------------------------------------------------------------------------------------------------------


def _is_integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer))


def default_data_collator(features: list[Any], return_tensors: str = "pt") -> dict[str, Any]:
    """Stack already-padded examples into a batch, HF's ``default_data_collator``.

    The first example decides which keys exist. Examples that are not mappings are read with ``vars()``.
    ``label`` (a scalar) becomes ``labels`` (int64 for integers, float32 otherwise); failing that,
    ``label_ids`` becomes ``labels`` the same way. Every other key whose first value is neither ``None`` nor a
    string is stacked (tensors with ``torch.stack``, numpy arrays via ``np.stack``, anything else with
    ``torch.tensor``); string keys are dropped.

    Args:
        features: The examples.
        return_tensors: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).

    Returns:
        The batch as a dict of tensors.

    Raises:
        ValueError: ``return_tensors`` other than ``"pt"`` / ``"np"``, or no examples.

    Example:
        >>> default_data_collator([{"x": [1.0, 2.0], "label": 0}, {"x": [3.0, 4.0], "label": 1}])["labels"]
        tensor([0, 1])
    """
    _check_return_tensors(return_tensors, "default_data_collator")
    if len(features) == 0:
        raise ValueError("default_data_collator got an empty list of examples.")
    if return_tensors == "np":
        return _numpy_default_data_collator(features)
    if not isinstance(features[0], Mapping):
        features = [vars(feature) for feature in features]
    first = features[0]
    batch: dict[str, Any] = {}

    if first.get("label") is not None:
        label = first["label"]
        label = label.item() if isinstance(label, torch.Tensor) else label
        dtype = torch.long if _is_integer(label) else torch.float
        batch["labels"] = torch.tensor([feature["label"] for feature in features], dtype=dtype)
    elif first.get("label_ids") is not None:
        label_ids = first["label_ids"]
        if isinstance(label_ids, torch.Tensor):
            batch["labels"] = torch.stack([feature["label_ids"] for feature in features])
        else:
            dtype = torch.long if _is_integer(label_ids[0]) else torch.float
            batch["labels"] = torch.tensor([feature["label_ids"] for feature in features], dtype=dtype)

    for key, value in first.items():
        if key in ("label", "label_ids") or value is None or isinstance(value, str):
            continue
        column = [feature[key] for feature in features]
        if isinstance(value, torch.Tensor):
            batch[key] = torch.stack(column)
        elif isinstance(value, np.ndarray):
            batch[key] = torch.from_numpy(np.stack(column))
        else:
            batch[key] = torch.tensor(column)
    return batch


def _numpy_default_data_collator(features: list[Any]) -> dict[str, Any]:
    """HF's numpy variant: the same keys, ``np.array`` / ``np.stack`` (so float lists stay float64)."""
    if not isinstance(features[0], Mapping):
        features = [vars(feature) for feature in features]
    first = features[0]
    batch: dict[str, Any] = {}
    if first.get("label") is not None:
        label = first["label"].item() if isinstance(first["label"], np.ndarray) else first["label"]
        dtype = np.int64 if _is_integer(label) else np.float32
        batch["labels"] = np.array([feature["label"] for feature in features], dtype=dtype)
    elif first.get("label_ids") is not None:
        if isinstance(first["label_ids"], np.ndarray):
            batch["labels"] = np.stack([feature["label_ids"] for feature in features])
        else:
            dtype = np.int64 if _is_integer(first["label_ids"][0]) else np.float32
            batch["labels"] = np.array([feature["label_ids"] for feature in features], dtype=dtype)
    for key, value in first.items():
        if key in ("label", "label_ids") or value is None or isinstance(value, str):
            continue
        column = [feature[key] for feature in features]
        batch[key] = np.stack(column) if isinstance(value, np.ndarray) else np.array(column)
    return batch


@dataclass
class DefaultDataCollator:
    """:func:`default_data_collator` as an object (HF's ``DefaultDataCollator``).

    Args:
        return_tensors: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).
    """

    return_tensors: str = "pt"

    def __post_init__(self) -> None:
        _check_return_tensors(self.return_tensors, type(self).__name__)

    def __call__(self, features: list[Any], return_tensors: str | None = None) -> dict[str, Any]:
        return default_data_collator(features, return_tensors or self.return_tensors)


class _TensorCollator:
    """``__call__(features, return_tensors=None)`` routed to ``torch_call``, like HF's ``DataCollatorMixin``."""

    return_tensors: str

    def __call__(self, features: list[Any], return_tensors: str | None = None) -> dict[str, Any]:
        return_tensors = return_tensors or self.return_tensors
        _check_return_tensors(return_tensors, type(self).__name__)
        return _finish(self.torch_call(features), return_tensors)


# --------------------------------------------------------------------------------------------------------------
# Padding collators
# --------------------------------------------------------------------------------------------------------------


@dataclass
class DataCollatorWithPadding:
    """Pad tokenized examples to a common length (HF's ``DataCollatorWithPadding``).

    ``label`` and ``label_ids`` columns are renamed ``labels``.

    Args:
        tokenizer: An HF tokenizer or a tokenizer-like object (see the module docstring).
        padding: ``True``/``"longest"`` (default), ``"max_length"`` or ``False``/``"do_not_pad"``.
        max_length: Target length for ``padding="max_length"``.
        pad_to_multiple_of: Round the padded length up to a multiple of this.
        return_tensors: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).
    """

    tokenizer: Any
    padding: Any = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __post_init__(self) -> None:
        _check_return_tensors(self.return_tensors, type(self).__name__)
        _padding_mode(self.padding)

    def __call__(self, features: list[Mapping[str, Any]]) -> Mapping[str, Any]:
        batch = pad_features(
            self.tokenizer,
            features,
            padding=self.padding,
            max_length=self.max_length,
            pad_to_multiple_of=self.pad_to_multiple_of,
        )
        for old_name in ("label", "label_ids"):
            if old_name in batch:
                batch["labels"] = batch.pop(old_name)
        return _finish(batch, self.return_tensors)


@dataclass
class DataCollatorForTokenClassification(_TensorCollator):
    """Pad inputs and per-token labels (HF's ``DataCollatorForTokenClassification``).

    Labels are padded to the padded ``input_ids`` length with ``label_pad_token_id`` on the tokenizer's
    padding side and returned as int64 under their original key (``label`` or ``labels``).

    Args:
        tokenizer: An HF tokenizer or a tokenizer-like object (see the module docstring).
        padding: ``True``/``"longest"`` (default), ``"max_length"`` or ``False``/``"do_not_pad"``.
        max_length: Target length for ``padding="max_length"``.
        pad_to_multiple_of: Round the padded length up to a multiple of this.
        label_pad_token_id: Value for padded label positions.
        return_tensors: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).
    """

    tokenizer: Any
    padding: Any = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    label_pad_token_id: int = IGNORE_INDEX
    return_tensors: str = "pt"

    def __post_init__(self) -> None:
        _check_return_tensors(self.return_tensors, type(self).__name__)
        _padding_mode(self.padding)

    def torch_call(self, features: list[Mapping[str, Any]]) -> Mapping[str, Any]:
        """Collate ``features`` into a batch of tensors."""
        label_name = "label" if "label" in features[0] else "labels"
        labels = [feature[label_name] for feature in features] if label_name in features[0] else None
        inputs = [{k: v for k, v in feature.items() if k != label_name} for feature in features]
        batch = pad_features(
            self.tokenizer,
            inputs,
            padding=self.padding,
            max_length=self.max_length,
            pad_to_multiple_of=self.pad_to_multiple_of,
        )
        if labels is None:
            return batch
        length = batch["input_ids"].shape[1]
        side = getattr(self.tokenizer, "padding_side", "right")
        padded = _pad_labels(labels, length, self.label_pad_token_id, side)
        batch[label_name] = torch.tensor(padded, dtype=torch.int64)
        return batch


@dataclass
class DataCollatorForSeq2Seq:
    """Pad encoder inputs and target labels for sequence-to-sequence models (HF's ``DataCollatorForSeq2Seq``).

    Inputs are padded through the tokenizer; labels (key ``label`` or ``labels``) are padded separately to the
    longest label (or ``max_length`` when ``padding="max_length"``), rounded up to ``pad_to_multiple_of``, with
    ``label_pad_token_id`` on the tokenizer's padding side, and returned as int64 ``labels``. Without labels
    the batch holds ``labels=None``. When ``model`` has ``prepare_decoder_input_ids_from_labels``, the batch also
    gets ``decoder_input_ids`` from it.

    Args:
        tokenizer: An HF tokenizer or a tokenizer-like object (see the module docstring).
        model: Optional model providing ``prepare_decoder_input_ids_from_labels(labels=...)``.
        padding: ``True``/``"longest"`` (default), ``"max_length"`` or ``False``/``"do_not_pad"``.
        max_length: Target length for ``padding="max_length"``.
        pad_to_multiple_of: Round the padded length up to a multiple of this.
        label_pad_token_id: Value for padded label positions.
        return_tensors: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).
    """

    tokenizer: Any
    model: Any | None = None
    padding: Any = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    label_pad_token_id: int = IGNORE_INDEX
    return_tensors: str = "pt"

    def __post_init__(self) -> None:
        _check_return_tensors(self.return_tensors, type(self).__name__)
        _padding_mode(self.padding)

    def __call__(self, features: list[Mapping[str, Any]], return_tensors: str | None = None) -> Mapping[str, Any]:
        return_tensors = return_tensors or self.return_tensors
        _check_return_tensors(return_tensors, type(self).__name__)
        return _finish(self._collate(features), return_tensors)

    def _collate(self, features: list[Mapping[str, Any]]) -> Mapping[str, Any]:
        label_name = "label" if "label" in features[0] else "labels"
        labels = [feature[label_name] for feature in features] if label_name in features[0] else None
        # `{"labels": None}` rows (e.g. a test split) mean "no labels", not a column of Nones.
        if labels is not None and all(label is None for label in labels):
            labels = None
        inputs = [{k: v for k, v in feature.items() if k != label_name} for feature in features]
        batch = pad_features(
            self.tokenizer,
            inputs,
            padding=self.padding,
            max_length=self.max_length,
            pad_to_multiple_of=self.pad_to_multiple_of,
        )

        if labels is None:
            batch["labels"] = None
            return batch

        mode = _padding_mode(self.padding)
        if mode == "do_not_pad":
            rows = [_to_python(label) for label in labels]
        else:
            if mode == "max_length" and self.max_length is not None:
                length = self.max_length
            else:
                length = max(len(label) for label in labels)
            length = _round_up(length, self.pad_to_multiple_of)
            side = getattr(self.tokenizer, "padding_side", "right")
            rows = _pad_labels(labels, length, self.label_pad_token_id, side)
        batch["labels"] = _column_to_tensor("labels", rows, dtype=torch.int64)

        prepare = getattr(self.model, "prepare_decoder_input_ids_from_labels", None)
        if self.model is not None and prepare is not None:
            batch["decoder_input_ids"] = prepare(labels=batch["labels"])
        return batch


@dataclass
class DataCollatorForMultipleChoice(_TensorCollator):
    """Pad every choice of every example to one length (HF's ``DataCollatorForMultipleChoice``).

    Each example holds one list per input key (a row per choice) and a scalar ``label``/``labels``. All choices
    are padded together through the tokenizer and returned as ``(batch, choices, length)``; labels as int64
    ``labels``.

    Args:
        tokenizer: An HF tokenizer or a tokenizer-like object (see the module docstring).
        padding: ``True``/``"longest"`` (default), ``"max_length"`` or ``False``/``"do_not_pad"``.
        max_length: Target length for ``padding="max_length"``.
        pad_to_multiple_of: Round the padded length up to a multiple of this.
        return_tensors: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).
    """

    tokenizer: Any
    padding: Any = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __post_init__(self) -> None:
        _check_return_tensors(self.return_tensors, type(self).__name__)
        _padding_mode(self.padding)

    def torch_call(self, features: list[Mapping[str, Any]]) -> Mapping[str, Any]:
        """Collate ``features`` into ``(batch, choices, length)`` tensors plus ``labels``."""
        label_name = "label" if "label" in features[0] else "labels"
        labels = [feature[label_name] for feature in features]
        num_choices = len(features[0]["input_ids"])
        flat = [{key: value[i] for key, value in feature.items() if key != label_name}
                for feature in features for i in range(num_choices)]
        padded = pad_features(self.tokenizer, flat, padding=self.padding, max_length=self.max_length,
                              pad_to_multiple_of=self.pad_to_multiple_of)
        batch = {key: value.view(len(features), num_choices, -1) for key, value in padded.items()}
        batch["labels"] = torch.tensor(labels, dtype=torch.int64)
        return batch


# --------------------------------------------------------------------------------------------------------------
# Language modeling
# --------------------------------------------------------------------------------------------------------------


def _special_tokens_mask(tokenizer: Any, rows: list[list[int]]) -> list[list[int]]:
    getter = getattr(tokenizer, "get_special_tokens_mask", None)
    if callable(getter):
        return [getter(row, already_has_special_tokens=True) for row in rows]
    special_ids = getattr(tokenizer, "all_special_ids", None)
    if special_ids is None:
        raise ValueError(
            f"Masked-LM needs to know which tokens are special, but the tokenizer ({type(tokenizer).__name__}) has "
            "neither `get_special_tokens_mask` nor `all_special_ids`. Add one of them, or put a "
            "'special_tokens_mask' in every example."
        )
    special = set(special_ids)
    return [[1 if token in special else 0 for token in row] for row in rows]


def _whole_word_ids(offsets: torch.Tensor, special: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Word index of each token (``-1`` for special tokens) and which tokens do not start a word.

    A non-special token starts a new word when it does not touch the previous token's end offset, or when the
    previous token is special.
    """
    starts, ends = offsets[..., 0], offsets[..., 1]
    previous_end = torch.roll(ends, 1, dims=1)
    previous_end[:, 0] = -1
    previous_special = torch.roll(special, 1, dims=1)
    previous_special[:, 0] = False
    starts_word = ~special & ((starts != previous_end) | previous_special)
    word_ids = torch.cumsum(starts_word.long(), dim=1)
    word_ids[special] = -1
    return word_ids, ~starts_word


def _spread_to_whole_words(word_ids: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    valid = word_ids != -1
    same_word = (word_ids[:, :, None] == word_ids[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    return (same_word & selected[:, None, :]).any(dim=-1)


@dataclass
class DataCollatorForLanguageModeling(_TensorCollator):
    """Batches for masked (``mlm=True``) or causal (``mlm=False``) language modeling, HF's collator.

    Dict examples are padded through the tokenizer; bare sequences are stacked (padded with the pad token when
    their lengths differ). A ``special_tokens_mask`` column is used and removed.

    - ``mlm=False``: ``labels`` is a copy of ``input_ids`` with pad-token positions set to -100 (so with
      pad == eos, EOS positions are ignored too). Shifting is left to the model.
    - ``mlm=True``: each non-special token is selected with probability ``mlm_probability``; labels are -100
      elsewhere. Of the selected tokens, ``mask_replace_prob`` become the mask token, ``random_replace_prob``
      (of all selected) a random id in ``[0, len(tokenizer))``, the rest stay. The draws use a private generator
      seeded with ``seed`` (``seed + worker id`` inside a DataLoader worker) or, without ``seed``, the global
      torch RNG -- in HF's order, so results are bit-identical to HF's.
    - ``whole_word_mask=True``: needs an ``offset_mapping`` column (tokenize with
      ``return_offsets_mapping=True``); selection is per word and every selected token is masked.

    Args:
        tokenizer: An HF tokenizer or a tokenizer-like object (see the module docstring).
        mlm: Masked (True) or causal (False) language modeling.
        whole_word_mask: Mask whole words instead of single tokens.
        mlm_probability: Selection probability per token for ``mlm=True``.
        mask_replace_prob: Share of selected tokens replaced by the mask token.
        random_replace_prob: Share of selected tokens replaced by a random token.
        pad_to_multiple_of: Round the padded length up to a multiple of this.
        return_tensors: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).
        seed: Seed of a private generator for the masking draws; ``None`` uses the global torch RNG.

    Raises:
        ValueError: At construction, for a missing mask token with ``mlm=True``, probabilities outside [0, 1]
            or summing to more than 1, or ``whole_word_mask`` without ``mlm``.
    """

    tokenizer: Any
    mlm: bool = True
    whole_word_mask: bool = False
    mlm_probability: float | None = 0.15
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_return_tensors(self.return_tensors, type(self).__name__)
        if self.mlm:
            if getattr(self.tokenizer, "mask_token_id", None) is None:
                raise ValueError(
                    "mlm=True needs a mask token, but the tokenizer has none (mask_token_id is None). Pass mlm=False "
                    "for causal language modeling, or add a mask token to the tokenizer."
                )
            if self.mlm_probability is None or not 0 <= self.mlm_probability <= 1:
                raise ValueError(f"mlm_probability must be between 0 and 1, got {self.mlm_probability!r}.")
            self.mlm_probability = float(self.mlm_probability)
        elif self.whole_word_mask:
            raise ValueError("whole_word_mask=True only applies to masked LM; set mlm=True or whole_word_mask=False.")
        if not 0 <= self.mask_replace_prob <= 1:
            raise ValueError(f"mask_replace_prob must be between 0 and 1, got {self.mask_replace_prob!r}.")
        if not 0 <= self.random_replace_prob <= 1:
            raise ValueError(f"random_replace_prob must be between 0 and 1, got {self.random_replace_prob!r}.")
        if self.mask_replace_prob + self.random_replace_prob > 1:
            raise ValueError(
                f"mask_replace_prob + random_replace_prob must not exceed 1, got {self.mask_replace_prob} + "
                f"{self.random_replace_prob}."
            )
        if self.whole_word_mask:
            if getattr(self.tokenizer, "is_fast", True) is False:
                warnings.warn(
                    "whole_word_mask relies on offset mappings, which only fast tokenizers produce.", UserWarning
                )
            if self.mask_replace_prob < 1:
                # HF forces this too: a word is masked as a unit, never partly replaced by random tokens.
                warnings.warn("whole_word_mask masks every selected token; setting mask_replace_prob=1.", UserWarning)
                self.mask_replace_prob = 1
                self.random_replace_prob = 0
        self.mask_replace_prob = float(self.mask_replace_prob)
        self.random_replace_prob = float(self.random_replace_prob)
        self.generator: torch.Generator | None = None

    def _make_generator(self) -> torch.Generator:
        # DataLoader workers each get `seed + worker id`, so workers do not repeat each other's masks.
        worker = torch.utils.data.get_worker_info()
        offset = worker.id if worker is not None else 0
        return torch.Generator().manual_seed(self.seed + offset)

    def torch_call(self, examples: list[Any]) -> Mapping[str, Any]:
        """Collate ``examples`` and add ``labels`` (and the masking for ``mlm=True``)."""
        if self.seed is not None and self.generator is None:
            self.generator = self._make_generator()
        if len(examples) == 0:
            raise ValueError("Cannot collate an empty list of examples.")
        if isinstance(examples[0], Mapping):
            batch = pad_features(self.tokenizer, examples, pad_to_multiple_of=self.pad_to_multiple_of)
        else:
            batch = {"input_ids": pad_sequences(self.tokenizer, examples, self.pad_to_multiple_of)}

        special_tokens_mask = batch.pop("special_tokens_mask", None)
        offset_mapping = batch.pop("offset_mapping", None)
        if self.mlm:
            batch["input_ids"], batch["labels"] = self.torch_mask_tokens(
                batch["input_ids"], special_tokens_mask=special_tokens_mask, offset_mapping=offset_mapping
            )
        else:
            labels = batch["input_ids"].clone()
            pad_id = getattr(self.tokenizer, "pad_token_id", None)
            if pad_id is not None:
                labels[labels == pad_id] = IGNORE_INDEX
            batch["labels"] = labels
        return batch

    def torch_mask_tokens(
        self,
        inputs: torch.Tensor,
        special_tokens_mask: Any | None = None,
        offset_mapping: Any | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask ``inputs`` in place for MLM and return ``(inputs, labels)``.

        Args:
            inputs: ``(batch, length)`` token ids; modified in place.
            special_tokens_mask: 1 where a token must never be selected; computed from the tokenizer if None.
            offset_mapping: ``(batch, length, 2)`` character offsets, required for ``whole_word_mask``.

        Returns:
            The masked inputs and the labels (-100 where nothing is predicted).
        """
        labels = inputs.clone()
        if special_tokens_mask is None:
            special_tokens_mask = _special_tokens_mask(self.tokenizer, labels.tolist())
        if isinstance(special_tokens_mask, torch.Tensor):
            special = special_tokens_mask.bool()
        else:
            special = torch.tensor(special_tokens_mask, dtype=torch.bool)

        word_ids = None
        never_select = special
        if self.whole_word_mask:
            if offset_mapping is None:
                raise ValueError(
                    "whole_word_mask=True needs an 'offset_mapping' column in every example: tokenize with "
                    "return_offsets_mapping=True."
                )
            offsets = torch.as_tensor(_to_python(offset_mapping), dtype=torch.long)
            word_ids, never_select = _whole_word_ids(offsets, special)

        # Draw order and shapes follow HF exactly (selection, [MASK], random choice, random ids) so that the
        # same seed, or the same global RNG state, yields the same batch.
        probability = torch.full(labels.shape, self.mlm_probability)
        probability.masked_fill_(never_select, value=0.0)
        selected = torch.bernoulli(probability, generator=self.generator).bool()
        if word_ids is not None:
            selected = _spread_to_whole_words(word_ids, selected)
        labels[~selected] = IGNORE_INDEX

        to_mask = torch.bernoulli(torch.full(labels.shape, self.mask_replace_prob), generator=self.generator).bool()
        to_mask &= selected
        inputs[to_mask] = self.tokenizer.mask_token_id
        if self.mask_replace_prob == 1 or self.random_replace_prob == 0:
            return inputs, labels

        # `random_replace_prob` is a share of all selected tokens; here it applies to those not masked.
        share_of_rest = self.random_replace_prob / (1 - self.mask_replace_prob)
        to_randomize = torch.bernoulli(torch.full(labels.shape, share_of_rest), generator=self.generator).bool()
        to_randomize &= selected & ~to_mask
        random_ids = torch.randint(len(self.tokenizer), labels.shape, dtype=torch.long, generator=self.generator)
        inputs[to_randomize] = random_ids[to_randomize]
        return inputs, labels
