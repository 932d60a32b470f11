"""``build_lightning_trainer``: a ``lightning.Trainer`` configured from HF ``TrainingArguments``."""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.precision import Precision

from hf_lightning.args.validation import check_precision
from hf_lightning.callbacks.hf_api import TrainerCallback
from hf_lightning.callbacks.training_flow import HFFlowCallback
from hf_lightning.checkpointing.io import HFCheckpointIO
from hf_lightning.loggers import build_loggers
from hf_lightning.precision import HFMixedPrecision
from hf_lightning.seed import enable_full_determinism, set_seed
from hf_lightning.trainer.strategies import cpu_run, process_layout, resolve_strategy

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments


def _is_hf_callback(cb: Any) -> bool:
    return isinstance(cb, TrainerCallback) or (isinstance(cb, type) and issubclass(cb, TrainerCallback)) or (
        # a callback written against transformers' TrainerCallback (not ours) is HF-style too
        any(c.__name__ == "TrainerCallback" for c in (cb if isinstance(cb, type) else type(cb)).__mro__)
        and not isinstance(cb, pl.Callback)
    )


def resolve_precision(args: TrainingArguments) -> str:
    """Lightning precision string for HF's ``bf16`` / ``fp16`` flags.

    Raises:
        ValueError: fp16 on a machine without CUDA (HF's GradScaler path needs a GPU).
    """
    check_precision(args)
    if args.bf16:
        return "bf16-mixed"
    if args.fp16:
        return "16-mixed"
    return "32-true"


def build_lightning_trainer(args: TrainingArguments, callbacks: list | None = None, *, flow: HFFlowCallback | None = None,
                            **overrides: Any) -> pl.Trainer:
    """A ``lightning.Trainer`` that trains with HF's semantics for ``args``.

    Args:
        args: a ``TrainingArguments``.
        callbacks: Lightning callbacks and/or HF-style ``TrainerCallback``s (classes or instances); the HF ones
            are driven by the flow callback in HF's event order.
        flow: an existing :class:`HFFlowCallback` to use (the HF-style facade passes its own).
        **overrides: any ``lightning.Trainer`` keyword, applied last (e.g. ``logger=``, ``devices=``).

    Returns:
        The configured ``lightning.Trainer``; ``max_steps``/``max_epochs`` are set from HF's accounting when
        ``fit`` starts (the dataset length is only known then).

    Raises:
        ValueError: for argument combinations that cannot run here (e.g. fp16 on a CPU).
    """
    callbacks = list(callbacks or [])
    hf_callbacks = [cb for cb in callbacks if _is_hf_callback(cb)]
    pl_callbacks = [cb for cb in callbacks if not _is_hf_callback(cb)]
    if flow is None:
        flow = HFFlowCallback(args, callbacks=hf_callbacks)
        # HF's Trainer seeds at construction, after the model exists; the Lightning-native path does it here.
        if args.full_determinism:
            enable_full_determinism(args.seed)
        else:
            set_seed(args.seed)
        flow.control = flow.handler.on_init_end(args, flow.state, flow.control)
    else:
        for cb in hf_callbacks:
            flow.add_callback(cb)
    precision = resolve_precision(args)
    if args.tf32 is not None and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
        torch.backends.cudnn.allow_tf32 = bool(args.tf32)
    devices, num_nodes = process_layout()
    on_cpu = cpu_run(args)
    resolved = resolve_strategy(args, devices * num_nodes, on_cpu)
    strategy = "auto" if resolved is None else resolved[0](**resolved[1])
    kwargs: dict[str, Any] = dict(
        accelerator="cpu" if on_cpu else "auto",
        devices=devices,
        num_nodes=num_nodes,
        strategy=strategy,
        precision=precision,
        # Unset (-1): the module sets HF's limits from the training plan when fit starts.
        max_epochs=-1,
        max_steps=-1,
        accumulate_grad_batches=1,
        gradient_clip_val=None,
        # HF evaluates from the flow callback at optimizer-step boundaries; Lightning's own trigger counts
        # batches and runs after the save point, so it never fires.
        check_val_every_n_epoch=sys.maxsize,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=not args.disable_tqdm and not flow.uses_hf_progress,
        logger=build_loggers(args) or False,
        default_root_dir=args.output_dir,
        deterministic=True if args.full_determinism else None,
        use_distributed_sampler=False,
        log_every_n_steps=1,
        callbacks=[flow, *pl_callbacks],
        plugins=[HFCheckpointIO()],
    )
    user_plugins = overrides.get("plugins")
    user_plugins = [] if user_plugins is None else list(user_plugins) if isinstance(user_plugins, (list, tuple)) \
        else [user_plugins]
    if precision != "32-true" and "precision" not in overrides \
            and not any(isinstance(p, Precision) for p in user_plugins):
        # HF autocasts the model's forward only (accelerate); Lightning's plugin would wrap the backward too.
        kwargs.pop("precision")
        mixed = HFMixedPrecision(precision, "cpu" if on_cpu else "cuda")
        kwargs["plugins"].append(mixed)
        if "plugins" in overrides:
            overrides = {**overrides, "plugins": [*user_plugins, mixed]}
    kwargs.update(overrides)
    return pl.Trainer(**kwargs)


@contextlib.contextmanager
def quiet_lightning():
    """Silence Lightning's INFO banners (devices found, tips, "fit stopped") for the HF-style facade, whose users
    expect HF's output only; warnings and errors still show."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric", "lightning")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    try:
        with warnings.catch_warnings():
            # Lightning 2.6's own use of a torch pytree API that torch 2.13 deprecates: nothing the user can act on.
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
            # A model from from_pretrained() is in eval mode; HF's Trainer (and the module, before each
            # micro-batch) switches it to training mode itself, so Lightning's warning about it is only noise here.
            warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode at the start of training")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
