"""Training arguments: HF-compatible `TrainingArguments`, its seq2seq variant and the enums they use."""

from hf_lightning.args.enums import (
    DebugOption,
    ExplicitEnum,
    FSDPOption,
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    ParallelMode,
    SaveStrategy,
    SchedulerType,
)
from hf_lightning.args.parser import HfArg, HfArgumentParser
from hf_lightning.args.seq2seq import Seq2SeqTrainingArguments
from hf_lightning.args.training_args import TrainingArguments

__all__ = [
    "DebugOption",
    "ExplicitEnum",
    "FSDPOption",
    "HfArg",
    "HfArgumentParser",
    "HubStrategy",
    "IntervalStrategy",
    "OptimizerNames",
    "ParallelMode",
    "SaveStrategy",
    "SchedulerType",
    "Seq2SeqTrainingArguments",
    "TrainingArguments",
]
