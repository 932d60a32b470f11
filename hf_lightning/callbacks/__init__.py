"""HF's callback API (``TrainerCallback`` & co.) and the Lightning callback that carries out HF's flow."""

from typing import TYPE_CHECKING

from hf_lightning._lazy import lazy_exports

if TYPE_CHECKING:
    from hf_lightning.callbacks.hf_api import (
        CallbackHandler,
        DefaultFlowCallback,
        EarlyStoppingCallback,
        PrinterCallback,
        ProgressCallback,
        TrainerCallback,
    )
    from hf_lightning.callbacks.training_flow import HFFlowCallback

# Lazy, so `hf_lightning.callbacks.hf_api` (pure) can be imported without Lightning, which training_flow needs.
__getattr__, __dir__ = lazy_exports(__name__, {
    "hf_lightning.callbacks.hf_api": (
        "CallbackHandler", "DefaultFlowCallback", "EarlyStoppingCallback", "PrinterCallback", "ProgressCallback",
        "TrainerCallback",
    ),
    "hf_lightning.callbacks.training_flow": ("HFFlowCallback",),
})

__all__ = [
    "CallbackHandler",
    "DefaultFlowCallback",
    "EarlyStoppingCallback",
    "HFFlowCallback",
    "PrinterCallback",
    "ProgressCallback",
    "TrainerCallback",
]
