"""Every rule that refuses a set of training arguments, in one module.

The rules run at three moments, each with its own entry point:

* **Construction** (``TrainingArguments.__post_init__``, where HF raises too): :func:`check_hf_rules` (HF 5.23's
  ``_validate_args``, with its messages), :func:`check_choices` (closed choices HF leaves to its parser) and
  :func:`refuse_unsupported` (settings hf_lightning cannot honour, each with the fix).
* **Trainer construction** (``Trainer(...)``): :func:`check_trainer_inputs`, the rules that need the datasets and
  ``compute_metrics`` HF's ``Trainer.__init__`` checks against the arguments.
* **Before work on this machine** (the first training step, an evaluation): :func:`check_trainable` (values
  HF only trips over inside torch, or never) and :func:`check_precision` / :func:`check_full_eval_precision`
  (half precision that needs a GPU this run does not have).

Nothing here imports Lightning. The functions read a ``TrainingArguments``; ``check_trainable`` also accepts the
HF-named fields on any object, because preflight runs it on whatever arguments object the module was given.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch

from hf_lightning._utils import enum_value, has_len
from hf_lightning.args.enums import DebugOption, IntervalStrategy, SaveStrategy, SchedulerType
from hf_lightning.args.parallelism import parallelism_plan

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments

__all__ = [
    "LOG_LEVELS",
    "TOKENS_SEEN_CHOICES",
    "TRAIN_SAMPLING_CHOICES",
    "check_choice",
    "check_choices",
    "check_full_eval_precision",
    "check_hf_rules",
    "check_precision",
    "check_trainable",
    "check_trainer_inputs",
    "evaluates_during_training",
    "refuse_unsupported",
]

# Level names accepted by `log_level` / `log_level_replica`; "passive" leaves the level alone.
LOG_LEVELS: dict[str, int] = {
    "detail": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "passive": -1,
}

TOKENS_SEEN_CHOICES = ("all", "non_padding", "no")
TRAIN_SAMPLING_CHOICES = ("random", "sequential", "group_by_length", "batch_rebalance")

NO_HUB = (
    "hf_lightning never uploads to the Hugging Face Hub (no hub here). Remove push_to_hub and upload "
    "output_dir yourself, e.g. with huggingface_hub.upload_folder."
)


# ---------------------------------------------------------------------------------------------------------------
# At construction
# ---------------------------------------------------------------------------------------------------------------


def check_hf_rules(args: TrainingArguments) -> None:
    """HF 5.23's ``_validate_args``, with its messages; integral float ``*_steps`` become ints (as in HF)."""
    steps_limit = args.torch_empty_cache_steps
    if steps_limit is not None and not (isinstance(steps_limit, int) and steps_limit > 0):
        raise ValueError(f"`torch_empty_cache_steps` must be an integer bigger than 0, got {steps_limit}.")

    if args.logging_strategy == IntervalStrategy.STEPS and args.logging_steps == 0:
        raise ValueError(f"logging strategy {args.logging_strategy} requires non-zero --logging_steps")
    for name, strategy in (
        ("logging_steps", args.logging_strategy),
        ("eval_steps", args.eval_strategy),
        ("save_steps", args.save_strategy),
    ):
        value = getattr(args, name)
        if strategy == "steps" and value > 1:
            if value != int(value):
                raise ValueError(f"--{name} must be an integer if bigger than 1: {value}")
            setattr(args, name, int(value))

    if args.load_best_model_at_end and args.save_strategy != SaveStrategy.BEST:
        _check_best_model_cadence(args)

    if (args.bf16 or args.bf16_full_eval) and not args.use_cpu and not _bf16_accelerator_available():
        message = (
            "Your setup doesn't support bf16/gpu. You need to assign use_cpu if you want to train the model on CPU."
        )
        if torch.cuda.is_available():
            message += " You need Ampere+ GPU with cuda>=11.0."
        raise ValueError(message)
    if args.fp16 and args.bf16:
        raise ValueError("At most one of fp16 and bf16 can be True, but not both")
    if args.fp16_full_eval and args.bf16_full_eval:
        raise ValueError("At most one of fp16 and bf16 can be True for full eval, but not both")
    for scheduler in (SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY):
        if args.lr_scheduler_type == scheduler and args.eval_strategy == IntervalStrategy.NO:
            raise ValueError(f"lr_scheduler_type {scheduler.value} requires an eval strategy")
    if args.warmup_steps < 0:
        raise ValueError(f"Got warmup_steps = {args.warmup_steps}, Expected value warmup_steps >= 0")
    if args.dataloader_num_workers == 0 and args.dataloader_prefetch_factor is not None:
        raise ValueError(
            "--dataloader_prefetch_factor can only be set when data is loaded in a different process, i.e."
            " when --dataloader_num_workers > 0."
        )


def _check_best_model_cadence(args: TrainingArguments) -> None:
    # Loading the best model needs a checkpoint at every evaluation that may be the best.
    if args.eval_strategy != args.save_strategy:
        raise ValueError(
            "--load_best_model_at_end requires the save and eval strategy to match, except when "
            '--save_strategy="best", but found\n'
            f"- Evaluation strategy: {args.eval_strategy}\n- Save strategy: {args.save_strategy}"
        )
    if args.eval_strategy != IntervalStrategy.STEPS or args.save_steps % args.eval_steps == 0:
        return
    save, every = args.save_steps, args.eval_steps
    if save >= 1 and every >= 1:
        raise ValueError(
            "--load_best_model_at_end requires the saving steps to be a round multiple of the evaluation "
            f"steps, but found {save}, which is not a round multiple of {every}."
        )
    if not (save < 1 and every < 1):
        raise ValueError(
            "--load_best_model_at_end requires the saving steps to be a multiple of the evaluation "
            "steps, which cannot get guaranteed when mixing ratio and absolute steps for save_steps "
            f"{save} and eval_steps {every}."
        )
    # Two ratios: compare them scaled to integers so 0.4 % 0.2 float noise does not reject them.
    scale = 1_000_000
    if (save * scale) % (every * scale) != 0:
        raise ValueError(
            "--load_best_model_at_end requires the saving steps to be a multiple of the evaluation "
            f"steps, but found {save}, which is not a multiple of {every}."
        )


def _bf16_accelerator_available() -> bool:
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return torch.backends.mps.is_available()


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    """Raise naming ``name`` when ``value`` is not one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; choose one of {list(choices)}")


def check_choices(args: TrainingArguments) -> None:
    """Closed choices HF only enforces through its argument parser.

    Checked here, a late ``KeyError`` or a silently wrong sampler becomes an error that names the field.
    """
    for name in ("log_level", "log_level_replica"):
        check_choice(name, getattr(args, name), tuple(LOG_LEVELS))
    check_choice("include_num_input_tokens_seen", args.include_num_input_tokens_seen, TOKENS_SEEN_CHOICES)
    check_choice("train_sampling_strategy", args.train_sampling_strategy, TRAIN_SAMPLING_CHOICES)


def _show(value: Any) -> str:
    # Enum members read better in messages as their plain values.
    if isinstance(value, Enum):
        return repr(value.value)
    if isinstance(value, list) and value and all(isinstance(item, Enum) for item in value):
        return repr([item.value for item in value])
    return repr(value)


# 5.x settings hf_lightning refuses: (field, is-unsupported test on its value, reason + fix).
_UNSUPPORTED_SETTINGS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("push_to_hub", bool, NO_HUB),
    (
        "debug",
        lambda value: DebugOption.TPU_METRICS_DEBUG in value,
        "there are no TPUs here, so no TPU metrics to debug; remove tpu_metrics_debug from debug "
        "(underflow_overflow is supported).",
    ),
)

# Accelerate options (inside `accelerator_config`) that change behaviour hf_lightning does not reproduce.
_UNSUPPORTED_ACCELERATOR_CONFIG: tuple[tuple[str, Callable[[Any], bool], str], ...] = ()


def _configured_accelerate_state() -> Any:
    """The user's already-configured accelerate ``PartialState``, if accelerate is in use (never imported here)."""
    import sys

    state_module = sys.modules.get("accelerate.state")
    if state_module is None or not getattr(state_module.PartialState, "_shared_state", None):
        return None
    return state_module.PartialState()


def _check_configured_state(args: TrainingArguments) -> None:
    """HF's ``use_configured_state``: train in the distributed set-up the user configured before the arguments.

    HF then reuses the existing accelerate ``PartialState`` instead of creating (and resetting) one. Here the set-up
    is that state or, without accelerate, an initialised ``torch.distributed`` process group; Lightning's strategies
    reuse an initialised process group as they find it. Nothing configured is HF's ``ValueError``; HF drops the key
    from ``accelerator_config`` once read.
    """
    if not args.accelerator_config.pop("use_configured_state", False):
        return
    state = _configured_accelerate_state()
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if state is None and not distributed:
        raise ValueError(
            "Passing `'use_configured_state':True` to the AcceleratorConfig requires a pre-configured "
            "`AcceleratorState` or `PartialState` to be defined before calling `TrainingArguments`. "
            "(hf_lightning also accepts an initialised torch.distributed process group.)"
        )
    if state is not None and args.deepspeed and enum_value(state.distributed_type) != "DEEPSPEED":
        raise RuntimeError(
            "Tried to use an already configured `Accelerator` or `PartialState` that was not initialized for "
            "DeepSpeed, but also passed in a `deepspeed` configuration to the `TrainingArguments`. Please set "
            "`use_configured_state:False` instead or setup your `Accelerator` or `PartialState` properly."
        )


def refuse_unsupported(args: TrainingArguments) -> None:
    """Refuse settings hf_lightning cannot honour, naming the field and what to do instead.

    Runs after ``accelerator_config`` is normalised (HF's defaults filled in).
    """
    for name, is_unsupported, reason in _UNSUPPORTED_SETTINGS:
        value = getattr(args, name)
        if is_unsupported(value):
            raise ValueError(f"`{name}={_show(value)}` is not supported by hf_lightning: {reason}")
    for key, is_unsupported, reason in _UNSUPPORTED_ACCELERATOR_CONFIG:
        value = args.accelerator_config.get(key)
        if is_unsupported(value):
            raise ValueError(f"`accelerator_config['{key}']={value!r}` is not supported by hf_lightning: {reason}")
    _check_configured_state(args)
    _apply_gradient_accumulation_kwargs(args)
    _check_parallelism_config(args)
    if isinstance(args.fsdp_config, dict) and args.fsdp and args.fsdp_config.get("xla"):
        raise ValueError(
            "`fsdp_config['xla']=True` is not supported by hf_lightning: PyTorch/XLA FSDP has no Lightning "
            "strategy here; remove the xla keys to use FSDP on GPUs."
        )


def _check_parallelism_config(args: TrainingArguments) -> None:
    """``parallelism_config``'s sizes (``args/parallelism.py``; the strategy it needs is checked with the process
    count, in ``trainer/strategies.py``)."""
    parallelism_plan(args.parallelism_config)


def _apply_gradient_accumulation_kwargs(args: TrainingArguments) -> None:
    """HF's reading of ``accelerator_config['gradient_accumulation_kwargs']``: its ``num_steps`` becomes
    ``gradient_accumulation_steps`` (an error when both are set); its other keys (accelerate's own accumulation,
    which HF's loop does not use) change nothing, as in HF."""
    kwargs = args.accelerator_config.get("gradient_accumulation_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ValueError("`accelerator_config['gradient_accumulation_kwargs']` must be a dict, e.g. {'num_steps': 4}.")
    if "num_steps" not in kwargs:
        return
    if args.gradient_accumulation_steps > 1:
        raise ValueError(
            "The `AcceleratorConfig`'s `num_steps` is set but `gradient_accumulation_steps` is greater than 1 in the "
            "passed `TrainingArguments`. If using the passed `AcceleratorConfig` is desired, do not set the "
            "`TrainingArguments` `gradient_accumulation_steps`."
        )
    args.gradient_accumulation_steps = int(kwargs["num_steps"])


# ---------------------------------------------------------------------------------------------------------------
# At Trainer construction
# ---------------------------------------------------------------------------------------------------------------


def check_trainer_inputs(args: TrainingArguments, *, train_dataset: Any = None, eval_dataset: Any = None,
                         compute_metrics: Callable | None = None) -> None:
    """The argument rules HF's ``Trainer.__init__`` checks against what it was given.

    Raises:
        ValueError: an eval strategy without an ``eval_dataset``; ``save_strategy="best"`` or
            ``load_best_model_at_end`` without ``metric_for_best_model``; ``batch_eval_metrics`` with a
            ``compute_metrics`` that takes no ``compute_result``; a dict of datasets (a ``DatasetDict``) as the
            train dataset; a train dataset without a length and no ``max_steps``; ``group_by_length`` over an
            ``IterableDataset``.
    """
    if enum_value(args.eval_strategy) != "no" and eval_dataset is None:
        raise ValueError(
            f"You have set `args.eval_strategy` to {args.eval_strategy} but you didn't pass an `eval_dataset` to "
            "`Trainer`. Either set `args.eval_strategy` to `no` or pass an `eval_dataset`."
        )
    if (enum_value(args.save_strategy) == "best" or args.load_best_model_at_end) and \
            args.metric_for_best_model is None:
        raise ValueError(
            "`args.metric_for_best_model` must be provided when using 'best' save_strategy or if "
            "`args.load_best_model_at_end` is set to `True`."
        )
    if args.batch_eval_metrics and compute_metrics is not None:
        if "compute_result" not in inspect.signature(compute_metrics).parameters:
            raise ValueError(
                "When using `batch_eval_metrics`, your `compute_metrics` function must take a `compute_result`"
                " boolean argument which will be triggered after the last batch of the eval set to signal that"
                " the summary statistics should be returned by the function."
            )
    if isinstance(train_dataset, Mapping):
        splits = ", ".join(repr(name) for name in list(train_dataset)[:5])
        raise ValueError(
            f"train_dataset is a dict of datasets ({type(train_dataset).__name__} with splits {splits}), but the "
            "Trainer trains on one dataset. Pass a single split, e.g. `train_dataset=dataset[\"train\"]`."
        )
    if train_dataset is not None and not has_len(train_dataset) and args.max_steps <= 0:
        raise ValueError(
            "The train_dataset does not implement __len__, max_steps has to be specified. The number of steps "
            "needs to be known in advance for the learning rate scheduler."
        )
    if train_dataset is not None and isinstance(train_dataset, torch.utils.data.IterableDataset) \
            and enum_value(args.train_sampling_strategy) == "group_by_length":
        raise ValueError("the `group_by_length` sampling strategy needs a dataset with a length; this "
                         "train_dataset is an IterableDataset.")


# ---------------------------------------------------------------------------------------------------------------
# Before work on this machine
# ---------------------------------------------------------------------------------------------------------------


def evaluates_during_training(args: Any) -> bool:
    """Whether the run evaluates while it trains (an eval strategy, or ``eval_on_start``)."""
    return enum_value(getattr(args, "eval_strategy", "no")) != "no" or bool(getattr(args, "eval_on_start", False))


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _non_negative_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _finite_non_negative(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v >= 0


def _positive_steps(v: Any) -> bool:
    # `*_steps` below 1 are a ratio of the total steps; 0 and negatives are meaningless.
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def _unit_interval_open_right(v: Any) -> bool:
    return isinstance(v, (int, float)) and 0 <= v < 1


def _optional_positive_int(v: Any) -> bool:
    return v is None or _positive_int(v)


def _finite_epochs(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _always(args: Any) -> bool:
    return True


def _strategy_is_steps(field: str) -> Callable[[Any], bool]:
    return lambda args: enum_value(getattr(args, field, "no")) == "steps"


def _uses_adam(args: Any) -> bool:
    return "adam" in str(enum_value(getattr(args, "optim", "")))


def _epochs_decide(args: Any) -> bool:
    return int(getattr(args, "max_steps", -1)) <= 0


# (field, is_valid, what it must be, when the field matters). HF validates none of these before training; most
# fail later inside torch with a message that names torch's parameter, some never fail at all.
_TRAINABLE_RULES: tuple[tuple[str, Callable[[Any], bool], str, Callable[[Any], bool]], ...] = (
    ("per_device_train_batch_size", _positive_int, "a positive integer (examples per device and micro-batch)",
     _always),
    ("per_device_eval_batch_size", _positive_int, "a positive integer (examples per device and evaluation batch)",
     evaluates_during_training),
    ("gradient_accumulation_steps", _positive_int, "a positive integer (micro-batches per optimizer step)",
     _always),
    ("learning_rate", _finite_non_negative, "a finite number >= 0", _always),
    ("weight_decay", _finite_non_negative, "a finite number >= 0", _always),
    ("adam_beta1", _unit_interval_open_right, "in [0, 1)", _uses_adam),
    ("adam_beta2", _unit_interval_open_right, "in [0, 1)", _uses_adam),
    ("adam_epsilon", _finite_non_negative, "a finite number >= 0", _uses_adam),
    ("label_smoothing_factor", _unit_interval_open_right,
     "in [0, 1): the share of probability moved from the true label to all labels (0 turns smoothing off)",
     _always),
    ("num_train_epochs", _finite_epochs, "a finite number", _epochs_decide),
    ("logging_steps", _positive_steps, "> 0 with logging_strategy='steps' (below 1: a ratio of the total steps)",
     _strategy_is_steps("logging_strategy")),
    ("eval_steps", _positive_steps, "> 0 with eval_strategy='steps' (below 1: a ratio of the total steps)",
     _strategy_is_steps("eval_strategy")),
    ("save_steps", _positive_steps, "> 0 with save_strategy='steps' (below 1: a ratio of the total steps)",
     _strategy_is_steps("save_strategy")),
    ("eval_accumulation_steps", _optional_positive_int, "None or a positive integer", _always),
    ("dataloader_num_workers", _non_negative_int, "an integer >= 0 (0 loads data in the training process)",
     _always),
)


def check_trainable(args: Any) -> None:
    """Refuse argument values that cannot train, naming the ``TrainingArguments`` field.

    HF accepts these at construction (a dataclass field can be changed afterwards too) and fails inside torch,
    or never; this runs before the first training step.

    Args:
        args: A ``TrainingArguments`` (or any object with its field names).

    Raises:
        ValueError: A field is out of range (zero or negative batch size, accumulation, learning rate, steps;
            ``label_smoothing_factor`` outside [0, 1); Adam betas outside [0, 1); ...), or ``fp16_full_eval`` is
            set for evaluations during training on a machine without CUDA.
    """
    for field, is_valid, requirement, matters in _TRAINABLE_RULES:
        if not hasattr(args, field) or not matters(args):
            continue
        value = getattr(args, field)
        if not is_valid(value):
            raise ValueError(
                f"TrainingArguments.{field}={value!r} cannot train: it must be {requirement}. Change `{field}`."
            )
    if evaluates_during_training(args):
        check_full_eval_precision(args)


def _no_cuda(args: Any) -> bool:
    return bool(getattr(args, "use_cpu", False)) or not torch.cuda.is_available()


def check_precision(args: Any) -> None:
    """Refuse ``fp16=True`` on a run without CUDA (fp16 mixed precision needs a GradScaler on a GPU)."""
    if getattr(args, "fp16", False) and _no_cuda(args):
        raise ValueError(
            "fp16=True needs a CUDA GPU (fp16 mixed precision with a GradScaler); this run is on the CPU. Use "
            "bf16=True for mixed precision on the CPU, or drop fp16."
        )


def check_full_eval_precision(args: Any) -> None:
    """Refuse ``fp16_full_eval=True`` on a run without CUDA (the model is cast to float16 to evaluate)."""
    if getattr(args, "fp16_full_eval", False) and _no_cuda(args):
        raise ValueError(
            "TrainingArguments.fp16_full_eval=True casts the model to float16 for evaluation, which needs a CUDA "
            "GPU; this run is on the CPU. Use bf16_full_eval=True (with use_cpu=True) for a half-precision "
            "evaluation on the CPU, or drop fp16_full_eval."
        )
