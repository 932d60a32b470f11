"""Tiny helpers several modules need (kept here so there is one of each)."""

from __future__ import annotations

from typing import Any


def enum_value(value: Any) -> Any:
    """The plain value of a str enum member (HF's arguments accept both), or ``value`` itself."""
    return getattr(value, "value", value)


def has_len(obj: Any) -> bool:
    """Whether ``len(obj)`` works (map-style datasets and loaders; not iterable datasets)."""
    try:
        len(obj)
    except (TypeError, AttributeError):
        return False
    return True


def unwrap_model(model: Any) -> Any:
    """The model inside a wrapper that keeps it under ``.module`` (DDP, DataParallel, ours), or ``model`` itself."""
    return getattr(model, "module", model)
