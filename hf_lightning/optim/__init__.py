"""Optimizers, weight-decay grouping and learning-rate schedules with HF Trainer's rules (transformers 5.23)."""

from hf_lightning.optim.adafactor import Adafactor, AdafactorSchedule, get_adafactor_schedule
from hf_lightning.optim.greedy import GreedyLR
from hf_lightning.optim.grouping import build_param_groups, get_decay_parameter_names
from hf_lightning.optim.optimizers import (
    OPTIMIZER_REGISTRY,
    UNSUPPORTED_OPTIMIZERS,
    create_optimizer,
    get_optimizer_cls_and_kwargs,
    parse_optim_args,
)
from hf_lightning.optim.schedulers import (
    SCHEDULER_REGISTRY,
    create_scheduler,
    get_scheduler,
    current_learning_rate,
    fit_optimizer_and_scheduler,
    is_metric_driven,
    resolve_warmup_steps,
)
from hf_lightning.optim.schedules import (
    get_constant_schedule,
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_cosine_with_hard_restarts_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup_lr_rate,
    get_greedy_schedule,
    get_inverse_sqrt_schedule,
    get_linear_schedule_with_warmup,
    get_polynomial_decay_schedule_with_warmup,
    get_reduce_on_plateau_schedule,
    get_wsd_schedule,
)

__all__ = [
    "OPTIMIZER_REGISTRY",
    "SCHEDULER_REGISTRY",
    "UNSUPPORTED_OPTIMIZERS",
    "Adafactor",
    "AdafactorSchedule",
    "GreedyLR",
    "build_param_groups",
    "create_optimizer",
    "create_scheduler",
    "get_adafactor_schedule",
    "get_constant_schedule",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup_lr_rate",
    "get_decay_parameter_names",
    "get_greedy_schedule",
    "get_inverse_sqrt_schedule",
    "get_linear_schedule_with_warmup",
    "get_optimizer_cls_and_kwargs",
    "get_polynomial_decay_schedule_with_warmup",
    "get_reduce_on_plateau_schedule",
    "get_scheduler",
    "get_wsd_schedule",
    "current_learning_rate",
    "fit_optimizer_and_scheduler",
    "is_metric_driven",
    "parse_optim_args",
    "resolve_warmup_steps",
]
