"""What a model's ``forward`` accepts, and dropping the dataset columns it does not (HF 5.23 rules).

HF's Trainer reads the model's ``forward`` signature to decide which dataset columns to keep
(``remove_unused_columns``), which inputs are labels (``label_names``), whether the model can return a loss
without labels, and whether it accepts ``num_items_in_batch``. The same rules live here as plain functions;
``datasets`` and ``peft`` are recognised by duck typing, never imported.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

__all__ = [
    "RemoveColumnsCollator",
    "can_return_loss",
    "find_labels",
    "is_peft_model",
    "model_accepts_loss_kwargs",
    "remove_unused_columns",
    "signature_columns",
    "unwrap_peft_model",
]

log = logging.getLogger(__name__)


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a ``peft`` ``PeftModel`` / ``PeftMixedModel`` (checked by class, peft not imported)."""
    return any(
        cls.__name__ in ("PeftModel", "PeftMixedModel") and cls.__module__.startswith("peft")
        for cls in type(model).__mro__
    )


def unwrap_peft_model(model: nn.Module) -> nn.Module:
    """Return the model inside a PEFT adapter wrapper, or ``model`` itself when it is not one.

    Args:
        model: Any module.

    Returns:
        ``model.get_base_model()`` (or ``model.base_model.model``) for a ``peft`` ``PeftModel`` /
        ``PeftMixedModel``; ``model`` otherwise.
    """
    if not is_peft_model(model):
        return model
    if hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model.base_model.model


def _model_class(model: nn.Module | type) -> type:
    return model if isinstance(model, type) else type(unwrap_peft_model(model))


def signature_columns(model: nn.Module, label_names: Sequence[str] | None = None) -> list[str]:
    """Column names the Trainer keeps: ``forward``'s parameters, then ``label``, ``label_ids`` and the labels.

    Args:
        model: The model (PEFT wrappers are looked through).
        label_names: The run's label names (``args.label_names`` or :func:`find_labels`).

    Returns:
        ``forward``'s parameter names in order (``args``/``kwargs`` included, as in HF), then ``"label"``,
        ``"label_ids"`` and ``label_names``, each extra name once.
    """
    columns = list(inspect.signature(unwrap_peft_model(model).forward).parameters)
    # `label`/`label_ids` are kept because the default collators rename them to `labels`.
    extras = dict.fromkeys(["label", "label_ids", *(label_names or [])])
    return columns + list(extras)


def _ignored_message(ignored: list[str], model_name: str | None, description: str | None) -> str:
    where = "" if description is None else f" in the {description} set"
    owner = f"`{model_name}.forward`" if model_name else "the model's forward"
    return (
        f"The following columns{where} have no matching argument in {owner} and are dropped: "
        f"{', '.join(ignored)}."
    )


def remove_unused_columns(
    dataset: Any,
    columns: Sequence[str],
    description: str | None = None,
    model_name: str | None = None,
) -> Any:
    """Drop a ``datasets.Dataset``'s columns that are not in ``columns`` (HF's ``_remove_unused_columns``).

    Any object with ``column_names`` and ``remove_columns(names)`` works. For other datasets wrap the collator
    in :class:`RemoveColumnsCollator` instead.

    Args:
        dataset: The dataset.
        columns: The columns to keep, usually :func:`signature_columns`.
        description: Which split this is (``"training"``, ``"evaluation"``), for the log message.
        model_name: The model's class name, for the log message.

    Returns:
        ``dataset.remove_columns(<unused columns>)``.

    Raises:
        TypeError: ``dataset`` has no ``column_names`` / ``remove_columns``.
        ValueError: None of the dataset's columns is in ``columns`` (HF's message).
    """
    if not (hasattr(dataset, "column_names") and callable(getattr(dataset, "remove_columns", None))):
        raise TypeError(
            f"remove_unused_columns needs a dataset with `column_names` and `remove_columns` (a datasets.Dataset), "
            f"got {type(dataset).__name__}. Wrap the data collator in RemoveColumnsCollator for other datasets."
        )
    present = list(dataset.column_names)
    keep = set(columns)
    ignored = [name for name in present if name not in keep]
    if ignored:
        log.info(_ignored_message(ignored, model_name, description))
    if not any(name in keep for name in present):
        raise ValueError(
            "No columns in the dataset match the model's forward method signature: "
            f"({', '.join(columns)}). The following columns have been ignored: [{', '.join(ignored)}]. "
            "Please check the dataset and model. You may need to set `remove_unused_columns=False` in "
            "`TrainingArguments`."
        )
    return dataset.remove_columns(ignored)


class RemoveColumnsCollator:
    """Wrap a collator so that each example dict keeps only the given columns before collation.

    Examples that are not ``dict`` instances pass through untouched, as in HF.

    Args:
        data_collator: The collator to call on the filtered examples.
        signature_columns: The columns to keep, usually :func:`signature_columns`.
        logger: Where to report the dropped columns once (``info`` level); None disables the message.
        model_name: The model's class name, for the message.
        description: Which split this is, for the message.
    """

    def __init__(
        self,
        data_collator: Callable[[list[Any]], Any],
        signature_columns: Sequence[str],
        logger: logging.Logger | None = None,
        model_name: str | None = None,
        description: str | None = None,
    ) -> None:
        self.data_collator = data_collator
        self.signature_columns = list(signature_columns)
        self.logger = logger
        self.model_name = model_name
        self.description = description
        self.message_logged = False

    def _filter(self, feature: Any) -> Any:
        if not isinstance(feature, dict):
            return feature
        if not self.message_logged and self.logger is not None and self.model_name:
            ignored = [key for key in feature if key not in self.signature_columns]
            if ignored:
                self.logger.info(_ignored_message(ignored, self.model_name, self.description))
                self.message_logged = True
        return {key: value for key, value in feature.items() if key in self.signature_columns}

    def __call__(self, features: list[Any]) -> Any:
        return self.data_collator([self._filter(feature) for feature in features])


def find_labels(model: nn.Module | type) -> list[str]:
    """HF's default ``label_names``: ``forward`` parameters whose name contains ``"label"``.

    Question-answering classes (class name containing ``"QuestionAnswering"``) also get ``start_positions``
    and ``end_positions``.

    Args:
        model: The model or its class (PEFT wrappers are looked through).

    Returns:
        The label parameter names, in ``forward``'s order.
    """
    cls = _model_class(model)
    params = inspect.signature(cls.forward).parameters
    qa = "QuestionAnswering" in cls.__name__
    return [name for name in params if "label" in name or (qa and name in ("start_positions", "end_positions"))]


def can_return_loss(model: nn.Module | type) -> bool:
    """Whether ``forward`` has a ``return_loss`` parameter defaulting to ``True`` (e.g. CLIP-style models).

    Args:
        model: The model or its class (PEFT wrappers are looked through).

    Returns:
        True when the model computes a loss without labels by default.
    """
    param = inspect.signature(_model_class(model).forward).parameters.get("return_loss")
    return param is not None and param.default is True


def model_accepts_loss_kwargs(model: nn.Module) -> bool:
    """Whether HF passes ``num_items_in_batch`` to the model's ``forward``.

    The model's ``accepts_loss_kwargs`` attribute decides when present; otherwise it is whether ``forward``
    takes ``**kwargs``.

    Args:
        model: The model (PEFT wrappers are looked through; unwrap DDP/FSDP yourself).

    Returns:
        True when the model accepts loss keyword arguments.
    """
    inner = unwrap_peft_model(model)
    if hasattr(inner, "accepts_loss_kwargs"):
        return inner.accepts_loss_kwargs
    params = inspect.signature(inner.forward).parameters.values()
    return any(param.kind is inspect.Parameter.VAR_KEYWORD for param in params)
