"""``TrainingLog``: HF's training-loss, FLOs and token bookkeeping, and HF's ``log``.

HF's Trainer adds every micro-batch's loss to ``tr_loss`` (under ``logging_nan_inf_filter`` a non-finite loss adds
the running average instead), counts FLOs and input tokens, and at a logging step logs the mean loss since the
last log with ``grad_norm`` and ``learning_rate``. Its ``log`` adds ``epoch`` (and the token count), appends to
``state.log_history`` and fires ``on_log``; here it also hands the numbers to Lightning (``trainer.callback_metrics``
under HF's keys, the loggers under the names HF's TensorBoard callback uses). When training ends it builds HF's
summary entry (``train_runtime``, ``train_loss``, ``total_flos``, ...).

The flow callback decides *when* to log; this class only computes and records.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch

from hf_lightning._utils import unwrap_model
from hf_lightning.callbacks.events import HFEvents
from hf_lightning.callbacks.lightning_metrics import publish
from hf_lightning.optim import current_learning_rate, fit_optimizer_and_scheduler
from hf_lightning.outputs import speed_metrics


class TrainingLog:
    """The numbers HF logs during training and where they go.

    Args:
        events: the run's state, control and callbacks (shared with the flow callback).
        processing_class: its ``pad_token_id`` counts non-padding tokens when there is no attention mask.

    Attributes:
        trainer: the ``lightning.Trainer`` running the fit (set by the flow callback's ``setup``): its loggers
            receive the logs, its strategy reduces the counts across processes.
        start_time: when this ``train()`` call started (``train_runtime`` and the token speed count from it).
    """

    def __init__(self, events: HFEvents, processing_class: Any = None) -> None:
        self.events = events
        self.processing_class = processing_class
        self.trainer: pl.Trainer | None = None
        self.tr_loss: torch.Tensor | None = None
        self.current_flos = 0.0
        self.start()

    def start(self, device: torch.device | str | None = None) -> None:
        """Start the counts of one ``train()`` call from the state it starts at (a resumed state goes on counting).

        Args:
            device: where the running loss sum lives (the model's device); ``None`` before any training.
        """
        state = self.events.state
        self.tr_loss = None if device is None else torch.tensor(0.0, device=device)
        self.total_loss_scalar = 0.0
        self.globalstep_last_logged = self.initial_global_step = state.global_step
        self.initial_tokens_seen = state.num_input_tokens_seen
        self.current_flos = 0.0
        self.last_grad_norm: Any = None
        self.last_learning_rate: float | None = None
        self.start_time = time.time()

    # ------------------------------------------------------------------ per micro-batch / step
    def track_micro_batch(self, module: Any, inputs: Any, loss: torch.Tensor) -> None:
        """Add one micro-batch's loss, FLOs and (with ``include_num_input_tokens_seen``) input tokens."""
        args, state = self.events.args, self.events.state
        tr_loss = self.tr_loss
        if not args.logging_nan_inf_filter:
            self.tr_loss = tr_loss + loss
        elif loss.device.type == "cpu":
            # HF adds the running average instead of a non-finite loss. On the CPU, reading the flag costs no
            # device sync, so it is a plain branch as in HF.
            if bool(torch.isfinite(loss)):
                self.tr_loss = tr_loss + loss
            else:
                self.tr_loss = tr_loss + tr_loss / (1 + state.global_step - self.globalstep_last_logged)
        else:
            # On an accelerator torch.where keeps it sync-free.
            fallback = tr_loss / (1 + state.global_step - self.globalstep_last_logged)
            self.tr_loss = torch.where(torch.isfinite(loss), tr_loss + loss, tr_loss + fallback)
        self.current_flos += module.floating_point_ops(inputs)
        mode = args.include_num_input_tokens_seen
        if mode not in ("no", False, None):
            state.num_input_tokens_seen += _count_tokens(module, inputs, mode, self.processing_class, self.trainer)

    def record_step(self, grad_norm: Any, learning_rate: float | None) -> None:
        """Keep the last optimizer step's gradient norm and learning rate for the next training log."""
        self.last_grad_norm = grad_norm
        self.last_learning_rate = learning_rate

    def has_unlogged_steps(self) -> bool:
        """Whether optimizer steps ran since the last training log (HF logs a step only once)."""
        return self.events.state.global_step > self.globalstep_last_logged

    def training_logs(self) -> dict[str, Any]:
        """HF's logs at a logging step: the mean loss since the last one, ``grad_norm`` and ``learning_rate``.

        Resets the loss sum and stores the FLOs counted so far into the state, as HF does before logging.
        """
        state = self.events.state
        tr_loss_scalar = self._mean_across_processes(self.tr_loss).item()
        self.tr_loss = self.tr_loss - self.tr_loss
        logs: dict[str, Any] = {"loss": tr_loss_scalar / (state.global_step - self.globalstep_last_logged)}
        grad_norm = self.last_grad_norm
        if grad_norm is not None:
            logs["grad_norm"] = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm
        logs["learning_rate"] = (
            self.last_learning_rate if self.last_learning_rate is not None else current_learning_rate(*fit_optimizer_and_scheduler(self.trainer))
        )
        self.total_loss_scalar += tr_loss_scalar
        self.globalstep_last_logged = state.global_step
        self.store_flos()
        return logs

    def summary(self, num_train_samples: int) -> tuple[float, dict[str, Any]]:
        """HF's end-of-training entry: ``(train_loss, metrics)`` over this ``train()`` call's steps.

        Args:
            num_train_samples: samples a full run of ``max_steps`` sees (scaled down to the steps run).
        """
        state = self.events.state
        self.total_loss_scalar += self.tr_loss.item()
        steps = state.global_step - self.initial_global_step
        train_loss = self.total_loss_scalar / max(steps, 0.001)
        metrics = speed_metrics("train", self.start_time,
                                num_samples=num_train_samples * steps / max(state.max_steps, 1), num_steps=steps)
        self.store_flos()
        metrics["total_flos"] = state.total_flos
        metrics["train_loss"] = train_loss
        return train_loss, metrics

    def store_flos(self) -> None:
        """Move the FLOs counted since the last store (summed over processes) into ``state.total_flos``."""
        trainer = self.trainer
        flos = self.current_flos
        if trainer is not None and trainer.world_size > 1:
            flos = float(trainer.strategy.reduce(torch.tensor(flos, dtype=torch.float64), reduce_op="sum"))
        self.events.state.total_flos += flos
        self.current_flos = 0.0

    # ------------------------------------------------------------------ HF's log
    def log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
        """HF's ``Trainer.log``: add ``epoch`` (and token counts), append to ``log_history``, fire ``on_log``.

        Args:
            logs: the values to log (changed in place, as HF does).
            start_time: with ``include_num_input_tokens_seen``, the start of the span the token speed covers.
        """
        args, state = self.events.args, self.events.state
        if state.epoch is not None:
            logs["epoch"] = state.epoch
        if args.include_num_input_tokens_seen not in ("no", False, None):
            logs["num_input_tokens_seen"] = state.num_input_tokens_seen
            if start_time is not None:
                logs.update(speed_metrics("train", start_time,
                                          num_tokens=state.num_input_tokens_seen - self.initial_tokens_seen))
        state.log_history.append({**logs, "step": state.global_step})
        # Before the HF callbacks: HF's TensorBoardCallback runs before PrinterCallback, which pops total_flos.
        self.forward_to_loggers(logs)
        self.events.fire("on_log", logs=logs)

    def forward_to_loggers(self, logs: dict[str, Any]) -> None:
        """Hand the numbers to Lightning: ``callback_metrics`` under HF's keys, the loggers under HF's TensorBoard
        names, the progress bar (:mod:`hf_lightning.callbacks.lightning_metrics`)."""
        publish(self.trainer, logs, self.events.state.global_step)

    def _mean_across_processes(self, value: torch.Tensor) -> torch.Tensor:
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1:
            return value
        return trainer.strategy.all_gather(value).float().mean()


def _count_tokens(module: Any, inputs: Any, mode: str, processing_class: Any, trainer: Any) -> int:
    """Input tokens of one micro-batch (all, or ``"non_padding"`` ones), summed over processes."""
    model = unwrap_model(module.model)
    main_input = getattr(model, "main_input_name", "input_ids")
    if main_input not in inputs:
        return 0
    if mode == "non_padding":
        if "attention_mask" in inputs:
            tokens = inputs["attention_mask"].sum()
        elif processing_class is not None and getattr(processing_class, "pad_token_id", None) is not None:
            tokens = (inputs[main_input] != processing_class.pad_token_id).sum()
        else:
            tokens = torch.tensor(inputs[main_input].numel())
    else:
        tokens = torch.tensor(inputs[main_input].numel())
    tokens = torch.as_tensor(tokens, dtype=torch.int64)
    if trainer is not None and trainer.world_size > 1:
        tokens = trainer.strategy.reduce(tokens.to(module.device), reduce_op="sum")
    return int(tokens)
