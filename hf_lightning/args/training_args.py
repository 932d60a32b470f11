"""`TrainingArguments`: HF transformers 5.23's training arguments, field for field.

The dataclass below has every init field of `transformers.TrainingArguments` 5.23 with
the same name, order, type and default, and reproduces HF's `__post_init__`
derivations and validation errors. It adds, at the end of the field list and as
keyword-only arguments, the transformers 4.x names that migrating scripts still pass
(`evaluation_strategy`, `warmup_ratio`, `logging_dir`, ...); each is mapped onto its
5.x field with a `FutureWarning`, or refused with a clear error.

Fields hf_lightning cannot honour raise a `ValueError` naming the field and what to
do instead when set to a non-default value; nothing is silently ignored. The full
per-field decision table is in `docs/migration.md`.

This module imports no Lightning and never initialises a process group: distributed
values are read from the launcher's environment (`WORLD_SIZE`, `RANK`, `LOCAL_RANK`).
"""

import contextlib
import copy
import dataclasses
import json
import logging
import math
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import torch

from hf_lightning.args.enums import (
    DebugOption,
    FSDPOption,
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    ParallelMode,
    SaveStrategy,
    SchedulerType,
)
from hf_lightning.args.validation import (
    LOG_LEVELS,
    NO_HUB,
    TRAIN_SAMPLING_CHOICES,
    check_choice,
    check_choices,
    check_hf_rules,
    refuse_unsupported,
)

__all__ = ["TrainingArguments"]

logger = logging.getLogger(__name__)

# HF's `AcceleratorConfig` defaults as they appear in `to_dict()` (HF pops `use_configured_state`
# from the object while setting up devices, so it is absent there too).
_ACCELERATOR_CONFIG_DEFAULTS: dict[str, Any] = {
    "split_batches": False,
    "dispatch_batches": None,
    "even_batches": True,
    "use_seedable_sampler": True,
    "non_blocking": False,
    "gradient_accumulation_kwargs": None,
}
_ACCELERATOR_CONFIG_KEYS = (*_ACCELERATOR_CONFIG_DEFAULTS, "use_configured_state")

# Sharding words of a legacy string `fsdp` value, and the wrap policies FSDP understands.
_FSDP_SHARDING_WORDS = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2")
_FSDP_AUTO_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")



def _default_optim() -> str:
    # HF switched its default to the fused AdamW kernel for torch >= 2.8.
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return "adamw_torch_fused" if (major, minor) >= (2, 8) else "adamw_torch"


def _deprecated_help(new: str) -> str:
    return f"Deprecated transformers 4.x name, mapped to `{new}` (FutureWarning)."


def _legacy_field(type_help: str, **metadata: Any) -> Any:
    """A keyword-only 4.x alias field: `None` means "not passed"."""
    return field(default=None, kw_only=True, metadata={"help": type_help, **metadata})


@dataclass
class TrainingArguments:
    """Every argument of a training run, with HF transformers 5.23's names, defaults and rules.

    Build it like HF's (`TrainingArguments(output_dir="out", eval_strategy="steps", ...)`)
    or parse it from the command line / JSON / YAML with `HfArgumentParser`. After
    construction the derived values are filled in exactly as HF does: strategies are
    enums, `eval_steps` falls back to `logging_steps`, `report_to` is a list, and so on.

    Transformers 4.x names are accepted as keyword arguments and mapped with a
    `FutureWarning` (see the fields after `local_rank`). Settings hf_lightning cannot
    honour (pushing to the Hub, TPU/IPEX/apex options, ...) raise a `ValueError` that
    names the field and the alternative.

    Example:
        >>> args = TrainingArguments(output_dir="out", eval_strategy="steps", logging_steps=10, report_to="none")
        >>> args.eval_steps, args.do_eval, args.eval_strategy.value
        (10, True, 'steps')

    Raises:
        ValueError: for an invalid value or combination (the message names the field), or
            for a setting hf_lightning does not support.
        TypeError: for an unknown keyword argument (standard dataclass behaviour).
    """

    # Fields whose value may be given as a JSON string (from a command line) and is then parsed.
    _VALID_DICT_FIELDS = [
        "accelerator_config",
        "fsdp_config",
        "deepspeed",
        "activation_checkpointing_kwargs",
        "gradient_checkpointing_kwargs",
        "lr_scheduler_kwargs",
    ]

    # --- Output ---
    output_dir: str | None = field(
        default=None,
        metadata={"help": "Where checkpoints and final outputs are written (default: 'trainer_output')."},
    )

    # --- Training length and batch size ---
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Training batch size on each device."})
    num_train_epochs: float = field(
        default=3.0, metadata={"help": "Number of training epochs; a fraction runs part of the last epoch."}
    )
    max_steps: int = field(
        default=-1,
        metadata={
            "help": "Total optimizer steps; when positive it overrides num_train_epochs. Required for datasets "
            "without a length."
        },
    )

    # --- Learning rate and schedule ---
    learning_rate: float = field(default=5e-5, metadata={"help": "Peak learning rate of the optimizer."})
    lr_scheduler_type: SchedulerType | str = field(
        default="linear", metadata={"help": "Learning-rate schedule; one of the SchedulerType values."}
    )
    lr_scheduler_kwargs: dict | str | None = field(
        default=None, metadata={"help": "Extra keyword arguments for the schedule (dict or JSON string)."}
    )
    warmup_steps: float = field(
        default=0,
        metadata={"help": "Linear warmup length: a step count, or a ratio of the total steps when below 1."},
    )

    # --- Optimizer ---
    optim: OptimizerNames | str = field(
        default=_default_optim(),
        metadata={"help": "Optimizer name; one of the OptimizerNames values."},
    )
    optim_args: str | None = field(
        default=None, metadata={"help": "Extra 'key=value,...' arguments for optimizers that take them."}
    )
    weight_decay: float = field(
        default=0.0, metadata={"help": "Decoupled weight decay; never applied to biases and norm weights."}
    )
    adam_beta1: float = field(default=0.9, metadata={"help": "Adam first-moment decay rate."})
    adam_beta2: float = field(default=0.999, metadata={"help": "Adam second-moment decay rate."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "Adam denominator epsilon."})
    optim_target_modules: None | str | list[str] = field(
        default=None, metadata={"help": "Module names the GaLore / APOLLO optimizers act on."}
    )

    # --- Regularisation and stability ---
    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Micro-batches accumulated into one optimizer step."}
    )
    average_tokens_across_devices: bool = field(
        default=True,
        metadata={"help": "Sum the loss-token counts over all processes so the loss is a global token mean."},
    )
    max_grad_norm: float = field(
        default=1.0, metadata={"help": "Gradient clipping norm; 0 disables clipping."}
    )
    label_smoothing_factor: float = field(default=0.0, metadata={"help": "Label smoothing epsilon; 0 disables it."})

    # --- Mixed precision ---
    bf16: bool = field(default=False, metadata={"help": "Train with bfloat16 mixed precision."})
    fp16: bool = field(default=False, metadata={"help": "Train with float16 mixed precision."})
    bf16_full_eval: bool = field(default=False, metadata={"help": "Evaluate with the model fully in bfloat16."})
    fp16_full_eval: bool = field(default=False, metadata={"help": "Evaluate with the model fully in float16."})
    tf32: bool | None = field(
        default=None, metadata={"help": "Allow TF32 matmuls on Ampere or newer GPUs (None leaves torch's setting)."}
    )

    # --- Activation checkpointing ---
    # `bool | None` so the deprecated alias below can tell "not given" from False; a bare
    # `--activation_checkpointing` on the command line means True.
    activation_checkpointing: bool | None = field(
        default=None,
        metadata={
            "help": "Recompute activations in the backward pass to save memory.",
            "nargs": "?",
            "const": True,
        },
    )
    activation_checkpointing_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata={"help": "Options for activation checkpointing (dict or JSON string)."}
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Deprecated alias of activation_checkpointing.", "nargs": "?", "const": True},
    )
    gradient_checkpointing_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata={"help": "Deprecated alias of activation_checkpointing_kwargs."}
    )

    # --- Compilation ---
    torch_compile: bool = field(default=False, metadata={"help": "Compile the model with torch.compile."})
    torch_compile_backend: str | None = field(
        default=None, metadata={"help": "torch.compile backend; setting it turns torch_compile on."}
    )
    torch_compile_mode: str | None = field(
        default=None, metadata={"help": "torch.compile mode; setting it turns torch_compile on."}
    )

    # --- Kernels ---
    use_liger_kernel: bool = field(default=False, metadata={"help": "Patch the model with Liger kernels."})
    liger_kernel_config: dict[str, bool] | None = field(
        default=None, metadata={"help": "Options for the Liger kernel patch."}
    )

    # --- Other optimisations ---
    use_cache: bool = field(
        default=False, metadata={"help": "Value given to model.config.use_cache while training."}
    )
    neftune_noise_alpha: float | None = field(
        default=None, metadata={"help": "NEFTune noise scale added to input embeddings while training."}
    )
    torch_empty_cache_steps: int | None = field(
        default=None, metadata={"help": "Empty the accelerator cache every this many steps (None: never)."}
    )
    auto_find_batch_size: bool = field(
        default=False, metadata={"help": "Retry training with 0.9x the batch size after an out-of-memory error."}
    )

    # --- Logging ---
    logging_strategy: IntervalStrategy | str = field(
        default="steps", metadata={"help": "When to log training metrics: 'no', 'steps' or 'epoch'."}
    )
    logging_steps: float = field(
        default=500,
        metadata={"help": "Log every this many steps; a value below 1 is a ratio of the total steps."},
    )
    logging_first_step: bool = field(default=False, metadata={"help": "Also log after the first step."})
    log_on_each_node: bool = field(
        default=True, metadata={"help": "In multi-node runs, log on the main process of every node."}
    )
    logging_nan_inf_filter: bool = field(
        default=True, metadata={"help": "Leave NaN/inf losses out of the logged loss (logging only)."}
    )
    include_num_input_tokens_seen: str | bool = field(
        default="no",
        metadata={"help": "Count input tokens seen: 'all', 'non_padding' or 'no' (True/False mean 'all'/'no')."},
    )
    log_level: str = field(
        default="passive",
        metadata={"help": "Log level of the main process.", "choices": list(LOG_LEVELS)},
    )
    log_level_replica: str = field(
        default="warning",
        metadata={"help": "Log level of the other processes.", "choices": list(LOG_LEVELS)},
    )
    disable_tqdm: bool | None = field(
        default=None, metadata={"help": "Hide progress bars (default: hidden when logging is quieter than WARNING)."}
    )

    # --- Experiment tracking ---
    report_to: None | str | list[str] = field(
        default="none",
        metadata={"help": "Loggers to report to: a name, a list, 'all' (every installed one) or 'none'."},
    )
    run_name: str | None = field(default=None, metadata={"help": "Name of the run in the experiment loggers."})
    project: str = field(default="huggingface", metadata={"help": "Project name used by the Trackio logger."})
    trackio_space_id: str | None = field(default=None, metadata={"help": "Trackio Space to log to."})
    trackio_bucket_id: str | None = field(default=None, metadata={"help": "Trackio Bucket used by the Space."})
    trackio_static_space_id: str | None | Literal[False] = field(
        default=None, metadata={"help": "Static Trackio Space for the dashboard."}
    )

    # --- Evaluation ---
    eval_strategy: IntervalStrategy | str = field(
        default="no", metadata={"help": "When to evaluate during training: 'no', 'steps' or 'epoch'."}
    )
    eval_steps: float | None = field(
        default=None,
        metadata={
            "help": "Evaluate every this many steps (default: logging_steps); below 1 is a ratio of the total steps."
        },
    )
    eval_delay: float = field(
        default=0, metadata={"help": "Epochs or steps (per eval_strategy) to wait before the first evaluation."}
    )
    per_device_eval_batch_size: int = field(default=8, metadata={"help": "Evaluation batch size on each device."})
    prediction_loss_only: bool = field(
        default=False, metadata={"help": "Return only the loss from evaluation and prediction."}
    )
    eval_on_start: bool = field(default=False, metadata={"help": "Evaluate once before the first training step."})
    eval_do_concat_batches: bool = field(
        default=True, metadata={"help": "Concatenate predictions across batches (False keeps a list per batch)."}
    )
    eval_use_gather_object: bool = field(
        default=False, metadata={"help": "Gather arbitrary (non-tensor) objects from all processes in evaluation."}
    )
    eval_accumulation_steps: int | None = field(
        default=None, metadata={"help": "Move predictions to the CPU every this many evaluation steps."}
    )
    include_for_metrics: list[str] = field(
        default_factory=list, metadata={"help": "Extra data passed to compute_metrics: 'inputs' and/or 'loss'."}
    )
    batch_eval_metrics: bool = field(
        default=False, metadata={"help": "Call compute_metrics per batch with compute_result on the last one."}
    )

    # --- Checkpoints ---
    save_only_model: bool = field(
        default=False, metadata={"help": "Save only the weights (no optimizer/scheduler/RNG state; no resume)."}
    )
    save_strategy: SaveStrategy | str = field(
        default="steps", metadata={"help": "When to save a checkpoint: 'no', 'steps', 'epoch' or 'best'."}
    )
    save_steps: float = field(
        default=500, metadata={"help": "Save every this many steps; a value below 1 is a ratio of the total steps."}
    )
    save_on_each_node: bool = field(
        default=False, metadata={"help": "In multi-node runs, save on the main process of every node."}
    )
    save_total_limit: int | None = field(
        default=None, metadata={"help": "Keep at most this many checkpoints (the best one is always kept)."}
    )
    enable_jit_checkpoint: bool = field(
        default=False, metadata={"help": "Save a checkpoint when the process receives SIGTERM."}
    )

    # --- Hub (never pushed to by hf_lightning) ---
    push_to_hub: bool = field(default=False, metadata={"help": "Push saves to the Hugging Face Hub (unsupported)."})
    hub_token: str | None = field(default=None, metadata={"help": "Hub token (only used when pushing)."})
    hub_private_repo: bool | None = field(default=None, metadata={"help": "Make the Hub repo private."})
    hub_model_id: str | None = field(default=None, metadata={"help": "Hub repository to push to."})
    hub_strategy: HubStrategy | str = field(
        default="every_save", metadata={"help": "What to push and when: one of the HubStrategy values."}
    )
    hub_always_push: bool = field(default=False, metadata={"help": "Push even when the previous push is running."})
    hub_revision: str | None = field(default=None, metadata={"help": "Hub branch, tag or commit to push to."})

    # --- Best model ---
    load_best_model_at_end: bool = field(
        default=False, metadata={"help": "Load the best checkpoint when training ends (needs evaluation)."}
    )
    metric_for_best_model: str | None = field(
        default=None,
        metadata={"help": "Metric that decides the best checkpoint, with or without 'eval_' (default: loss)."},
    )
    greater_is_better: bool | None = field(
        default=None,
        metadata={"help": "Whether a larger metric is better (default: False only for names ending in 'loss')."},
    )

    # --- Resuming ---
    ignore_data_skip: bool = field(
        default=False, metadata={"help": "On resume, start from the first batch instead of skipping seen data."}
    )
    restore_callback_states_from_checkpoint: bool = field(
        default=False, metadata={"help": "On resume, restore the saved state of stateful callbacks."}
    )

    # --- Reproducibility ---
    full_determinism: bool = field(
        default=False, metadata={"help": "Enable deterministic algorithms everywhere (slow; for debugging)."}
    )
    seed: int = field(default=42, metadata={"help": "Random seed set at the start of training."})
    data_seed: int | None = field(default=None, metadata={"help": "Seed of the data samplers (default: seed)."})

    # --- Hardware ---
    use_cpu: bool = field(default=False, metadata={"help": "Run on the CPU even when an accelerator is present."})

    # --- Accelerate-specific settings ---
    accelerator_config: dict | str | None = field(
        default=None, metadata={"help": "HF's Accelerate options (dict, JSON string or JSON file path)."}
    )
    # HF types this as accelerate's `ParallelismConfig`; hf_lightning does not depend on accelerate (read in
    # args/parallelism.py).
    parallelism_config: object | None = field(
        default=None, metadata={"help": "Accelerate ParallelismConfig: dp_replicate_size / dp_shard_size."}
    )

    # --- Data loading ---
    dataloader_drop_last: bool = field(default=False, metadata={"help": "Drop the last incomplete batch."})
    dataloader_num_workers: int = field(
        default=0, metadata={"help": "DataLoader worker processes (0 loads in the main process)."}
    )
    dataloader_pin_memory: bool = field(default=True, metadata={"help": "Pin DataLoader memory."})
    dataloader_persistent_workers: bool = field(
        default=False, metadata={"help": "Keep DataLoader workers alive between epochs."}
    )
    dataloader_prefetch_factor: int | None = field(
        default=None, metadata={"help": "Batches prefetched by each worker (needs dataloader_num_workers > 0)."}
    )
    dataloader_multiprocessing_context: str | None = field(
        default=None,
        metadata={"help": "Start method of DataLoader workers.", "choices": ["fork", "spawn", "forkserver"]},
    )
    dataloader_in_order: bool = field(
        default=True, metadata={"help": "Yield batches in dispatch order (False: as soon as ready)."}
    )
    remove_unused_columns: bool = field(
        default=True, metadata={"help": "Drop dataset columns the model's forward does not accept."}
    )
    label_names: list[str] | None = field(default=None, metadata={"help": "Input keys that hold the labels."})
    train_sampling_strategy: str = field(
        default="random",
        metadata={"help": "Training sampler.", "choices": list(TRAIN_SAMPLING_CHOICES)},
    )
    length_column_name: str = field(
        default="length", metadata={"help": "Column with precomputed lengths for length-grouped sampling."}
    )

    # --- DDP ---
    ddp_find_unused_parameters: bool | None = field(
        default=None, metadata={"help": "DDP find_unused_parameters."}
    )
    ddp_bucket_cap_mb: int | None = field(default=None, metadata={"help": "DDP bucket_cap_mb."})
    ddp_broadcast_buffers: bool | None = field(default=None, metadata={"help": "DDP broadcast_buffers."})
    ddp_static_graph: bool | None = field(default=None, metadata={"help": "DDP static_graph."})
    ddp_backend: str | None = field(
        default=None,
        metadata={
            "help": "Distributed backend.",
            "choices": ["nccl", "gloo", "mpi", "xccl", "hccl", "cncl", "mccl"],
        },
    )
    ddp_timeout: int = field(default=1800, metadata={"help": "Process-group timeout in seconds."})

    # --- FSDP ---
    # A bare `--fsdp` means True; the legacy string form (`--fsdp "full_shard offload"`) still parses.
    fsdp: str | None = field(
        default=None,
        metadata={"help": "Train with Fully Sharded Data Parallel.", "nargs": "?", "const": True},
    )
    fsdp_config: dict[str, Any] | str | None = field(
        default=None, metadata={"help": "FSDP options (dict, JSON string or JSON file path)."}
    )

    # --- DeepSpeed ---
    deepspeed: dict | str | None = field(
        default=None, metadata={"help": "DeepSpeed config (dict, JSON string or JSON file path)."}
    )

    # --- Debugging ---
    debug: str | list[DebugOption] = field(
        default="", metadata={"help": "Debug features: 'underflow_overflow', 'tpu_metrics_debug' (refused: no TPU)."}
    )
    skip_memory_metrics: bool = field(default=True, metadata={"help": "Do not report memory usage metrics."})

    # --- Flags read by training scripts, not by the Trainer ---
    do_train: bool = field(default=False, metadata={"help": "Script flag: run training."})
    do_eval: bool = field(default=False, metadata={"help": "Script flag: run evaluation."})
    do_predict: bool = field(default=False, metadata={"help": "Script flag: run prediction."})
    resume_from_checkpoint: str | None = field(
        default=None, metadata={"help": "Script flag: checkpoint folder to resume from."}
    )
    local_rank: int = field(
        default=-1,
        metadata={"help": "Local rank passed by old launchers; prefer the local_process_index property."},
    )

    # --- transformers 4.x names (keyword-only; None means "not passed") ---
    # Kept out of HF's positional order on purpose; mapped or refused in `_apply_legacy_names`.
    evaluation_strategy: str | None = _legacy_field(_deprecated_help("eval_strategy"))
    overwrite_output_dir: bool | None = _legacy_field(
        "Deprecated 4.x flag; accepted with no effect (training scripts may still read it).",
        nargs="?",
        const=True,
    )
    per_gpu_train_batch_size: int | None = _legacy_field(_deprecated_help("per_device_train_batch_size"))
    per_gpu_eval_batch_size: int | None = _legacy_field(_deprecated_help("per_device_eval_batch_size"))
    warmup_ratio: float | None = _legacy_field(_deprecated_help("warmup_steps (as a ratio below 1)"))
    logging_dir: str | None = _legacy_field("Deprecated 4.x name; kept as the TensorBoard log directory.")
    save_safetensors: bool | None = _legacy_field(
        "Deprecated 4.x flag; weights are always saved as safetensors (False is refused).", nargs="?", const=True
    )
    no_cuda: bool | None = _legacy_field(_deprecated_help("use_cpu"), nargs="?", const=True)
    use_mps_device: bool | None = _legacy_field(
        "Deprecated 4.x flag; MPS is used automatically when available.", nargs="?", const=True
    )
    use_ipex: bool | None = _legacy_field("Removed 4.x flag (Intel IPEX); True is refused.", nargs="?", const=True)
    jit_mode_eval: bool | None = _legacy_field(
        "Removed 4.x flag (TorchScript evaluation); True is refused.", nargs="?", const=True
    )
    fp16_opt_level: str | None = _legacy_field("Removed 4.x apex option; values other than 'O1' are refused.")
    half_precision_backend: str | None = _legacy_field("Removed 4.x option; 'apex' is refused.")
    fp16_backend: str | None = _legacy_field("Removed 4.x option; 'apex' is refused.")
    tpu_num_cores: int | None = _legacy_field("Removed 4.x TPU option; refused when set.")
    tpu_metrics_debug: bool | None = _legacy_field(
        "Removed 4.x TPU option; True is refused.", nargs="?", const=True
    )
    past_index: int | None = _legacy_field("Removed 4.x option (past model states); values >= 0 are refused.")
    fsdp_min_num_params: int | None = _legacy_field(_deprecated_help("fsdp_config['min_num_params']"))
    fsdp_transformer_layer_cls_to_wrap: str | None = _legacy_field(
        _deprecated_help("fsdp_config['transformer_layer_cls_to_wrap']")
    )
    adafactor: bool | None = _legacy_field(_deprecated_help("optim='adafactor'"), nargs="?", const=True)
    group_by_length: bool | None = _legacy_field(
        _deprecated_help("train_sampling_strategy='group_by_length'"), nargs="?", const=True
    )
    use_legacy_prediction_loop: bool | None = _legacy_field(
        "Removed 4.x flag; True is refused.", nargs="?", const=True
    )
    include_inputs_for_metrics: bool | None = _legacy_field(
        _deprecated_help("include_for_metrics=['inputs']"), nargs="?", const=True
    )
    include_tokens_per_second: bool | None = _legacy_field(
        "Removed 4.x flag (tokens/s metric); True is refused.", nargs="?", const=True
    )
    push_to_hub_model_id: str | None = _legacy_field(_deprecated_help("hub_model_id"))
    push_to_hub_organization: str | None = _legacy_field(_deprecated_help("hub_model_id ('org/name')"))
    push_to_hub_token: str | None = _legacy_field(_deprecated_help("hub_token"))
    mp_parameters: str | None = _legacy_field("Removed 4.x SageMaker option; refused when non-empty.")
    torchdynamo: str | None = _legacy_field(_deprecated_help("torch_compile_backend"))
    ray_scope: str | None = _legacy_field("Removed 4.x Ray Tune option (now RAY_SCOPE); refused unless 'last'.")

    # ------------------------------------------------------------------------------------------
    # Derivation and validation
    # ------------------------------------------------------------------------------------------

    def __post_init__(self) -> None:
        # HF's order: defaults, enums, derived values, validation, then the runtime settings.
        # 4.x names go first because they feed the 5.x fields everything below reads.
        self._apply_legacy_names()
        self._fill_defaults()
        self._convert_enums()
        self._derive_values()
        check_hf_rules(self)
        check_choices(self)
        self._derive_runtime_settings()
        refuse_unsupported(self)

    def _fill_defaults(self) -> None:
        if self.output_dir is None:
            self.output_dir = "trainer_output"
            logger.info("No output_dir given; using 'trainer_output'.")
        for name in self._VALID_DICT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, str) and value.startswith("{"):
                setattr(self, name, _parse_json_dict(name, value))
        self._resolve_activation_checkpointing()
        self.output_dir = os.path.expanduser(self.output_dir)
        if self.logging_dir is not None:
            self.logging_dir = os.path.expanduser(self.logging_dir)
        if self.disable_tqdm is None:
            # HF hides progress bars when its own logger is quieter than WARNING.
            self.disable_tqdm = logger.getEffectiveLevel() > logging.WARNING
        if isinstance(self.include_num_input_tokens_seen, bool):
            self.include_num_input_tokens_seen = "all" if self.include_num_input_tokens_seen else "no"

    def _convert_enums(self) -> None:
        self.eval_strategy = _to_enum("eval_strategy", IntervalStrategy, self.eval_strategy)
        self.logging_strategy = _to_enum("logging_strategy", IntervalStrategy, self.logging_strategy)
        self.save_strategy = _to_enum("save_strategy", SaveStrategy, self.save_strategy)
        self.hub_strategy = _to_enum("hub_strategy", HubStrategy, self.hub_strategy)
        self.lr_scheduler_type = _to_enum("lr_scheduler_type", SchedulerType, self.lr_scheduler_type)
        self.optim = _to_enum("optim", OptimizerNames, self.optim)
        self.debug = _to_debug_options(self.debug)

    def _derive_values(self) -> None:
        if not self.do_eval and self.eval_strategy != IntervalStrategy.NO:
            self.do_eval = True
        if self.eval_strategy == IntervalStrategy.STEPS and not self.eval_steps:
            if self.logging_steps > 0:
                logger.info(f"eval_steps not set; using logging_steps={self.logging_steps}")
                self.eval_steps = self.logging_steps
            else:
                raise ValueError(
                    f"evaluation strategy {self.eval_strategy} requires either non-zero --eval_steps or"
                    " --logging_steps"
                )
        # The scheduler types driven by a metric need one even without load_best_model_at_end.
        needs_metric = self.load_best_model_at_end or self.lr_scheduler_type in (
            SchedulerType.REDUCE_ON_PLATEAU,
            SchedulerType.GREEDY,
        )
        if needs_metric and self.metric_for_best_model is None:
            self.metric_for_best_model = "loss"
        if self.greater_is_better is None and self.metric_for_best_model is not None:
            self.greater_is_better = not self.metric_for_best_model.endswith("loss")
        self.report_to = _normalize_report_to(self.report_to)

    def _derive_runtime_settings(self) -> None:
        self.mixed_precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
        if self.fp16:
            self.mixed_precision = "fp16"
        elif self.bf16:
            self.mixed_precision = "bf16"
        if not self.torch_compile and (self.torch_compile_mode is not None or self.torch_compile_backend is not None):
            self.torch_compile = True
        if self.torch_compile and self.torch_compile_backend is None:
            self.torch_compile_backend = "inductor"

        self.accelerator_config = _normalize_accelerator_config(self.accelerator_config)
        if self.tf32 and not _tf32_available():
            raise ValueError("--tf32 requires Ampere or a newer GPU arch, cuda>=11 and torch>=1.7")
        if self.use_cpu:
            self.dataloader_pin_memory = False
        if (
            self.dataloader_multiprocessing_context is None
            and self.dataloader_num_workers > 1
            and torch.backends.mps.is_available()
        ):
            # HF's rule: several DataLoader workers on MPS default to the fork start method.
            self.dataloader_multiprocessing_context = "fork"
        self._normalize_fsdp()

    def _resolve_activation_checkpointing(self) -> None:
        # The old names only fill the new ones when those are unset; afterwards both mirror the
        # new value so a copy of the args (dataclasses.replace) that changes the new name wins.
        for old, new in (
            ("gradient_checkpointing", "activation_checkpointing"),
            ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
        ):
            if getattr(self, new) is None and getattr(self, old) is not None:
                warnings.warn(
                    f"`{old}` is deprecated (transformers 5 renamed it); use `{new}` instead.",
                    FutureWarning,
                    stacklevel=5,
                )
                setattr(self, new, getattr(self, old))
            setattr(self, old, getattr(self, new))
        if self.activation_checkpointing is None:
            self.activation_checkpointing = self.gradient_checkpointing = False

    def _normalize_fsdp(self) -> None:
        """Bring `fsdp` / `fsdp_config` into HF 5.23's normal form (`fsdp=True` + a config dict)."""
        if not self.fsdp:
            return
        config = self.fsdp_config
        if config is None:
            config = {}
        elif isinstance(config, str):
            config = _load_json_file("fsdp_config", config)
        else:
            config = copy.deepcopy(dict(config))
        # HF accepts Accelerate-style keys with an `fsdp_` prefix.
        for key in [key for key in config if key.startswith("fsdp_")]:
            config[key[len("fsdp_") :]] = config.pop(key)
        if isinstance(self.fsdp, (str, list, tuple)):
            _apply_legacy_fsdp_words(self.fsdp, config)
        self.fsdp = True
        config.setdefault("min_num_params", 0)
        if isinstance(config.get("transformer_layer_cls_to_wrap"), str):
            config["transformer_layer_cls_to_wrap"] = [config["transformer_layer_cls_to_wrap"]]
        for key in ("xla", "xla_fsdp_v2", "xla_fsdp_grad_ckpt"):
            config.setdefault(key, False)
        policy = config.get("auto_wrap_policy", _FSDP_AUTO_WRAP_POLICIES[0])
        if policy not in _FSDP_AUTO_WRAP_POLICIES:
            raise ValueError(
                f"fsdp_config: `auto_wrap_policy` must be one of {list(_FSDP_AUTO_WRAP_POLICIES)}, got {policy}."
            )
        if self.activation_checkpointing:
            logger.warning(
                "With FSDP prefer fsdp_config['activation_checkpointing'] over activation_checkpointing=True; "
                "the latter adds an extra all-gather in the backward pass."
            )
        self.fsdp_config = config

    # ------------------------------------------------------------------------------------------
    # transformers 4.x names and unsupported settings
    # ------------------------------------------------------------------------------------------

    def _apply_legacy_names(self) -> None:
        for name, handler in _LEGACY_HANDLERS.items():
            value = getattr(self, name)
            if value is None:
                continue
            keep = handler(self, value)
            if not keep:
                # The value now lives in its 5.x field; clearing the alias keeps `to_dict()` and
                # `dataclasses.replace` from mapping it a second time.
                setattr(self, name, None)

    # ------------------------------------------------------------------------------------------
    # Serialization
    # ------------------------------------------------------------------------------------------

    def _init_items(self) -> Iterator[tuple[str, Any]]:
        # Unset 4.x aliases are left out so the output matches HF 5.23's field for field.
        for f in fields(self):
            if not f.init:
                continue
            value = getattr(self, f.name)
            if value is None and f.name in _LEGACY_HANDLERS:
                continue
            yield f.name, value

    def __str__(self) -> str:
        items = {
            name: (f"<{name.upper()}>" if name.endswith("_token") else value) for name, value in self._init_items()
        }
        lines = "".join(f"{name}={value},\n" for name, value in sorted(items.items()))
        return f"{type(self).__name__}(\n{lines})"

    __repr__ = __str__

    def to_dict(self) -> dict[str, Any]:
        """Return the init fields as a JSON-friendly dict.

        Enums become their values, tokens are masked as `"<FIELD_NAME>"`, nested
        `torch.dtype` values under a `dtype` key become strings, and 4.x alias fields
        that were not passed (or were mapped onto a 5.x field) are omitted.

        Returns:
            A new dict; changing it does not change the arguments.
        """
        result: dict[str, Any] = {}
        for name, value in self._init_items():
            if isinstance(value, Enum):
                value = value.value
            elif isinstance(value, list) and value and isinstance(value[0], Enum):
                value = [item.value for item in value]
            else:
                value = copy.deepcopy(value)
            if name.endswith("_token"):
                value = f"<{name.upper()}>"
            if name == "parallelism_config" and value is not None:
                # HF writes ParallelismConfig.to_json(), which returns None (accelerate 1.15).
                value = None
            result[name] = value
        _dtypes_to_str(result)
        return result

    def to_json_string(self) -> str:
        """Return `to_dict()` as indented JSON (keys in field order)."""
        return json.dumps(self.to_dict(), indent=2)

    def to_sanitized_dict(self) -> dict[str, Any]:
        """Return `to_dict()` plus the effective batch sizes, every value a scalar (for TensorBoard hparams).

        Values that are not `bool`, `int`, `float`, `str` or `torch.Tensor` are turned into
        their `str()` (so `None` becomes `"None"` and lists become their text).
        """
        values = {**self.to_dict(), "train_batch_size": self.train_batch_size, "eval_batch_size": self.eval_batch_size}
        scalar_types = (bool, int, float, str, torch.Tensor)
        return {name: value if type(value) in scalar_types else str(value) for name, value in values.items()}

    # ------------------------------------------------------------------------------------------
    # Derived values (read from the launcher's environment; nothing is initialised)
    # ------------------------------------------------------------------------------------------

    @property
    def train_batch_size(self) -> int:
        """Samples per training step in this process (more than the per-device size only under DataParallel)."""
        return self.per_device_train_batch_size * max(1, self.n_gpu)

    @property
    def eval_batch_size(self) -> int:
        """Samples per evaluation step in this process."""
        return self.per_device_eval_batch_size * max(1, self.n_gpu)

    @property
    def ddp_timeout_delta(self) -> timedelta:
        """`ddp_timeout` as the `timedelta` process-group initialisation expects."""
        return timedelta(seconds=self.ddp_timeout)

    @property
    def world_size(self) -> int:
        """Number of processes taking part (`WORLD_SIZE`, else an initialised process group, else 1)."""
        env = _env_int("WORLD_SIZE")
        if env is not None:
            return env
        if _process_group_ready():
            return torch.distributed.get_world_size()
        return 1

    @property
    def process_index(self) -> int:
        """Global rank of this process (`RANK`, else an initialised process group, else 0)."""
        env = _env_int("RANK")
        if env is not None:
            return env
        if _process_group_ready():
            return torch.distributed.get_rank()
        return 0

    @property
    def local_process_index(self) -> int:
        """Rank of this process on its node (`LOCAL_RANK`, else the `local_rank` argument, else 0)."""
        env = _env_int("LOCAL_RANK")
        if env is not None:
            return env
        return self.local_rank if self.local_rank >= 0 else 0

    @property
    def _use_cpu(self) -> bool:
        return self.use_cpu or _truthy(os.environ.get("ACCELERATE_USE_CPU", "false"))

    @property
    def n_gpu(self) -> int:
        """Accelerators this process drives: 0 on CPU, 1 per process when distributed, all of them otherwise.

        As in HF, more than one only happens in a single process that sees several
        GPUs (DataParallel), and an MPS device counts as one.
        """
        if self._use_cpu:
            return 0
        if self.world_size > 1:
            # One device per process; a CPU-only process group drives none.
            return 1 if torch.cuda.is_available() else 0
        if torch.backends.mps.is_available():
            return 1
        return torch.cuda.device_count()

    @property
    def device(self) -> torch.device:
        """The device this process trains on: CPU when `use_cpu` or no accelerator is present."""
        if self._use_cpu:
            return torch.device("cpu")
        if self.world_size > 1:
            if torch.cuda.is_available():
                return torch.device("cuda", self.local_process_index)
            return torch.device("cpu")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        if torch.cuda.is_available():
            return torch.device("cuda:0")
        return torch.device("cpu")

    @property
    def parallel_mode(self) -> ParallelMode:
        """`DISTRIBUTED` with several processes, `NOT_DISTRIBUTED` for single-process multi-GPU, else `NOT_PARALLEL`."""
        if self.world_size > 1:
            return ParallelMode.DISTRIBUTED
        if self.n_gpu > 1:
            return ParallelMode.NOT_DISTRIBUTED
        return ParallelMode.NOT_PARALLEL

    @property
    def should_log(self) -> bool:
        """Whether this process logs: local rank 0 with `log_on_each_node`, else global rank 0."""
        if self.log_on_each_node:
            return self.local_process_index == 0
        return self.process_index == 0

    @property
    def should_save(self) -> bool:
        """Whether this process writes files: local rank 0 with `save_on_each_node`, else global rank 0."""
        if self.save_on_each_node:
            return self.local_process_index == 0
        return self.process_index == 0

    @property
    def place_model_on_device(self) -> bool | None:
        """HF's hook for integrations that place the model themselves; `None` means "decide as usual"."""
        return None

    def get_process_log_level(self) -> int:
        """Return the `logging` level for this process.

        Processes that log (see `should_log`) use `log_level`, the others
        `log_level_replica`; `"passive"` means the current level of the `hf_lightning` logger.
        """
        current = logging.getLogger("hf_lightning").getEffectiveLevel()
        main = LOG_LEVELS[self.log_level]
        replica = LOG_LEVELS[self.log_level_replica]
        main = current if main == -1 else main
        replica = current if replica == -1 else replica
        return main if self.should_log else replica

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """Return the number of warmup steps for a run of `num_training_steps` optimizer steps.

        A `warmup_steps` of at least 1 is a step count; below 1 it is a ratio, rounded up.
        """
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        return math.ceil(num_training_steps * self.warmup_steps)

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work") -> Iterator[None]:
        """Run the block on the main process first while the others wait, then on the others.

        Typical use is dataset preprocessing whose cache the other processes then reuse.
        It synchronises with `torch.distributed.barrier()` and so only waits when a process
        group is initialised; otherwise the block simply runs.

        Args:
            local: main process of each node (True) or only global rank 0 (False).
            desc: what the block does, for debug logs.
        """
        if self.world_size <= 1 or not _process_group_ready():
            yield
            return
        is_main = (self.local_process_index if local else self.process_index) == 0
        who = "main local process" if local else "main process"
        try:
            if not is_main:
                logger.debug(f"{self.process_index}: waiting for the {who} to perform {desc}")
                torch.distributed.barrier()
            yield
        finally:
            if is_main:
                logger.debug(f"{self.process_index}: {who} completed {desc}, releasing the others")
                torch.distributed.barrier()

    # ------------------------------------------------------------------------------------------
    # Grouped setters (HF's convenience API); each returns self
    # ------------------------------------------------------------------------------------------

    def set_training(
        self,
        learning_rate: float = 5e-5,
        batch_size: int = 8,
        weight_decay: float = 0,
        num_epochs: float = 3,
        max_steps: int = -1,
        gradient_accumulation_steps: int = 1,
        seed: int = 42,
        activation_checkpointing: bool = False,
        gradient_checkpointing: bool | None = None,
    ) -> "TrainingArguments":
        """Set the basic training hyperparameters and `do_train=True`.

        Args:
            learning_rate: `learning_rate`.
            batch_size: `per_device_train_batch_size`.
            weight_decay: `weight_decay`.
            num_epochs: `num_train_epochs`.
            max_steps: `max_steps`.
            gradient_accumulation_steps: `gradient_accumulation_steps`.
            seed: `seed`.
            activation_checkpointing: `activation_checkpointing`.
            gradient_checkpointing: deprecated alias of `activation_checkpointing`.

        Returns:
            self, for chaining.
        """
        self.do_train = True
        self.learning_rate = learning_rate
        self.per_device_train_batch_size = batch_size
        self.weight_decay = weight_decay
        self.num_train_epochs = num_epochs
        self.max_steps = max_steps
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.seed = seed
        if gradient_checkpointing is not None:
            warnings.warn(
                "`gradient_checkpointing` is deprecated (transformers 5 renamed it); use `activation_checkpointing`.",
                FutureWarning,
                stacklevel=2,
            )
            activation_checkpointing = gradient_checkpointing
        self.activation_checkpointing = self.gradient_checkpointing = activation_checkpointing
        return self

    def set_evaluate(
        self,
        strategy: str | IntervalStrategy = "no",
        steps: int = 500,
        batch_size: int = 8,
        accumulation_steps: int | None = None,
        delay: float | None = None,
        loss_only: bool = False,
    ) -> "TrainingArguments":
        """Set the evaluation options; a strategy other than "no" also sets `do_eval=True`.

        Args:
            strategy: `eval_strategy`.
            steps: `eval_steps` (must be positive with strategy "steps").
            batch_size: `per_device_eval_batch_size`.
            accumulation_steps: `eval_accumulation_steps`.
            delay: `eval_delay`.
            loss_only: `prediction_loss_only`.

        Returns:
            self, for chaining.

        Raises:
            ValueError: strategy "steps" with `steps=0`, or an unknown strategy.
        """
        self.eval_strategy = _to_enum("eval_strategy", IntervalStrategy, strategy)
        if self.eval_strategy == IntervalStrategy.STEPS and steps == 0:
            raise ValueError("Setting `strategy` as 'steps' requires a positive value for `steps`.")
        self.do_eval = self.eval_strategy != IntervalStrategy.NO
        self.eval_steps = steps
        self.per_device_eval_batch_size = batch_size
        self.eval_accumulation_steps = accumulation_steps
        self.eval_delay = delay
        self.prediction_loss_only = loss_only
        return self

    def set_testing(self, batch_size: int = 8, loss_only: bool = False) -> "TrainingArguments":
        """Set the prediction options and `do_predict=True`.

        Args:
            batch_size: `per_device_eval_batch_size`.
            loss_only: `prediction_loss_only`.

        Returns:
            self, for chaining.
        """
        self.do_predict = True
        self.per_device_eval_batch_size = batch_size
        self.prediction_loss_only = loss_only
        return self

    def set_save(
        self,
        strategy: str | IntervalStrategy = "steps",
        steps: int = 500,
        total_limit: int | None = None,
        on_each_node: bool = False,
    ) -> "TrainingArguments":
        """Set the checkpoint options.

        Args:
            strategy: `save_strategy`.
            steps: `save_steps` (must be positive with strategy "steps").
            total_limit: `save_total_limit`.
            on_each_node: `save_on_each_node`.

        Returns:
            self, for chaining.

        Raises:
            ValueError: strategy "steps" with `steps=0`, or an unknown strategy.
        """
        self.save_strategy = _to_enum("save_strategy", SaveStrategy, strategy)
        if self.save_strategy == SaveStrategy.STEPS and steps == 0:
            raise ValueError("Setting `strategy` as 'steps' requires a positive value for `steps`.")
        self.save_steps = steps
        self.save_total_limit = total_limit
        self.save_on_each_node = on_each_node
        return self

    def set_logging(
        self,
        strategy: str | IntervalStrategy = "steps",
        steps: int = 500,
        report_to: str | list[str] = "none",
        level: str = "passive",
        first_step: bool = False,
        nan_inf_filter: bool = False,
        on_each_node: bool = False,
        replica_level: str = "passive",
    ) -> "TrainingArguments":
        """Set the logging options.

        Unlike HF, `report_to` is normalised here as at construction ("none" becomes `[]`).

        Args:
            strategy: `logging_strategy`.
            steps: `logging_steps` (must be positive with strategy "steps").
            report_to: `report_to`.
            level: `log_level`.
            first_step: `logging_first_step`.
            nan_inf_filter: `logging_nan_inf_filter`.
            on_each_node: `log_on_each_node`.
            replica_level: `log_level_replica`.

        Returns:
            self, for chaining.

        Raises:
            ValueError: strategy "steps" with `steps=0`, an unknown strategy or log level.
        """
        self.logging_strategy = _to_enum("logging_strategy", IntervalStrategy, strategy)
        if self.logging_strategy == IntervalStrategy.STEPS and steps == 0:
            raise ValueError("Setting `strategy` as 'steps' requires a positive value for `steps`.")
        check_choice("log_level", level, tuple(LOG_LEVELS))
        check_choice("log_level_replica", replica_level, tuple(LOG_LEVELS))
        self.logging_steps = steps
        self.report_to = _normalize_report_to(report_to)
        self.log_level = level
        self.logging_first_step = first_step
        self.logging_nan_inf_filter = nan_inf_filter
        self.log_on_each_node = on_each_node
        self.log_level_replica = replica_level
        return self

    def set_push_to_hub(
        self,
        model_id: str,
        strategy: str | HubStrategy = "every_save",
        token: str | None = None,
        private_repo: bool | None = None,
        always_push: bool = False,
        revision: str | None = None,
    ) -> "TrainingArguments":
        """Always raises: hf_lightning never pushes to the Hugging Face Hub.

        Raises:
            ValueError: always; upload `output_dir` yourself (e.g. `huggingface_hub.upload_folder`).
        """
        raise ValueError(
            f"set_push_to_hub(model_id={model_id!r}) is not supported by hf_lightning: {NO_HUB}"
        )

    def set_optimizer(
        self,
        name: str | OptimizerNames = "adamw_torch",
        learning_rate: float = 5e-5,
        weight_decay: float = 0,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        args: str | None = None,
    ) -> "TrainingArguments":
        """Set the optimizer and its hyperparameters.

        Args:
            name: `optim`.
            learning_rate: `learning_rate`.
            weight_decay: `weight_decay`.
            beta1: `adam_beta1`.
            beta2: `adam_beta2`.
            epsilon: `adam_epsilon`.
            args: `optim_args`.

        Returns:
            self, for chaining.

        Raises:
            ValueError: an unknown optimizer name.
        """
        self.optim = _to_enum("optim", OptimizerNames, name)
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.adam_beta1 = beta1
        self.adam_beta2 = beta2
        self.adam_epsilon = epsilon
        self.optim_args = args
        return self

    def set_lr_scheduler(
        self,
        name: str | SchedulerType = "linear",
        num_epochs: float = 3.0,
        max_steps: int = -1,
        warmup_steps: float = 0,
    ) -> "TrainingArguments":
        """Set the learning-rate schedule and the run length.

        Args:
            name: `lr_scheduler_type`.
            num_epochs: `num_train_epochs`.
            max_steps: `max_steps`.
            warmup_steps: `warmup_steps` (a count, or a ratio below 1).

        Returns:
            self, for chaining.

        Raises:
            ValueError: an unknown scheduler name.
        """
        self.lr_scheduler_type = _to_enum("lr_scheduler_type", SchedulerType, name)
        self.num_train_epochs = num_epochs
        self.max_steps = max_steps
        self.warmup_steps = warmup_steps
        return self

    def set_dataloader(
        self,
        train_batch_size: int = 8,
        eval_batch_size: int = 8,
        drop_last: bool = False,
        num_workers: int = 0,
        pin_memory: bool = True,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        multiprocessing_context: str | None = None,
        in_order: bool = True,
        auto_find_batch_size: bool = False,
        ignore_data_skip: bool = False,
        sampler_seed: int | None = None,
    ) -> "TrainingArguments":
        """Set the data-loading options.

        Args:
            train_batch_size: `per_device_train_batch_size`.
            eval_batch_size: `per_device_eval_batch_size`.
            drop_last: `dataloader_drop_last`.
            num_workers: `dataloader_num_workers`.
            pin_memory: `dataloader_pin_memory`.
            persistent_workers: `dataloader_persistent_workers`.
            prefetch_factor: `dataloader_prefetch_factor`.
            multiprocessing_context: `dataloader_multiprocessing_context`.
            in_order: `dataloader_in_order`.
            auto_find_batch_size: `auto_find_batch_size`.
            ignore_data_skip: `ignore_data_skip`.
            sampler_seed: `data_seed`.

        Returns:
            self, for chaining.
        """
        self.per_device_train_batch_size = train_batch_size
        self.per_device_eval_batch_size = eval_batch_size
        self.dataloader_drop_last = drop_last
        self.dataloader_num_workers = num_workers
        self.dataloader_pin_memory = pin_memory
        self.dataloader_persistent_workers = persistent_workers
        self.dataloader_prefetch_factor = prefetch_factor
        self.dataloader_multiprocessing_context = multiprocessing_context
        self.dataloader_in_order = in_order
        self.auto_find_batch_size = auto_find_batch_size
        self.ignore_data_skip = ignore_data_skip
        self.data_seed = sampler_seed
        return self


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


def _to_enum(name: str, enum_cls: type[Enum], value: Any) -> Any:
    try:
        return enum_cls(value)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None


def _to_debug_options(value: Any) -> list[DebugOption]:
    if value is None:
        return []
    items = value.split() if isinstance(value, str) else list(value)
    return [_to_enum("debug", DebugOption, item) for item in items]


def _parse_json_dict(name: str, text: str) -> dict[str, Any]:
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{name}: could not parse the JSON string {text!r}: {error}") from None
    return _coerce_str_values(loaded)


def _coerce_str_values(values: dict[str, Any]) -> dict[str, Any]:
    # Values typed on a command line arrive as strings: turn "true"/"false" and numbers into
    # real bools and numbers, recursively, as HF does.
    for key, value in values.items():
        if isinstance(value, dict):
            values[key] = _coerce_str_values(value)
        elif isinstance(value, str):
            if value.lower() in ("true", "false"):
                values[key] = value.lower() == "true"
            elif value.isdigit():
                values[key] = int(value)
            elif value.replace(".", "", 1).isdigit():
                values[key] = float(value)
    return values


def _load_json_file(name: str, path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise ValueError(f"{name}: no JSON file at {path!r} (pass a dict, a JSON string or an existing path)") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{name}: {path!r} is not valid JSON: {error}") from None


def _dtypes_to_str(values: dict[str, Any]) -> None:
    # torch.dtype values (e.g. inside a DeepSpeed or FSDP config) are not JSON: keep the short name.
    dtype = values.get("dtype")
    if dtype is not None and not isinstance(dtype, str):
        values["dtype"] = str(dtype).split(".")[1]
    for value in values.values():
        if isinstance(value, dict):
            _dtypes_to_str(value)


def _normalize_report_to(value: Any) -> list[str]:
    # HF 5.23 turns None into [None]; hf_lightning reads None as "none" (no loggers).
    if value is None or value == "none" or value == ["none"]:
        names: list[str] = []
    elif value == "all" or value == ["all"]:
        names = _installed_reporting_integrations()
    elif isinstance(value, str):
        names = [value]
    else:
        names = list(value)
    # HF adds "kubeflow" inside a Kubeflow TrainJob, whatever report_to says.
    if in_kubeflow_trainjob() and "kubeflow" not in names:
        names.append("kubeflow")
    return names


def in_kubeflow_trainjob() -> bool:
    """HF's ``is_kubeflow_available``: the TrainJob's progress server is set and the integration not disabled."""
    if os.getenv("DISABLE_KUBEFLOW_INTEGRATION", "FALSE").upper() == "TRUE":
        return False
    return os.getenv("KUBEFLOW_TRAINER_SERVER_URL") is not None


def _installed_reporting_integrations() -> list[str]:
    """The `report_to` names hf_lightning supports whose package is importable ("all")."""
    # One module knows which loggers exist and what they need (imported here: loggers imports Lightning).
    from hf_lightning.loggers import available_report_to

    return available_report_to()


def _normalize_accelerator_config(value: Any) -> dict[str, Any]:
    """Turn `accelerator_config` (None, dict, JSON path or HF `AcceleratorConfig`) into HF's dict form."""
    if value is None:
        given: dict[str, Any] = {}
    elif isinstance(value, dict):
        given = dict(value)
    elif isinstance(value, type):
        raise ValueError("accelerator_config: pass a dict or a constructed config object, not a class.")
    elif isinstance(value, (str, os.PathLike)):
        given = _load_json_file("accelerator_config", os.fspath(value))
    elif dataclasses.is_dataclass(value):
        # An `AcceleratorConfig` built with transformers by a migrating script.
        given = {f.name: getattr(value, f.name) for f in fields(value)}
    else:
        raise ValueError(
            f"accelerator_config: expected a dict, a JSON file path or an AcceleratorConfig, got {type(value).__name__}"
        )
    unknown = sorted(set(given) - set(_ACCELERATOR_CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"accelerator_config has unknown keys {unknown}; valid keys are {list(_ACCELERATOR_CONFIG_KEYS)}"
        )
    normalized = {**_ACCELERATOR_CONFIG_DEFAULTS, **given}
    # HF removes this key while setting up devices (True is checked, then removed, by args/validation.py).
    if not normalized.get("use_configured_state"):
        normalized.pop("use_configured_state", None)
    return normalized


def _apply_legacy_fsdp_words(value: str | list[str] | tuple[str, ...], config: dict[str, Any]) -> None:
    """Translate the deprecated `fsdp="full_shard offload"` words into `fsdp_config` keys."""
    logger.warning("Passing `fsdp` as a string or list is deprecated; use fsdp=True and fsdp_config instead.")
    words = value.split() if isinstance(value, str) else list(value)
    version = int(config.get("version", 2))
    for word in words:
        if word.lower() in _FSDP_SHARDING_WORDS:
            if version == 1:
                config.setdefault("reshard_after_forward", word)
            elif word == FSDPOption.FULL_SHARD:
                config.setdefault("reshard_after_forward", True)
            elif word == FSDPOption.SHARD_GRAD_OP:
                config.setdefault("reshard_after_forward", False)
            else:
                raise ValueError(
                    f"`fsdp={word}` is only available with FSDP1. Set `fsdp_config['version'] = 1` to "
                    "use it (FSDP1 is deprecated)."
                )
        elif word == FSDPOption.OFFLOAD:
            config.setdefault("cpu_offload", True)
        elif word == FSDPOption.AUTO_WRAP:
            continue
        else:
            raise ValueError(f"Unknown `fsdp` option: {word}")


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be an integer") from None


def _truthy(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "y", "on", "t")


def _process_group_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _tf32_available() -> bool:
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return False
    return torch.cuda.get_device_properties(torch.cuda.current_device()).major >= 8


# ----------------------------------------------------------------------------------------------
# transformers 4.x names: each handler maps the value and returns True to keep the alias set
# ----------------------------------------------------------------------------------------------



def _warn_renamed(old: str, new: str, note: str = "") -> None:
    warnings.warn(
        f"`{old}` is a transformers 4.x argument that transformers 5 removed; hf_lightning maps it to "
        f"`{new}`{note}. Use `{new}` instead.",
        FutureWarning,
        stacklevel=6,
    )


def _warn_dropped(old: str, what_happens: str) -> None:
    warnings.warn(
        f"`{old}` is a transformers 4.x argument that transformers 5 removed; {what_happens}.",
        FutureWarning,
        stacklevel=6,
    )


def _refuse_legacy(name: str, value: Any, reason: str) -> None:
    raise ValueError(f"`{name}={value!r}` is not supported by hf_lightning: {reason}")


def _map_evaluation_strategy(args: TrainingArguments, value: Any) -> bool:
    _warn_renamed("evaluation_strategy", "eval_strategy")
    old = _to_enum("evaluation_strategy", IntervalStrategy, value)
    current = _to_enum("eval_strategy", IntervalStrategy, args.eval_strategy)
    if current != IntervalStrategy.NO and current != old:
        raise ValueError(
            f"Both evaluation_strategy={old.value!r} and eval_strategy={current.value!r} were given; "
            "pass only eval_strategy."
        )
    args.eval_strategy = old
    return False


def _map_overwrite_output_dir(args: TrainingArguments, value: Any) -> bool:
    _warn_dropped(
        "overwrite_output_dir",
        "it never changed what the Trainer writes and has no effect here (it stays readable for scripts)",
    )
    return True


def _map_batch_size(kind: str) -> Callable[[TrainingArguments, Any], bool]:
    def handler(args: TrainingArguments, value: Any) -> bool:
        _warn_renamed(f"per_gpu_{kind}_batch_size", f"per_device_{kind}_batch_size")
        # In 4.x the per_gpu value took precedence over the per_device one.
        setattr(args, f"per_device_{kind}_batch_size", value)
        return False

    return handler


def _map_warmup_ratio(args: TrainingArguments, value: Any) -> bool:
    _warn_renamed("warmup_ratio", "warmup_steps", " (a warmup_steps below 1 is a ratio of the total steps)")
    if not 0 <= value <= 1:
        raise ValueError(f"warmup_ratio must lie in range [0,1], got {value}")
    if value == 1:
        raise ValueError(
            "warmup_ratio=1.0 cannot be expressed as a transformers 5 ratio (warmup_steps must be below 1 to be "
            "a ratio); pass warmup_steps=<total optimizer steps> instead."
        )
    if value > 0 and args.warmup_steps > 0:
        warnings.warn(
            f"Both warmup_ratio={value} and warmup_steps={args.warmup_steps} were given; warmup_steps wins "
            "(as in transformers 4.x).",
            UserWarning,
            stacklevel=5,
        )
    elif value > 0:
        args.warmup_steps = value
    return False


def _map_logging_dir(args: TrainingArguments, value: Any) -> bool:
    _warn_dropped(
        "logging_dir",
        "hf_lightning keeps it as the TensorBoard log directory (transformers 5 reads TENSORBOARD_LOGGING_DIR)",
    )
    return True


def _map_save_safetensors(args: TrainingArguments, value: Any) -> bool:
    if not value:
        _refuse_legacy(
            "save_safetensors",
            value,
            "weights are always saved as safetensors (as in transformers 5). Remove save_safetensors=False.",
        )
    _warn_dropped("save_safetensors", "weights are always saved as safetensors")
    return True


def _map_no_cuda(args: TrainingArguments, value: Any) -> bool:
    _warn_renamed("no_cuda", "use_cpu")
    if value:
        args.use_cpu = True
    return False


def _map_use_mps_device(args: TrainingArguments, value: Any) -> bool:
    _warn_dropped("use_mps_device", "MPS is used automatically when available, so it has no effect")
    if value and not torch.backends.mps.is_available():
        raise ValueError("use_mps_device=True but no MPS device is available on this machine; remove use_mps_device.")
    return True


def _refuse_when(
    name: str, predicate: Callable[[Any], bool], reason: str
) -> Callable[["TrainingArguments", Any], bool]:
    """Handler for a removed 4.x name: refuse values that would change behaviour, warn otherwise."""

    def handler(args: TrainingArguments, value: Any) -> bool:
        if predicate(value):
            _refuse_legacy(name, value, reason)
        _warn_dropped(name, "it has no effect")
        return False

    return handler


def _map_precision_backend(args: TrainingArguments, value: Any, name: str) -> bool:
    if value == "apex":
        _refuse_legacy(name, value, "NVIDIA apex is not supported; use fp16=True or bf16=True (native torch AMP).")
    if value not in ("auto", "cpu_amp", "amp"):
        raise ValueError(f"{name}={value!r} is not valid; choose one of ['auto', 'cpu_amp', 'apex']")
    _warn_dropped(name, "native torch mixed precision is always used")
    return True


def _map_fsdp_min_num_params(args: TrainingArguments, value: Any) -> bool:
    _warn_renamed("fsdp_min_num_params", "fsdp_config['min_num_params']")
    if value > 0:
        args.fsdp_config = _fsdp_config_dict(args)
        args.fsdp_config["min_num_params"] = value
    return False


def _map_fsdp_layer_cls(args: TrainingArguments, value: Any) -> bool:
    _warn_renamed("fsdp_transformer_layer_cls_to_wrap", "fsdp_config['transformer_layer_cls_to_wrap']")
    args.fsdp_config = _fsdp_config_dict(args)
    args.fsdp_config["transformer_layer_cls_to_wrap"] = value
    return False


def _fsdp_config_dict(args: TrainingArguments) -> dict[str, Any]:
    config = args.fsdp_config
    if config is None:
        return {}
    if isinstance(config, str):
        if config.startswith("{"):
            return _parse_json_dict("fsdp_config", config)
        return _load_json_file("fsdp_config", config)
    return dict(config)


def _map_adafactor(args: TrainingArguments, value: Any) -> bool:
    _warn_renamed("adafactor", "optim='adafactor'")
    if value:
        args.optim = OptimizerNames.ADAFACTOR
    return False


def _map_group_by_length(args: TrainingArguments, value: Any) -> bool:
    _warn_renamed("group_by_length", "train_sampling_strategy='group_by_length'")
    if value:
        if args.train_sampling_strategy not in ("random", "group_by_length"):
            raise ValueError(
                f"group_by_length=True conflicts with train_sampling_strategy={args.train_sampling_strategy!r}; "
                "pass only train_sampling_strategy."
            )
        args.train_sampling_strategy = "group_by_length"
    return False


def _map_include_inputs(args: TrainingArguments, value: Any) -> bool:
    _warn_renamed("include_inputs_for_metrics", "include_for_metrics=['inputs']")
    if value and "inputs" not in args.include_for_metrics:
        args.include_for_metrics = [*args.include_for_metrics, "inputs"]
    return False


def _map_hub_model_id(args: TrainingArguments, value: Any) -> bool:
    _warn_renamed("push_to_hub_model_id", "hub_model_id")
    organization = args.push_to_hub_organization
    args.hub_model_id = f"{organization}/{value}" if organization else value
    args.push_to_hub_organization = None
    return False


def _map_hub_organization(args: TrainingArguments, value: Any) -> bool:
    _warn_renamed("push_to_hub_organization", "hub_model_id")
    # Only reached without push_to_hub_model_id (that handler consumes the organization).
    args.hub_model_id = f"{value}/{Path(args.output_dir or 'trainer_output').name}"
    return False


def _map_hub_token(args: TrainingArguments, value: Any) -> bool:
    _warn_renamed("push_to_hub_token", "hub_token")
    args.hub_token = value
    return False


def _map_torchdynamo(args: TrainingArguments, value: Any) -> bool:
    _warn_renamed("torchdynamo", "torch_compile_backend")
    args.torch_compile_backend = value
    return False


_LEGACY_HANDLERS: dict[str, Callable[[TrainingArguments, Any], bool]] = {
    "evaluation_strategy": _map_evaluation_strategy,
    "overwrite_output_dir": _map_overwrite_output_dir,
    "per_gpu_train_batch_size": _map_batch_size("train"),
    "per_gpu_eval_batch_size": _map_batch_size("eval"),
    "warmup_ratio": _map_warmup_ratio,
    "logging_dir": _map_logging_dir,
    "save_safetensors": _map_save_safetensors,
    "no_cuda": _map_no_cuda,
    "use_mps_device": _map_use_mps_device,
    "use_ipex": _refuse_when(
        "use_ipex", bool, "Intel IPEX is not supported (removed in transformers 5); remove use_ipex."
    ),
    "jit_mode_eval": _refuse_when(
        "jit_mode_eval",
        bool,
        "TorchScript evaluation was removed in transformers 5; remove jit_mode_eval (torch_compile=True compiles "
        "the model instead).",
    ),
    "fp16_opt_level": _refuse_when(
        "fp16_opt_level",
        lambda value: value != "O1",
        "apex optimisation levels are not supported; remove fp16_opt_level and use fp16=True or bf16=True.",
    ),
    "half_precision_backend": lambda args, value: _map_precision_backend(args, value, "half_precision_backend"),
    "fp16_backend": lambda args, value: _map_precision_backend(args, value, "fp16_backend"),
    "tpu_num_cores": _refuse_when(
        "tpu_num_cores",
        lambda value: True, "TPUs are not supported; remove tpu_num_cores and train on CPU or GPU."
    ),
    "tpu_metrics_debug": _refuse_when("tpu_metrics_debug", bool, "TPUs are not supported; remove tpu_metrics_debug."),
    "past_index": _refuse_when(
        "past_index",
        lambda value: value >= 0,
        "feeding past model states back as inputs was removed in transformers 5; remove past_index.",
    ),
    "fsdp_min_num_params": _map_fsdp_min_num_params,
    "fsdp_transformer_layer_cls_to_wrap": _map_fsdp_layer_cls,
    "adafactor": _map_adafactor,
    "group_by_length": _map_group_by_length,
    "use_legacy_prediction_loop": _refuse_when(
        "use_legacy_prediction_loop",
        bool, "the legacy prediction loop was removed in transformers 5; remove use_legacy_prediction_loop."
    ),
    "include_inputs_for_metrics": _map_include_inputs,
    "include_tokens_per_second": _refuse_when(
        "include_tokens_per_second",
        bool,
        "the tokens-per-second metric was removed in transformers 5; remove include_tokens_per_second "
        "(include_num_input_tokens_seen='all' counts tokens).",
    ),
    "push_to_hub_model_id": _map_hub_model_id,
    "push_to_hub_organization": _map_hub_organization,
    "push_to_hub_token": _map_hub_token,
    "mp_parameters": _refuse_when(
        "mp_parameters", bool, "SageMaker model parallelism is not supported; remove mp_parameters."
    ),
    "torchdynamo": _map_torchdynamo,
    "ray_scope": _refuse_when(
        "ray_scope",
        lambda value: value != "last",
        "transformers 5 reads Ray Tune's best-trial scope from the RAY_SCOPE environment variable; remove "
        "ray_scope and set RAY_SCOPE instead.",
    ),
}
