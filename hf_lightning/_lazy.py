"""Lazy package attributes (PEP 562), so importing a pure module never loads Lightning through a package.

``import hf_lightning.flow`` runs ``hf_lightning/__init__.py`` first; if that imported the facade eagerly, every
pure module would pay for Lightning (and a Lightning-free process could not use them). A package built with
:func:`lazy_exports` imports a public name's module on first access instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Build a package's module-level ``__getattr__`` and ``__dir__`` from ``{module: public names}``.

    A public name is imported from its module on first access and then stored in the package, so later reads are
    plain attribute lookups. Any other name that is a submodule of the package is imported as Python would on
    ``import package.name``, which keeps ``hf_lightning.trainer`` & co. reachable after ``import hf_lightning``.

    Args:
        package: The package's ``__name__``.
        exports: Module name → the public names it defines.

    Returns:
        ``(__getattr__, __dir__)`` for the package.

    Example:
        >>> __getattr__, __dir__ = lazy_exports(__name__, {"hf_lightning.state": ("TrainerState",)})  # doctest: +SKIP
    """
    origin = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = origin.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module), name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(origin))

    return __getattr__, __dir__
