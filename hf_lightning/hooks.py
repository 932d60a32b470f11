"""The override points: HF ``Trainer`` methods that the module and the flow callback call on a ``hooks`` object.

HF's Trainer calls its own ``_prepare_inputs`` / ``_prepare_input``, ``compute_loss``, ``training_step``,
``prediction_step``, ``create_optimizer``, ``create_scheduler``, ``log``, ``evaluate`` and ``_load_from_checkpoint``
at fixed points of its loop, and users subclass it to change them.
:class:`~hf_lightning.module.HFLightningModule` and :class:`~hf_lightning.callbacks.HFFlowCallback` call the same
names at the same points on the object given as ``hooks=``: the HF-style ``Trainer`` facade passes itself, so a
subclass's override is used exactly where HF uses it. Without ``hooks`` the module and the flow callback use their
own implementations (the module's ``compute_loss`` / ``hf_training_step`` / ..., the flow callback's ``hf_log`` /
``evaluate``).

Everything else the two pieces need from their creator is an explicit constructor argument (for the module
``loss_is_scaled_for_ga`` and ``hooks_call_hf_training_step``, for the flow callback
``eval_loss_full_batch_weight``, ``step_end`` for a ``_maybe_log_save_evaluate`` override and ``write_model``
for a ``save_model`` / ``_save`` override), never an attribute read from ``hooks``. The other way round, the module reports
HF's per-micro-batch events to an :class:`EventSink` (the flow callback).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn


class TrainerHooks(Protocol):
    """The HF-named methods a ``hooks`` object provides; ``hf_lightning.Trainer`` implements all of them.

    Each method has HF's signature and is called where HF's Trainer calls it.
    """

    def _prepare_input(self, data: Any) -> Any:
        """Tensors anywhere in ``data`` on the training device (containers kept); called by ``_prepare_inputs``."""
        ...

    def _prepare_inputs(self, inputs: dict) -> dict:
        """One batch, as the default ``training_step`` / ``prediction_step`` hand it to the model."""
        ...

    def compute_loss(self, model: nn.Module, inputs: dict, return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | None = None) -> Any:
        """The loss of one micro-batch (and the outputs when ``return_outputs``); training and evaluation."""
        ...

    def training_step(self, model: nn.Module, inputs: dict,
                      num_items_in_batch: torch.Tensor | None = None) -> torch.Tensor:
        """One micro-batch's forward, loss scaling and backward; returns the detached loss."""
        ...

    def prediction_step(self, model: nn.Module, inputs: dict, prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> tuple[Any, Any, Any]:
        """``(loss, logits, labels)`` of one evaluation batch."""
        ...

    def create_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer, built once when ``fit`` configures optimizers."""
        ...

    def create_scheduler(self, num_training_steps: int) -> Any:
        """The LR scheduler over ``num_training_steps`` optimizer steps (it reads the optimizer it was given)."""
        ...

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """HF's ``log``: add ``epoch``, append to ``state.log_history``, fire ``on_log``."""
        ...

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """The evaluation the flow runs when ``should_evaluate`` is raised; returns the metrics."""
        ...


    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        """Load a checkpoint folder's model weights when training resumes from it."""
        ...


class EventSink(Protocol):
    """Receives HF's per-window callback events from the module (the flow callback implements it)."""

    def on_hf_event(self, event: str, **kwargs: Any) -> None:
        """``on_step_begin`` / ``on_substep_end`` / ``on_pre_optimizer_step`` / ``on_optimizer_step`` /
        ``on_prediction_step``, or ``on_micro_batch_end`` with the micro-batch's ``inputs`` and ``loss``."""
        ...

    def stop_requested(self) -> bool:
        """Whether a callback raised ``should_epoch_stop`` / ``should_training_stop``."""
        ...
