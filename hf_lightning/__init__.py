"""hf_lightning: the Hugging Face ``transformers`` Trainer's semantics on PyTorch Lightning.

Change ``from transformers import Trainer, TrainingArguments`` to ``from hf_lightning import Trainer,
TrainingArguments`` and keep HF's ``checkpoint-N`` folders, ``trainer_state.json``, ``log_history``, metrics and
callbacks, with Lightning's loop, strategies, precision plugins and loggers underneath. Lightning users get the
same behaviour from ``build_lightning_trainer(args).fit(HFLightningModule(...), datamodule=HFDataModule(...))``.
"""

from typing import TYPE_CHECKING

from hf_lightning._lazy import lazy_exports

if TYPE_CHECKING:
    from hf_lightning.args.enums import IntervalStrategy, SaveStrategy, SchedulerType
    from hf_lightning.args.parser import HfArgumentParser
    from hf_lightning.args.seq2seq import Seq2SeqTrainingArguments
    from hf_lightning.args.training_args import TrainingArguments
    from hf_lightning.callbacks.hf_api import (
        CallbackHandler,
        DefaultFlowCallback,
        EarlyStoppingCallback,
        PrinterCallback,
        ProgressCallback,
        TrainerCallback,
    )
    from hf_lightning.checkpointing.hf_functions import rotate_checkpoints, sort_checkpoints
    from hf_lightning.checkpointing.paths import get_last_checkpoint
    from hf_lightning.data.collators import (
        DataCollatorForLanguageModeling,
        DataCollatorForMultipleChoice,
        DataCollatorForSeq2Seq,
        DataCollatorForTokenClassification,
        DataCollatorWithPadding,
        DefaultDataCollator,
        default_data_collator,
    )
    from hf_lightning.data.columns import RemoveColumnsCollator
    from hf_lightning.data.datamodule import HFDataModule
    from hf_lightning.data.label_smoothing import LabelSmoother
    from hf_lightning.data.samplers import LengthGroupedSampler
    from hf_lightning.module import HFLightningModule
    from hf_lightning.optim.greedy import GreedyLR
    from hf_lightning.optim.schedulers import get_scheduler
    from hf_lightning.outputs import EvalLoopOutput, EvalPrediction, PredictionOutput, TrainOutput
    from hf_lightning.seed import enable_full_determinism, set_seed
    from hf_lightning.state import ExportableState, TrainerControl, TrainerState
    from hf_lightning.trainer.build import build_lightning_trainer
    from hf_lightning.trainer.facade import Trainer
    from hf_lightning.trainer.seq2seq import Seq2SeqTrainer

__version__ = "0.1.0"

# Each public name is imported from its module on first use, so `import hf_lightning.flow` (or any pure module)
# loads neither Lightning nor the facade.
__getattr__, __dir__ = lazy_exports(__name__, {
    "hf_lightning.args.enums": ("IntervalStrategy", "SaveStrategy", "SchedulerType"),
    "hf_lightning.args.parser": ("HfArgumentParser",),
    "hf_lightning.args.seq2seq": ("Seq2SeqTrainingArguments",),
    "hf_lightning.args.training_args": ("TrainingArguments",),
    "hf_lightning.callbacks.hf_api": (
        "CallbackHandler", "DefaultFlowCallback", "EarlyStoppingCallback", "PrinterCallback", "ProgressCallback",
        "TrainerCallback",
    ),
    "hf_lightning.checkpointing.hf_functions": ("rotate_checkpoints", "sort_checkpoints"),
    "hf_lightning.checkpointing.paths": ("get_last_checkpoint",),
    "hf_lightning.data.collators": (
        "DataCollatorForLanguageModeling", "DataCollatorForMultipleChoice", "DataCollatorForSeq2Seq",
        "DataCollatorForTokenClassification", "DataCollatorWithPadding", "DefaultDataCollator",
        "default_data_collator",
    ),
    "hf_lightning.data.columns": ("RemoveColumnsCollator",),
    "hf_lightning.data.datamodule": ("HFDataModule",),
    "hf_lightning.data.label_smoothing": ("LabelSmoother",),
    "hf_lightning.data.samplers": ("LengthGroupedSampler",),
    "hf_lightning.module": ("HFLightningModule",),
    "hf_lightning.optim.greedy": ("GreedyLR",),
    "hf_lightning.optim.schedulers": ("get_scheduler",),
    "hf_lightning.outputs": ("EvalLoopOutput", "EvalPrediction", "PredictionOutput", "TrainOutput"),
    "hf_lightning.seed": ("enable_full_determinism", "set_seed"),
    "hf_lightning.state": ("ExportableState", "TrainerControl", "TrainerState"),
    "hf_lightning.trainer.build": ("build_lightning_trainer",),
    "hf_lightning.trainer.facade": ("Trainer",),
    "hf_lightning.trainer.seq2seq": ("Seq2SeqTrainer",),
})

__all__ = [
    "CallbackHandler",
    "DataCollatorForLanguageModeling",
    "DataCollatorForMultipleChoice",
    "DataCollatorForSeq2Seq",
    "DataCollatorForTokenClassification",
    "DataCollatorWithPadding",
    "DefaultDataCollator",
    "DefaultFlowCallback",
    "EarlyStoppingCallback",
    "EvalLoopOutput",
    "EvalPrediction",
    "ExportableState",
    "GreedyLR",
    "HFDataModule",
    "HFLightningModule",
    "HfArgumentParser",
    "IntervalStrategy",
    "LabelSmoother",
    "LengthGroupedSampler",
    "PredictionOutput",
    "PrinterCallback",
    "ProgressCallback",
    "RemoveColumnsCollator",
    "SaveStrategy",
    "SchedulerType",
    "Seq2SeqTrainer",
    "Seq2SeqTrainingArguments",
    "TrainOutput",
    "Trainer",
    "TrainerCallback",
    "TrainerControl",
    "TrainerState",
    "TrainingArguments",
    "build_lightning_trainer",
    "default_data_collator",
    "enable_full_determinism",
    "get_last_checkpoint",
    "get_scheduler",
    "rotate_checkpoints",
    "set_seed",
    "sort_checkpoints",
]
