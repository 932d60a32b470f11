"""``HFLightningModule``: an HF-style model trained with HF's exact numbers inside Lightning's loop.

One Lightning batch is one HF optimizer step: the train loader yields gradient-accumulation *windows*
(:mod:`hf_lightning.data.windows`) and this module runs manual optimization over each window, because HF 5.x
normalises the loss by ``num_items_in_batch`` summed over the whole window before the first forward — something
automatic optimization cannot look ahead for (``reference/lightning-mapping.md`` §3).

The module owns loss, backward, clipping, the optimizer/scheduler step and the evaluation step. *When* to log,
evaluate or save is decided elsewhere (:mod:`hf_lightning.flow`) and carried out by
:class:`hf_lightning.callbacks.training_flow.HFFlowCallback`, which this module tells about HF's per-micro-batch events
through :attr:`event_sink`.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, ParallelStrategy
from torch import nn

from hf_lightning import _compat
from hf_lightning._utils import unwrap_model
from hf_lightning.args.enums import DebugOption
from hf_lightning.args.plan import TrainingPlan, resolve_plan
from hf_lightning.callbacks.training_flow import HFFlowCallback
from hf_lightning.data.columns import can_return_loss, find_labels, model_accepts_loss_kwargs
from hf_lightning.data.label_smoothing import label_smoother_for, label_smoother_shifts_labels
from hf_lightning.data.samplers import EvalShardBatchSampler
from hf_lightning.data.windows import PendingWindow
from hf_lightning.debug import UnderflowOverflowDetector
from hf_lightning.eval_gather import ShardGather, all_gather_world
from hf_lightning.evaluation import (
    EvalAccumulator,
    EvalRequest,
    as_metric_collection,
    find_batch_size,
    nested_detach,
)
from hf_lightning.hooks import EventSink, TrainerHooks
from hf_lightning.model_setup import (
    activate_neftune,
    apply_liger_kernel,
    compile_model,
    enable_activation_checkpointing,
)
from hf_lightning.optim import create_optimizer, create_scheduler, current_learning_rate, is_metric_driven
from hf_lightning.optim.packaged import set_optimizer_mode, uses_fused_backward
from hf_lightning.lightning_settings import check_fit_settings, derive_fit_settings
from hf_lightning.preflight import run_preflight
from hf_lightning.seed import enable_full_determinism, set_seed
from hf_lightning.sharding import HFFSDP2Strategy
from hf_lightning.tensor_parallel import HFTensorParallelStrategy, clip_grad_norm_by_mesh, has_mixed_meshes

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments

# HF's LOSS_MAPPING entries whose loss shifts labels (ForCausalLMLoss); used to count num_items_in_batch over
# ``labels[..., 1:]``. A model from config whose ``loss_type`` is None (GPT-2) is counted unshifted — an HF quirk
# reproduced on purpose.
_SHIFTING_LOSS_TYPES = frozenset({"ForCausalLM", "ForConditionalGeneration", "CsmForConditionalGeneration"})


def _plain_train_method(method: Any) -> bool:
    """``nn.Module.train`` or transformers' ``PreTrainedModel.train`` (which adds work only on a mode change)."""
    return method is nn.Module.train or (
        getattr(method, "__qualname__", None) == "PreTrainedModel.train"
        and getattr(method, "__module__", None) == "transformers.modeling_utils"
    )

_UNDECIDED = object()


class HFLightningModule(pl.LightningModule):
    """A ``LightningModule`` that trains a PreTrainedModel-like ``nn.Module`` exactly as HF's Trainer does.

    Args:
        model: any module whose ``forward`` takes keyword tensors and returns a dict / ``ModelOutput`` /
            tuple with the loss first when labels are given.
        args: a ``TrainingArguments``.
        compute_loss_func: ``fn(outputs, labels, num_items_in_batch=...)`` replacing the model's loss.
        compute_metrics: ``fn(EvalPrediction) -> dict`` run after each evaluation.
        preprocess_logits_for_metrics: ``fn(logits, labels) -> logits`` applied per evaluation batch.
        optimizers: ``(optimizer, scheduler)``; either may be ``None`` to build it from ``args``.
        optimizer_cls_and_kwargs: ``(cls, kwargs)`` replacing ``args.optim``.
        metrics: streaming ``torchmetrics`` metrics (hf_lightning only): a ``Metric``, a ``MetricCollection`` or a
            dict ``name -> Metric``. Each evaluation batch calls ``update(preds, labels)`` on the model's device,
            where ``preds`` is the output of ``preprocess_logits_for_metrics`` when given, else the argmax over the
            last dim of float logits with a class dim (other outputs as they are); the results land in the metrics
            as ``eval_<name>`` (a single ``Metric`` is named after its class). Without ``compute_metrics`` no
            logits or labels are kept, so evaluation memory stays flat; torchmetrics syncs across processes.
        hooks: the object whose ``compute_loss`` / ``training_step`` / ``prediction_step`` /
            ``create_optimizer`` / ``create_scheduler`` are called (:class:`~hf_lightning.hooks.TrainerHooks`; the
            HF-style ``Trainer`` facade passes itself so a subclass's overrides are used). Defaults to this module.
        hooks_call_hf_training_step: whether ``hooks.training_step`` runs every micro-batch through
            :meth:`hf_training_step` (the facade's own ``training_step`` does; a subclass's override may not). Only
            then are the last step's gradients dropped lazily, just before the next backward; otherwise HF's
            ``zero_grad`` runs right after the optimizer step.
        loss_is_scaled_for_ga: HF's override point: ``None`` lets the loss decide whether it is already scaled for
            gradient accumulation (``num_items_in_batch`` / ``compute_loss_func``); ``True`` / ``False`` forces it.
        label_smoother: the ``LabelSmoother`` (or ``None``) the HF-style facade decided at ``Trainer()``, where HF
            decides and warns; left out, the module decides from ``args.label_smoothing_factor`` and the model.
        callbacks: HF-style ``TrainerCallback`` classes or instances (HF's ``Trainer(callbacks=...)``), driven in
            HF's event order by the flow callback this module brings to a ``lightning.Trainer`` you built (see
            :meth:`configure_callbacks`), or added to the flow callback the trainer already has. Lightning callbacks
            go to ``lightning.Trainer(callbacks=...)``.
        seed: seed as HF's ``Trainer(...)`` does once the model exists (``set_seed(args.seed)``, or
            ``enable_full_determinism`` with ``full_determinism``); the HF-style facade, which seeds itself, passes
            ``False``.

    Example:
        >>> module = HFLightningModule(model, args, callbacks=[MyHFCallback()])  # doctest: +SKIP
        >>> lightning.Trainer(enable_checkpointing=False).fit(module, datamodule=HFDataModule(args, train_dataset=ds))
        >>> module.trainer_state.log_history                                     # doctest: +SKIP
    """

    def __init__(
        self,
        model: nn.Module,
        args: TrainingArguments,
        *,
        compute_loss_func: Callable | None = None,
        compute_metrics: Callable | None = None,
        preprocess_logits_for_metrics: Callable | None = None,
        optimizers: tuple[torch.optim.Optimizer | None, Any] = (None, None),
        optimizer_cls_and_kwargs: tuple[type, dict] | None = None,
        hooks: TrainerHooks | None = None,
        metrics: Any = None,
        hooks_call_hf_training_step: bool = False,
        loss_is_scaled_for_ga: bool | None = None,
        label_smoother: Any = _UNDECIDED,
        callbacks: list | None = None,
        seed: bool = True,
    ) -> None:
        super().__init__()
        if model is None:
            raise ValueError("HFLightningModule needs a `model` (an nn.Module).")
        lightning_callbacks = [cb for cb in callbacks or [] if isinstance(cb, pl.Callback)
                               or (isinstance(cb, type) and issubclass(cb, pl.Callback))]
        if lightning_callbacks:
            raise TypeError(
                f"HFLightningModule(callbacks=...) takes HF-style TrainerCallbacks; {lightning_callbacks} are "
                "Lightning callbacks: pass them to lightning.Trainer(callbacks=...).")
        if seed:
            # HF's Trainer seeds once, at construction, after the model exists; this module is its counterpart.
            if args.full_determinism:
                enable_full_determinism(args.seed)
            else:
                set_seed(args.seed)
        self.hf_callbacks = list(callbacks or [])
        #: The flow callback this module brought to a user-built ``lightning.Trainer`` (``None`` until then, and on
        #: a trainer that has its own, e.g. from ``build_lightning_trainer``).
        self.flow: HFFlowCallback | None = None
        self._applied_fit_limits: tuple[weakref.ref, int, int] | None = None
        self.model = model
        self.args = args
        self.compute_loss_func = compute_loss_func
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        # A child module, so Lightning moves the metric states to the model's device.
        self.metrics = as_metric_collection(metrics)
        self.given_optimizer, self.given_scheduler = optimizers if optimizers is not None else (None, None)
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        # Not stored when it is the module itself: an nn.Module attribute pointing to itself would recurse.
        self._hooks = hooks
        self.hooks_call_hf_training_step = hooks_call_hf_training_step
        self.automatic_optimization = False

        unwrapped = unwrap_model(model)
        self.model_accepts_loss_kwargs = model_accepts_loss_kwargs(unwrapped)
        config = getattr(unwrapped, "config", None)
        self.loss_shifts_labels = getattr(unwrapped, "loss_type", None) in _SHIFTING_LOSS_TYPES and not getattr(
            config, "is_encoder_decoder", False
        )
        self.label_smoother = label_smoother_for(args, unwrapped) if label_smoother is _UNDECIDED else label_smoother
        self.label_names = list(args.label_names) if args.label_names else find_labels(unwrapped)
        self.can_return_loss = can_return_loss(unwrapped)
        # HF's Trainer sets the model's cache flag from args (default False); leaving it on changes bits.
        if config is not None and hasattr(config, "use_cache"):
            config.use_cache = args.use_cache
        self.loss_is_scaled_for_ga = loss_is_scaled_for_ga

        self.plan: TrainingPlan | None = None
        self.event_sink: EventSink | None = None
        self.grad_norm: torch.Tensor | None = None
        self.current_window_len = 1
        self.eval_request = EvalRequest()
        #: Called as ``fn(dataloader_idx, accumulator)`` once a dataloader's last batch is evaluated (the flow
        #: callback logs each eval dataset there, in HF's order); ``None`` leaves the accumulators in place.
        self.eval_dataloader_end: Callable[[int, EvalAccumulator], None] | None = None
        self.eval_accumulators: dict[int, EvalAccumulator] = {}
        self.stop_epoch_requested = False
        self._flos_per_token: float | None = None
        self._model_prepared = False
        self._neftune_handle = None
        self._overflow_detector: UnderflowOverflowDetector | None = None
        self._train_mode_modules: tuple[nn.Module, list[nn.Module] | None] | None = None
        self._clip_parameters: tuple[nn.Module, list[nn.Parameter]] | None = None
        self._mixed_meshes: bool | None = None  # gradients on a device mesh and off one (tensor parallelism)
        self._stepped_optimizer: Any = None
        # The optimizer HF's Trainer would hold as `self.optimizer`: put in train / eval mode where HF does.
        self._mode_optimizer: Any = None

    @property
    def trainer_state(self) -> Any:
        """HF's ``TrainerState`` of the run this module is in (``log_history``, ``best_metric``, ...), or None."""
        return getattr(self.event_sink, "state", None)

    @property
    def hooks(self) -> TrainerHooks | HFLightningModule:
        """The object whose HF-named methods (``compute_loss``, ``training_step``, ...) are called."""
        return self if self._hooks is None else self._hooks

    # ------------------------------------------------------------------ setup
    def setup(self, stage: str) -> None:
        if stage != "fit":
            return
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is None or not hasattr(datamodule, "train_micro_batches"):
            raise ValueError(
                "HFLightningModule is trained through an HFDataModule: call "
                "`trainer.fit(module, datamodule=HFDataModule(args, train_dataset=...))`."
            )
        if hasattr(datamodule, "bind_model"):
            datamodule.bind_model(self.model, self.label_names)
        # Before the plan: building the train loader for it already fails on a bad batch size, with torch's words.
        run_preflight(self, datamodule)
        self.plan = resolve_plan(
            self.args,
            datamodule.train_micro_batches(),
            num_examples=datamodule.num_train_examples(),
            world_size=self.trainer.world_size,
        )
        _compat.set_fit_limits(self.trainer, max_steps=self.plan.max_steps, max_epochs=self.plan.num_train_epochs)
        self._applied_fit_limits = (weakref.ref(self.trainer), self.plan.max_steps, self.plan.num_train_epochs)
        if self.flow is not None and self.flow in self.trainer.callbacks:
            # HF's flow runs before the user's Lightning callbacks at every hook, as on build_lightning_trainer's
            # trainer (Lightning appends a module's callbacks after the trainer's).
            self.trainer.callbacks.remove(self.flow)
            self.trainer.callbacks.insert(0, self.flow)
        # HF's _prepare_for_training order: activation checkpointing, then NEFTune; compile wraps the result.
        if not self._model_prepared:
            if self.args.use_liger_kernel:
                apply_liger_kernel(self.model, self.args.liger_kernel_config)
            enable_activation_checkpointing(unwrap_model(self.model), self.args)
            compile_model(self.model, self.args)
            self._model_prepared = True
        self._neftune_handle = activate_neftune(self.model, self.args.neftune_noise_alpha)
        # HF attaches its detector after NEFTune, so the embeddings' frame shows the noised output.
        self._remove_overflow_detector()
        if DebugOption.UNDERFLOW_OVERFLOW in (self.args.debug or ()):
            self._overflow_detector = UnderflowOverflowDetector(self.model)

    def configure_callbacks(self) -> list[pl.Callback]:
        """Lightning's hook: what HF's semantics need from the ``lightning.Trainer`` running this module.

        A trainer without an :class:`HFFlowCallback` (one the user built) gets this module's: HF's log → evaluate →
        save at optimizer steps, ``checkpoint-N`` folders and their rotation, the best model, the HF callbacks given
        as ``callbacks``. On a trainer that has one (``build_lightning_trainer``, the HF-style facade) nothing is
        added; the module's HF callbacks join that flow callback. Before a fit the trainer's settings are checked
        and the safe ones derived (:mod:`hf_lightning.lightning_settings`): a conflict raises before any step or
        disk write. A subclass that adds callbacks here returns ``[*super().configure_callbacks(), ...]``.
        """
        trainer = self.trainer
        if trainer.state.fn == "fit":
            applied = self._applied_fit_limits
            limits = applied[1:] if applied is not None and applied[0]() is trainer else None
            check_fit_settings(trainer, self.args, limits)
            derive_fit_settings(trainer)
        existing = next((cb for cb in trainer.callbacks if isinstance(cb, HFFlowCallback)), None)
        if existing is not None:
            for callback in self.hf_callbacks:
                present = existing.handler.callbacks
                if callback not in present and not (isinstance(callback, type)
                                                    and any(type(cb) is callback for cb in present)):
                    existing.add_callback(callback)
            return []
        if self.flow is None:
            datamodule = getattr(trainer, "datamodule", None)
            self.flow = HFFlowCallback(self.args, callbacks=self.hf_callbacks,
                                       processing_class=getattr(datamodule, "processing_class", None),
                                       data_collator=getattr(datamodule, "data_collator", None))
            self.flow.control = self.flow.handler.on_init_end(self.args, self.flow.state, self.flow.control)
        return [self.flow]

    def configure_model(self) -> None:
        # FSDP2 (fsdp_config version 2): Lightning's ModelParallelStrategy leaves the sharding to this hook.
        strategy = self.trainer.strategy
        if isinstance(strategy, HFFSDP2Strategy):
            strategy.shard(unwrap_model(self.model))
        elif isinstance(strategy, HFTensorParallelStrategy):
            strategy.check_model(unwrap_model(self.model))

    def _remove_overflow_detector(self) -> None:
        # Also reached from the next setup: a fit that raised never ran teardown.
        if self._overflow_detector is not None:
            self._overflow_detector.remove()
            self._overflow_detector = None

    def teardown(self, stage: str) -> None:
        if stage == "fit":
            self._remove_overflow_detector()
        if stage == "fit" and self._neftune_handle is not None:
            # HF removes the NEFTune hook when training ends, so evaluation and saving see clean embeddings.
            self._neftune_handle.remove()
            self._neftune_handle = None

    def configure_optimizers(self):
        if self.plan is None:
            raise RuntimeError("configure_optimizers ran before setup('fit') resolved the training plan.")
        optimizer = self.hooks.create_optimizer()
        self._mode_optimizer = optimizer
        if self._hooks is None:
            scheduler = self.create_scheduler(num_training_steps=self.plan.max_steps, optimizer=optimizer)
        else:
            # HF's Trainer calls create_scheduler(num_training_steps=...) and the scheduler reads self.optimizer,
            # so an override with HF's signature (no optimizer parameter) keeps working.
            scheduler = self._hooks.create_scheduler(num_training_steps=self.plan.max_steps)
        # Lightning never steps schedulers under manual optimization; returning it keeps `lr_schedulers()`
        # and Lightning's checkpoint state working.
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # HF-named construction hooks (the facade's overrides of these are reached through ``self.hooks``).
    def create_optimizer(self) -> torch.optim.Optimizer:
        """Build the optimizer from ``args`` (or return the one given in ``optimizers``)."""
        if self.given_optimizer is not None:
            return self.given_optimizer
        return create_optimizer(self.model, self.args, optimizer_cls_and_kwargs=self.optimizer_cls_and_kwargs)

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        """Build the LR scheduler from ``args`` (or return the one given in ``optimizers``)."""
        if self.given_scheduler is not None:
            return self.given_scheduler
        return create_scheduler(self.args, optimizer, num_training_steps)

    # ------------------------------------------------------------------ loss
    def num_items_in_batch(self, batches: list[Mapping]) -> torch.Tensor | None:
        """HF's token count over a window, or ``None`` when the loss does not use it."""
        if not batches or not isinstance(batches[0], Mapping) or "labels" not in batches[0]:
            return None
        if not (self.model_accepts_loss_kwargs or self.compute_loss_func is not None):
            return None
        try:
            total = None
            for b in batches:
                labels = b["shift_labels"] if "shift_labels" in b else b["labels"][..., 1:] \
                    if self.loss_shifts_labels else b["labels"]
                count = labels.ne(-100).sum()
                total = count if total is None else total + count
        except (TypeError, AttributeError):
            return None
        if self._tokens_across_processes():
            total = self.all_gather(total).sum()
        # HF divides by the tensor/context/sequence-parallel sizes (the processes of a group count the same
        # batch), which makes it a float tensor. Only in training: an evaluation batch's count is its own here
        # (see _tokens_across_processes).
        trainer = _compat.attached_trainer(self)
        return total / (self._tp_size() if trainer is not None and trainer.training else 1)

    def _tp_size(self) -> int:
        """Processes of a tensor-parallel group, which see the same batches (1 without tensor parallelism)."""
        trainer = _compat.attached_trainer(self)
        return int(getattr(trainer.strategy, "tp_size", 1)) if trainer is not None else 1

    def _tokens_across_processes(self) -> bool:
        """Whether ``num_items_in_batch`` counts every process's tokens (``average_tokens_across_devices``).

        Only while training: each process evaluates its own share of the eval set, with its own number of batches,
        so an evaluation batch's loss is its own token mean, the one-process value (HF's distributed evaluation
        divides by the tokens of every process's batch at that step instead).
        """
        trainer = _compat.attached_trainer(self)
        return bool(self.args.average_tokens_across_devices) and trainer is not None and trainer.world_size > 1 \
            and trainer.training

    def compute_loss(self, model: nn.Module, inputs: dict, return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | None = None):
        """HF's ``Trainer.compute_loss``: the model's loss, ``compute_loss_func`` or the label smoother."""
        if (self.label_smoother is not None or self.compute_loss_func is not None) and "labels" in inputs:
            labels = inputs.pop("labels")
        else:
            labels = None
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            inputs = {**inputs, "num_items_in_batch": num_items_in_batch}
        outputs = model(**inputs)
        if self.compute_loss_func is not None:
            loss = self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
        elif labels is not None:
            loss = self.label_smoother(
                outputs, labels, shift_labels=label_smoother_shifts_labels(unwrap_model(model)), num_items_in_batch=num_items_in_batch
            )
        else:
            loss = _loss_from_outputs(outputs, inputs)
        if (
            self.args.average_tokens_across_devices
            and (self.model_accepts_loss_kwargs or self.compute_loss_func is not None)
            and num_items_in_batch is not None
        ):
            # Undo DDP's gradient averaging: the loss is already a global token mean.
            if self._tokens_across_processes():
                loss = loss * (_compat.attached_trainer(self).world_size // self._tp_size())
        return (loss, outputs) if return_outputs else loss

    def hf_training_step(self, model: nn.Module, inputs: dict, num_items_in_batch: torch.Tensor | None = None):
        """HF's per-micro-batch ``Trainer.training_step``: loss, GA scaling, backward; returns the detached loss."""
        self._ensure_train_mode(model)
        set_optimizer_mode(self._mode_optimizer or self.given_optimizer, "train")
        inputs = self.hooks._prepare_inputs(inputs)
        loss = self.hooks.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        if self.args.n_gpu > 1:
            loss = loss.mean()
        empty_every = self.args.torch_empty_cache_steps
        if empty_every and self.trainer.global_step % empty_every == 0 and torch.cuda.is_available():
            torch.cuda.empty_cache()
        scaled = self.loss_is_scaled_for_ga
        if scaled is None:
            scaled = (self.model_accepts_loss_kwargs and num_items_in_batch is not None) or (
                self.compute_loss_func is not None
            )
        if not scaled:
            # HF divides by the window's own length, so a short last window is not under-weighted.
            loss = loss / self.current_window_len
        self.release_gradients()
        learning_rate = None
        if uses_fused_backward(self._mode_optimizer):
            # HF hands LOMO the rate the scheduler gives now; the update happens in the backward.
            learning_rate = current_learning_rate(self._mode_optimizer, self.lr_schedulers())
        self.backward_micro_batch(loss, learning_rate=learning_rate)
        return loss.detach()

    def backward_micro_batch(self, loss: torch.Tensor, learning_rate: float | None = None, **kwargs: Any) -> None:
        """One micro-batch's backward, as accelerate's ``backward(loss, **kwargs)`` in HF's ``training_step``.

        With a LOMO optimizer and a ``learning_rate``, ``fused_backward(loss, learning_rate)`` computes the
        gradients and updates the weights; otherwise Lightning's ``manual_backward`` (precision scaling, DDP's sync).
        """
        if learning_rate is not None and uses_fused_backward(self._mode_optimizer):
            self._mode_optimizer.fused_backward(loss, learning_rate)
        else:
            self.manual_backward(loss, **kwargs)

    def _prepare_input(self, data: Any) -> Any:
        """HF's ``_prepare_input``: tensors anywhere in ``data`` moved to this module's device, containers kept."""
        if isinstance(data, Mapping):
            return type(data)({key: self._prepare_input(value) for key, value in data.items()})
        if isinstance(data, (tuple, list)):
            return type(data)(self._prepare_input(value) for value in data)
        if isinstance(data, torch.Tensor):
            return data.to(device=self.device)
        return data

    def _prepare_inputs(self, inputs: dict) -> dict:
        """HF's ``_prepare_inputs``: one micro-batch through ``_prepare_input``; an empty batch is an error."""
        inputs = self.hooks._prepare_input(inputs)
        if len(inputs) == 0:
            from hf_lightning.data.columns import signature_columns

            raise ValueError(
                "The batch received was empty, your model won't be able to train on it. Double-check that your "
                "training dataset contains keys expected by the model: "
                f"{','.join(signature_columns(unwrap_model(self.model), self.label_names))}."
            )
        return inputs

    def release_gradients(self) -> None:
        """Drop the gradients of the last optimizer step (HF's ``zero_grad``) if that has not happened yet.

        HF sets the gradients to None right after each optimizer step. Dropping them here instead, after the next
        forward and just before its backward (Lightning's automatic optimization does the same), gives the
        backward's new gradients the memory the old ones leave, instead of the memory the forward's activations
        have meanwhile taken (on the CPU the small GPT-2's backward had been 2–4 % slower than plain Lightning's;
        with this it measured the same), and the numbers are identical. Between
        steps (``on_step_end``, logging, evaluation, saving) the parameters therefore still hold the last
        step's gradients; the flow callback calls this before an evaluation and when training ends, as HF has
        none then.
        """
        optimizer = self._stepped_optimizer
        if optimizer is not None:
            self._stepped_optimizer = None
            optimizer.zero_grad()

    def _defers_gradient_release(self) -> bool:
        """Whether every backward of a window goes through :meth:`hf_training_step` (so it can drop the old
        gradients first); a user's own ``training_step`` / ``hf_training_step`` gets HF's eager ``zero_grad``."""
        if type(self).hf_training_step is not HFLightningModule.hf_training_step:
            return False
        return self._hooks is None or self.hooks_call_hf_training_step

    def _ensure_train_mode(self, model: nn.Module) -> None:
        """HF's ``model.train()`` before each micro-batch, skipped when it would change nothing.

        ``train()`` walks every sub-module through ``nn.Module.__setattr__`` (≈ 0.1 ms for a small GPT-2, every
        micro-batch). When no module overrides ``train`` (``PreTrainedModel.train`` only acts on a mode change)
        and every module is already in training mode, the call is a no-op, so a check of the cached modules'
        flags replaces it. A model whose modules override ``train`` gets the call every time, as in HF.
        """
        cache = self._train_mode_modules
        if cache is None or cache[0] is not model:
            modules = list(model.modules())
            plain = all(_plain_train_method(type(m).train) for m in modules)
            cache = self._train_mode_modules = (model, modules if plain else None)
        modules = cache[1]
        if modules is None or not all(m.training for m in modules):
            model.train()

    # ------------------------------------------------------------------ training
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        # HF's should_epoch_stop / should_training_stop take effect before the next window; Lightning ends the
        # epoch when this hook returns -1.
        if self.stop_epoch_requested:
            return -1
        return None

    def training_step(self, window: list, batch_idx: int) -> dict:
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        if isinstance(window, PendingWindow):
            # Loaded by HFDataModule.on_before_batch_transfer, unless the loader was handed to fit() directly.
            window = self.trainer.strategy.batch_to_device(window.load())
        if not isinstance(window, list):
            window = [window]
        if not window:
            # The handle after an unsized loader's last window: the data ended at a window boundary.
            return {"losses": [], "stepped": False, "micro_batches": 0}
        self.current_window_len = len(window)
        n_items = self.num_items_in_batch(window)
        # HF quirk (iterable datasets): a window cut short by the end of the data is not stepped; its gradients
        # and loss carry into the next epoch's first window (HF only syncs when (step + 1) % GA == 0 there).
        ga = self.plan.gradient_accumulation_steps if self.plan is not None else len(window)
        carry_over = self.plan is not None and self.plan.micro_batches_per_epoch is None and len(window) < ga
        # Lightning's training_step (this method) and HF's per-micro-batch one share a name.
        hf_step = self.hf_training_step if self._hooks is None else self._hooks.training_step
        if self._stepped_optimizer is not None and not self._defers_gradient_release():
            self.release_gradients()
        # DDP all-reduces the gradients in the backward of the window's last micro-batch only (HF's no_sync), so
        # the step sees each process's window sum averaged once. A carry-over window's last backward syncs too
        # (HF leaves no_sync off for the last batch it fetched), though no step follows.
        strategy = self.trainer.strategy
        local_backward = strategy.block_backward_sync if isinstance(strategy, ParallelStrategy) \
            else contextlib.nullcontext
        losses = []
        for i, inputs in enumerate(window):
            if i == 0:
                self._emit("on_step_begin")
            syncs = i == len(window) - 1 and not carry_over
            with contextlib.nullcontext() if i == len(window) - 1 else local_backward():
                losses.append(hf_step(self.model, dict(inputs), n_items))
            self._emit("on_micro_batch_end", inputs=inputs, loss=losses[-1])
            if not syncs:
                self._emit("on_substep_end")
                # HF checks the stop flags after every micro-batch: a stop raised mid-window ends the epoch
                # before the optimizer steps, leaving that window's gradients in place.
                if self.event_sink is not None and self.event_sink.stop_requested():
                    return {"losses": losses, "stepped": False, "micro_batches": i + 1}
        if carry_over:
            return {"losses": losses, "stepped": False, "micro_batches": len(window)}
        scale_before = _compat.grad_scale(self.trainer)
        # Clipping and on_pre_optimizer_step happen inside, in on_before_optimizer_step.
        optimizer.step()
        scale_after = _compat.grad_scale(self.trainer)
        step_skipped = scale_before is not None and scale_after < scale_before
        self._emit("on_optimizer_step")
        # HF reads the LR after optimizer.step and before scheduler.step: the LR this update used.
        learning_rate = current_learning_rate(optimizer, scheduler)
        if scheduler is not None and not is_metric_driven(scheduler) and not step_skipped:
            scheduler.step()
        # HF's zero_grad, done just before the next backward (see release_gradients).
        self._stepped_optimizer = optimizer
        return {"losses": losses, "stepped": True, "grad_norm": self.grad_norm, "learning_rate": learning_rate,
                "micro_batches": len(window)}

    # Lightning reads training_step's parameters with inspect.getfullargspec before every batch; a precomputed
    # signature makes that a lookup.
    training_step.__signature__ = inspect.signature(training_step)

    def on_train_start(self) -> None:
        # The model may have changed between two fits (a callback, model_init): list its modules again.
        self._clip_parameters = self._train_mode_modules = None
        self._stepped_optimizer = None
        self._mixed_meshes = None

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Runs inside LightningOptimizer.step after the precision plugin unscaled fp16 grads. HF clips over
        # model.parameters() order (not the optimizer's groups) and logs the pre-clip norm.
        max_norm = float(self.args.max_grad_norm) if self.args.max_grad_norm and self.args.max_grad_norm > 0 \
            else math.inf
        params = self._parameters_in_order()
        if self._mixed_meshes is None:
            self._mixed_meshes = has_mixed_meshes(params)
        norm = clip_grad_norm_by_mesh(params, max_norm) if self._mixed_meshes \
            else torch.nn.utils.clip_grad_norm_(params, max_norm)
        # FSDP2's gradients are sharded DTensors: the norm of the full gradient is reduced over the shards.
        self.grad_norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        self._emit("on_pre_optimizer_step")

    def _parameters_in_order(self) -> list[nn.Parameter]:
        """``list(self.model.parameters())``, kept for the run: the model's parameters do not change while it trains.

        HF passes ``model.parameters()`` to the clipping every step; listing it walks every sub-module again. The
        list is rebuilt when training starts and whenever the model object is replaced.
        """
        cache = self._clip_parameters
        if cache is None or cache[0] is not self.model:
            cache = self._clip_parameters = (self.model, list(self.model.parameters()))
        return cache[1]

    def __setattr__(self, name: str, value: Any) -> None:
        # Lightning sets the running hook's name on the module around every hook call (≈ 30 times a step); a plain
        # string needs none of nn.Module.__setattr__'s parameter/buffer/sub-module bookkeeping.
        if name == _compat.CURRENT_HOOK_NAME_ATTRIBUTE:
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def _emit(self, event: str, **kwargs: Any) -> None:
        if self.event_sink is not None:
            self.event_sink.on_hf_event(event, **kwargs)

    def floating_point_ops(self, inputs: Mapping) -> float:
        """HF's estimate: 6 × input tokens × non-embedding parameters (0 without ``num_parameters``)."""
        model = unwrap_model(self.model)
        main_input = getattr(model, "main_input_name", "input_ids")
        if main_input not in inputs or not hasattr(model, "num_parameters"):
            return 0.0
        if self._flos_per_token is None:
            self._flos_per_token = 6 * model.num_parameters(exclude_embeddings=True)
        return float(inputs[main_input].numel() * self._flos_per_token)

    # ------------------------------------------------------------------ evaluation
    def prediction_step(self, model: nn.Module, inputs: dict, prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None):
        """HF's ``Trainer.prediction_step``: ``(loss, logits, labels)`` for one evaluation batch."""
        has_labels = bool(self.label_names) and all(inputs.get(k) is not None for k in self.label_names)
        return_loss = inputs.get("return_loss")
        if return_loss is None:
            return_loss = self.can_return_loss
        loss_without_labels = len(self.label_names) == 0 and return_loss
        inputs = self.hooks._prepare_inputs(inputs)
        if ignore_keys is None:
            config = getattr(unwrap_model(model), "config", None)
            ignore_keys = list(getattr(config, "keys_to_ignore_at_inference", ["past_key_values"])) \
                if config is not None else []
        labels = None
        if has_labels or loss_without_labels:
            labels = nested_detach(tuple(inputs.get(name) for name in self.label_names))
            if len(labels) == 1:
                labels = labels[0]
        with torch.no_grad():
            if has_labels or loss_without_labels:
                n_items = self.num_items_in_batch([inputs])
                if self.args.use_liger_kernel and prediction_loss_only:
                    # A Liger-patched forward can skip computing the logits nobody reads.
                    inputs = {**inputs, "skip_logits": True}
                loss, outputs = self.hooks.compute_loss(model, dict(inputs), return_outputs=True,
                                                        num_items_in_batch=n_items)
                loss = loss.detach().mean()
                if isinstance(outputs, Mapping):
                    logits = tuple(v for k, v in outputs.items() if k not in ignore_keys + ["loss"])
                else:
                    logits = outputs[1:]
            else:
                loss = None
                outputs = model(**inputs)
                if isinstance(outputs, Mapping):
                    logits = tuple(v for k, v in outputs.items() if k not in ignore_keys)
                else:
                    logits = outputs
        if prediction_loss_only:
            return loss, None, None
        logits = nested_detach(logits)
        if isinstance(logits, (tuple, list)) and len(logits) == 1:
            logits = logits[0]
        return loss, logits, labels

    def on_validation_start(self) -> None:
        self.eval_accumulators = {}
        # HF's evaluation loop puts the optimizer in eval mode (schedule-free swaps the weights) and leaves it so.
        set_optimizer_mode(self._mode_optimizer or self.given_optimizer, "eval")

    def validation_step(self, batch: Mapping, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step(batch, batch_idx, dataloader_idx, default_keep=False)

    def on_test_start(self) -> None:
        self.eval_accumulators = {}
        set_optimizer_mode(self._mode_optimizer or self.given_optimizer, "eval")

    def test_step(self, batch: Mapping, batch_idx: int, dataloader_idx: int = 0) -> None:
        # The facade runs evaluate() and predict() on Lightning's test loop; a plain `trainer.test` keeps the
        # predictions as HF's predict() does.
        self._eval_step(batch, batch_idx, dataloader_idx, default_keep=True)

    # Read with inspect.getfullargspec before every evaluation batch, as training_step (above).
    validation_step.__signature__ = inspect.signature(validation_step)
    test_step.__signature__ = inspect.signature(test_step)

    def _eval_step(self, batch: Mapping, batch_idx: int, dataloader_idx: int, default_keep: bool) -> None:
        request = self.eval_request
        keep = default_keep if request.keep_predictions is None else request.keep_predictions
        # Dataloaders run one after another: an earlier one still open ended without a known length.
        for idx in [i for i in self.eval_accumulators if i < dataloader_idx]:
            self._finish_eval_dataloader(idx)
        acc = self.eval_accumulators.get(dataloader_idx)
        if acc is None:
            gather, batch_ids = self._eval_shards(dataloader_idx)
            metrics = self.metrics.clone() if self.metrics is not None else None
            if metrics is not None and gather is None and self.trainer.world_size > 1:
                # Every process evaluates the whole set here: synced states would count it once per process.
                for metric in metrics.values():
                    metric.sync_on_compute = False
            acc = self.eval_accumulators[dataloader_idx] = EvalAccumulator(
                self.args, self.compute_metrics, self.preprocess_logits_for_metrics, keep, metrics=metrics,
                gather=gather, batch_ids=batch_ids,
            )
        prediction_loss_only = request.prediction_loss_only
        if prediction_loss_only is None:
            # HF skips the logits when nothing would read them.
            wants_outputs = keep or self.compute_metrics is not None or self.metrics is not None
            prediction_loss_only = bool(self.args.prediction_loss_only) if wants_outputs else True
        if self.model.training:  # Lightning's loop put the module in eval mode already, unless a hook changed it
            self.model.eval()
        inputs = dict(batch)
        loss, logits, labels = self.hooks.prediction_step(self.model, inputs, prediction_loss_only,
                                                          ignore_keys=request.ignore_keys)
        include = self.args.include_for_metrics or []
        main_input = getattr(unwrap_model(self.model), "main_input_name", "input_ids")
        inputs_for_metrics = batch.get(main_input) if "inputs" in include else None
        batch_size = find_batch_size(batch) or 1
        is_last = self._is_last_eval_batch(batch_idx, dataloader_idx)
        # HF fires on_prediction_step before a batch-wise compute_metrics runs.
        self._emit("on_prediction_step")
        loss_repeats = self.args.eval_batch_size if request.full_batch_loss_weight else None
        acc.add(loss, logits, labels, batch_size, inputs_for_metrics=inputs_for_metrics, raw_inputs=batch,
                is_last=is_last, loss_repeats=loss_repeats,
                before_empty_step=self._lockstep_forward(batch, prediction_loss_only, request.ignore_keys))
        if is_last:
            self._finish_eval_dataloader(dataloader_idx)

    def _eval_shards(self, dataloader_idx: int) -> tuple[ShardGather | None, list[list[int]] | None]:
        """The exchange for a dataloader whose processes each evaluate their own share (``None`` otherwise), with
        the one-process batch each process's batches belong to."""
        trainer = self.trainer
        if trainer.world_size < 2:
            return None, None
        loaders = trainer.test_dataloaders if trainer.testing else trainer.val_dataloaders
        if isinstance(loaders, Mapping):
            loaders = list(loaders.values())
        loader = loaders[dataloader_idx] if isinstance(loaders, (list, tuple)) else loaders
        shard = getattr(loader, "batch_sampler", None)
        if not isinstance(shard, EvalShardBatchSampler) or shard.num_processes == 1:
            return None, None
        if (shard.num_processes, shard.process_index) != (trainer.world_size, trainer.global_rank):
            raise RuntimeError(
                f"The evaluation dataloader was sharded for {shard.num_processes} processes (this one rank "
                f"{shard.process_index}), but the run has {trainer.world_size} (this one rank {trainer.global_rank}). "
                "Build evaluation dataloaders with the HFDataModule attached to this run."
            )
        counts = trainer.num_test_batches if trainer.testing else trainer.num_val_batches
        # Lightning's own count: a limit_*_batches shortens every process's pass, and the exchange follows it.
        gather = ShardGather(all_gather_world, trainer.global_rank, trainer.world_size,
                             int(counts[dataloader_idx]), device=trainer.strategy.root_device)
        return gather, [shard.batch_ids(rank) for rank in range(shard.num_processes)]

    def _lockstep_forward(self, batch: Mapping, prediction_loss_only: bool,
                          ignore_keys: list[str] | None) -> Callable[[], None] | None:
        """What a process with no eval batch left runs while the others evaluate one: nothing under DDP (its
        forward needs no other process), under a strategy that shards the parameters (FSDP, DeepSpeed ZeRO-3:
        each forward gathers them from every process) the evaluation step again on its last batch, its result
        discarded: the same forwards as the others' step, including a ``generate`` (``predict_with_generate``),
        whose ``synced_gpus`` loop runs until every process's generation has ended."""
        strategy = self.trainer.strategy
        if self.trainer.world_size < 2 or (isinstance(strategy, DDPStrategy)
                                           and not isinstance(strategy, DeepSpeedStrategy)):
            return None

        def forward() -> None:
            with torch.no_grad():
                self.hooks.prediction_step(self.model, dict(batch), prediction_loss_only, ignore_keys=ignore_keys)

        return forward

    def _finish_eval_dataloader(self, dataloader_idx: int) -> None:
        if self.eval_dataloader_end is not None and dataloader_idx in self.eval_accumulators:
            self.eval_dataloader_end(dataloader_idx, self.eval_accumulators.pop(dataloader_idx))

    def _is_last_eval_batch(self, batch_idx: int, dataloader_idx: int) -> bool:
        # HF evaluates each dataset on its own, so "last" is per dataloader; Lightning's own flag only marks the
        # end of all of them, which is the answer left for a dataloader without a length.
        trainer = self.trainer
        counts = trainer.num_test_batches if trainer.testing else trainer.num_val_batches
        if dataloader_idx < len(counts) and math.isfinite(counts[dataloader_idx]):
            return batch_idx + 1 >= counts[dataloader_idx]
        return _compat.is_last_eval_batch(trainer)


def _loss_from_outputs(outputs: Any, inputs: Mapping) -> torch.Tensor:
    if isinstance(outputs, Mapping):
        if "loss" not in outputs or outputs["loss"] is None:
            keys = [k for k, v in outputs.items() if v is not None] if "loss" in outputs else list(outputs.keys())
            raise ValueError(
                "The model did not return a loss from the inputs, only the following keys: "
                f"{','.join(keys)}. For reference, the inputs it received are {','.join(inputs.keys())}. "
                "Pass the labels the model's forward expects (see `label_names`), or a `compute_loss_func`."
            )
        return outputs["loss"]
    if isinstance(outputs, (tuple, list)):
        if not outputs or not isinstance(outputs[0], torch.Tensor) or outputs[0].dim() != 0:
            raise ValueError(
                "The model returned a tuple whose first element is not a scalar loss. For reference, the inputs it "
                f"received are {','.join(inputs.keys())}. Return the loss first when labels are given, or pass a "
                "`compute_loss_func`."
            )
        return outputs[0]
    if isinstance(outputs, torch.Tensor) and outputs.dim() == 0:
        return outputs
    loss = getattr(outputs, "loss", None)
    if loss is None:
        raise ValueError(
            f"The model returned a {type(outputs).__name__} without a loss. For reference, the inputs it received "
            f"are {','.join(inputs.keys())}."
        )
    return loss
