"""HF's callback API (``TrainerCallback`` & co.) and the Lightning callback that carries out HF's flow."""

from hf_lightning.callbacks.hf_api import (
    CallbackHandler,
    DefaultFlowCallback,
    EarlyStoppingCallback,
    PrinterCallback,
    ProgressCallback,
    TrainerCallback,
)
from hf_lightning.callbacks.training_flow import HFFlowCallback

__all__ = [
    "CallbackHandler",
    "DefaultFlowCallback",
    "EarlyStoppingCallback",
    "HFFlowCallback",
    "PrinterCallback",
    "ProgressCallback",
    "TrainerCallback",
]
