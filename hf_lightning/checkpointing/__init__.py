"""HF's ``checkpoint-N`` folders: writing, reading, resuming and rotating them (one job per module).

=================  ==============================================================================================
``layout``         every file / folder name, the one ``checkpoint-N`` pattern (pure)
``errors``         ``CheckpointLoadError``, ``CheckpointSaveError``, ``CheckpointFlushError``
``safe_load``      what may be unpickled and how: ``safe_torch_load``, training arguments, checking a folder
``completeness``   the one "fully written" rule, used by resume and rotation (pure)
``paths``          ``get_last_checkpoint`` (pure)
``model_state``    how a model's state is gathered, written and loaded (the seam for PEFT / FSDP)
``writer``         ``CheckpointContents`` and the crash-safe ``write_checkpoint``; ``save_model_files``
``durability``     ``fsync`` and the background flush queue
``space``          what a checkpoint needs on disk and what is free (for a failed save's error; pure)
``reader``         loading weights, optimizer, scheduler and scaler back
``rng``            RNG states
``rotation``       ``save_total_limit`` (pure)
``io``             ``HFCheckpointIO``, Lightning's ``CheckpointIO`` (the only module importing Lightning)
=================  ==============================================================================================

The names below are importable from this package; each is imported on first use, so importing a pure module
imports neither torch nor Lightning.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CheckpointContents": "writer",
    "CheckpointLoadError": "errors",
    "CheckpointSaveError": "errors",
    "HFCheckpointIO": "io",
    "get_last_checkpoint": "paths",
    "is_complete_checkpoint": "completeness",
    "load_model_weights": "reader",
    "load_training_args": "safe_load",
    "rotate_checkpoints": "rotation",
    "safe_torch_load": "safe_load",
    "save_model_files": "writer",
    "sort_checkpoints": "rotation",
    "write_checkpoint": "writer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    # PEP 562: the module holding `name` is imported when the name is first asked for.
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
