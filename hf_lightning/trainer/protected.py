"""HF ``Trainer``'s protected members that subclasses override or call, on the ``Trainer`` facade.

Subclasses written for HF (and bodies copied from HF's own ``training_step`` / ``prediction_step``) call
``self._prepare_inputs(inputs)``, ``self.compute_loss_context_manager()``, ``self._get_num_items_in_batch(...)``,
``self.current_gradient_accumulation_steps``, ``self.model_accepts_loss_kwargs`` and
``self.accelerator.backward(loss)``. :class:`ProtectedMembers` gives the facade those names, each answered by the
Lightning module of the run; ``_prepare_inputs`` / ``_prepare_input`` are also override points the module's default
steps call (``hooks.TrainerHooks``).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import safetensors.torch
import torch
from torch import nn
from torch.utils.data import SequentialSampler

from hf_lightning import _compat
from hf_lightning._utils import has_len, unwrap_model
from hf_lightning.checkpointing.layout import SAFE_WEIGHTS_NAME
from hf_lightning.checkpointing.model_state import PlainModelState, saved_as_whole
from hf_lightning.checkpointing.writer import save_model_files
from hf_lightning.callbacks.evaluation import update_best_metric
from hf_lightning.checkpointing.reader import load_model_weights
from hf_lightning.data.columns import RemoveColumnsCollator, remove_unused_columns, signature_columns
from hf_lightning.data.datamodule import HFDataModule
from hf_lightning.optim import current_learning_rate, fit_optimizer_and_scheduler


class ProtectedMembers:
    """Mixed into ``hf_lightning.Trainer``; reads ``self.lightning_module`` and ``self.args``."""

    lightning_module: Any
    args: Any
    model: nn.Module
    train_dataset: Any
    processing_class: Any
    data_collator: Any
    flow: Any
    state: Any
    _module: Any
    _pl_trainer: Any

    # ------------------------------------------------------------------ inputs
    def _prepare_input(self, data: Any) -> Any:
        """HF's ``_prepare_input``: tensors anywhere in ``data`` on the training device, containers kept."""
        return self.lightning_module._prepare_input(data)

    def _prepare_inputs(self, inputs: dict) -> dict:
        """HF's ``_prepare_inputs``: the batch through ``_prepare_input``; an empty batch raises HF's error."""
        return self.lightning_module._prepare_inputs(inputs)

    def _prepare_context_parallel_inputs(self, model: nn.Module, inputs: dict) -> tuple[Any, dict]:
        """HF's answer without context parallelism: a no-op context factory and the inputs unchanged."""
        return contextlib.nullcontext, inputs

    def _get_num_items_in_batch(self, batch_samples: list, device: Any = None) -> torch.Tensor | None:
        """HF's count of label tokens over ``batch_samples`` (the micro-batches of one window)."""
        return self.lightning_module.num_items_in_batch(list(batch_samples))

    # ------------------------------------------------------------------ columns
    def _set_signature_columns_if_needed(self) -> None:
        """HF's ``_signature_columns``: the model's ``forward`` arguments plus the label column names.

        Override it (or set ``self._signature_columns``) to keep other columns: the data loaders filter with it.
        """
        if getattr(self, "_signature_columns", None) is None:
            self._signature_columns = signature_columns(unwrap_model(self.model), self.lightning_module.label_names)

    def _remove_unused_columns(self, dataset: Any, description: str | None = None) -> Any:
        """HF's column filter for a ``datasets.Dataset``: the columns ``forward`` does not take are removed
        (unless ``remove_unused_columns=False``). Other datasets are filtered per batch by the collator."""
        if not self.args.remove_unused_columns:
            return dataset
        self._set_signature_columns_if_needed()
        return remove_unused_columns(dataset, self._signature_columns, description=description,
                                     model_name=type(unwrap_model(self.model)).__name__)

    def _get_collator_with_removed_columns(self, data_collator: Any, description: str | None = None) -> Any:
        """HF's collator wrapper that drops the columns ``forward`` does not take, for non-``datasets`` data."""
        if not self.args.remove_unused_columns:
            return data_collator
        self._set_signature_columns_if_needed()
        return RemoveColumnsCollator(data_collator, self._signature_columns, description=description,
                                     model_name=type(unwrap_model(self.model)).__name__)

    def _columns_to_keep(self) -> list[str]:
        """What the data loaders keep (the datamodule asks when a subclass chose the columns)."""
        self._set_signature_columns_if_needed()
        return list(self._signature_columns)

    # ------------------------------------------------------------------ log → evaluate → save
    @property
    def _globalstep_last_logged(self) -> int:
        return self.flow.logbook.globalstep_last_logged

    @_globalstep_last_logged.setter
    def _globalstep_last_logged(self, value: int) -> None:
        self.flow.logbook.globalstep_last_logged = value

    @property
    def _total_loss_scalar(self) -> float:
        return self.flow.logbook.total_loss_scalar

    @_total_loss_scalar.setter
    def _total_loss_scalar(self, value: float) -> None:
        self.flow.logbook.total_loss_scalar = value

    def _maybe_log_save_evaluate(self, tr_loss: torch.Tensor, grad_norm: Any, model: nn.Module, trial: Any,
                                 epoch: float, ignore_keys_for_eval: list[str] | None, start_time: float,
                                 learning_rate: float | None = None) -> None:
        """HF's step end: log (when ``control.should_log``), evaluate, save; called after every optimizer step and
        at every epoch end. Override it to add logs or change what happens; ``super()`` does HF's work."""
        self.flow.log_evaluate_save()

    def _call_maybe_log_save_evaluate(self) -> None:
        # The flow callback's step end when a subclass overrides _maybe_log_save_evaluate: HF's arguments.
        logbook = self.flow.logbook
        request = getattr(self._module, "eval_request", None)
        self._maybe_log_save_evaluate(logbook.tr_loss, logbook.last_grad_norm, self.model, None, self.state.epoch,
                                      None if request is None else request.ignore_keys, logbook.start_time,
                                      learning_rate=logbook.last_learning_rate)

    def _get_learning_rate(self) -> float:
        """The learning rate the optimizer's first group uses now."""
        return current_learning_rate(*fit_optimizer_and_scheduler(self._pl_trainer))

    def _evaluate(self, trial: Any, ignore_keys_for_eval: list[str] | None, skip_scheduler: bool = False) -> dict:
        """HF's evaluation inside training: ``evaluate()`` and then a metric-driven scheduler's step."""
        return self.flow.evaluate_in_training(step_scheduler=not skip_scheduler)

    def _determine_best_metric(self, metrics: dict[str, float], trial: Any = None) -> bool:
        """Record a new best ``metric_for_best_model`` in the state; whether ``metrics`` set one."""
        return update_best_metric(self.args, self.state, metrics)

    def _save_checkpoint(self, model: nn.Module, trial: Any = None) -> None:
        """Write ``checkpoint-{global_step}`` now (crash-safely; rotation as ``save_total_limit`` says)."""
        self.flow.save_checkpoint()

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        """HF's weight loading on resume: the checkpoint's model files into ``model`` (the trainer's model by
        default), as saved (PEFT adapters, sharded files); override it to load differently."""
        load_model_weights(model if model is not None else self.model, resume_from_checkpoint, strict=False)

    # ------------------------------------------------------------------ saving
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """HF's ``_save`` (what ``save_model`` calls): the model's files (``state_dict`` instead of the model's own
        when given), the processing class and ``training_args.bin``, on the saving process only."""
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        given = None if state_dict is None else _GivenStateDict(state_dict)
        save_model_files(self.model, output_dir, processing_class=self.processing_class,
                         data_collator=self.data_collator, args=self.args, model_state=given)

    # ------------------------------------------------------------------ samplers
    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        """HF's train sampler for ``train_sampling_strategy`` (the seeded shuffle by default); override it to
        train in another order (an override's ``RandomSampler`` is seeded as accelerate does)."""
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return HFDataModule(self.args, processing_class=self.processing_class).default_train_sampler(dataset)

    def _get_eval_sampler(self, eval_dataset: Any) -> Any:
        """HF's eval sampler: sequential on one process, ``None`` for an unsized dataset or several processes."""
        if eval_dataset is None or not has_len(eval_dataset) or self.args.world_size > 1:
            return None
        return SequentialSampler(eval_dataset)

    # ------------------------------------------------------------------ what the default steps read
    @property
    def label_names(self) -> list[str]:
        return self.lightning_module.label_names

    @property
    def can_return_loss(self) -> bool:
        return self.lightning_module.can_return_loss

    @property
    def model_accepts_loss_kwargs(self) -> bool:
        return self.lightning_module.model_accepts_loss_kwargs

    @property
    def current_gradient_accumulation_steps(self) -> int:
        """Micro-batches in the current accumulation window (the last window of an epoch may be shorter)."""
        return self.lightning_module.current_window_len

    @property
    def accelerator(self) -> AcceleratorView:
        """The part of HF's ``accelerate.Accelerator`` that HF's step bodies use, answered by Lightning."""
        return AcceleratorView(self.lightning_module)


class _GivenStateDict(PlainModelState):
    """Writes a given ``state_dict`` the way HF's ``_save`` does: through ``save_pretrained(state_dict=...)`` when
    the model has it, else as ``model.safetensors``."""

    def __init__(self, state_dict: dict) -> None:
        self.state_dict = state_dict

    def write(self, gathered: nn.Module, folder: str) -> None:
        save_pretrained = getattr(gathered, "save_pretrained", None)
        if callable(save_pretrained):
            with saved_as_whole(gathered):
                save_pretrained(folder, state_dict=self.state_dict)
        else:
            safetensors.torch.save_file({k: v.contiguous() for k, v in self.state_dict.items()},
                                        os.path.join(folder, SAFE_WEIGHTS_NAME), metadata={"format": "pt"})


class AcceleratorView:
    """``backward``, ``distributed_type``, process counts, ``device`` and ``unwrap_model`` of the running fit."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """The backward of one micro-batch, through Lightning (precision scaling, DDP's sync)."""
        self._module.release_gradients()
        # HF's training_step passes `learning_rate` for LOMO optimizers (accelerate then calls fused_backward).
        self._module.backward_micro_batch(loss, **kwargs)

    @property
    def num_processes(self) -> int:
        trainer = _compat.attached_trainer(self._module)
        return 1 if trainer is None else trainer.world_size

    @property
    def process_index(self) -> int:
        trainer = _compat.attached_trainer(self._module)
        return 0 if trainer is None else trainer.global_rank

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def device(self) -> torch.device:
        return self._module.device

    @property
    def distributed_type(self) -> str:
        """accelerate's ``DistributedType`` value (a ``str`` enum, so it compares equal to this string)."""
        if self.num_processes == 1:
            return "NO"
        return "MULTI_GPU" if self.device.type == "cuda" else "MULTI_CPU"

    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True) -> nn.Module:
        return unwrap_model(model)
