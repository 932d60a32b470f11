"""hf_lightning: the Hugging Face ``transformers`` Trainer's semantics on PyTorch Lightning.

Change ``from transformers import Trainer, TrainingArguments`` to ``from hf_lightning import Trainer,
TrainingArguments`` and keep HF's ``checkpoint-N`` folders, ``trainer_state.json``, ``log_history``, metrics and
callbacks, with Lightning's loop, strategies, precision plugins and loggers underneath. Lightning users get the
same behaviour from ``build_lightning_trainer(args).fit(HFLightningModule(...), datamodule=HFDataModule(...))``.
"""

from hf_lightning.args import (
    HfArgumentParser,
    IntervalStrategy,
    SaveStrategy,
    SchedulerType,
    Seq2SeqTrainingArguments,
    TrainingArguments,
)
from hf_lightning.callbacks.hf_api import (
    CallbackHandler,
    DefaultFlowCallback,
    EarlyStoppingCallback,
    PrinterCallback,
    ProgressCallback,
    TrainerCallback,
)
from hf_lightning.checkpointing.paths import get_last_checkpoint
from hf_lightning.data.collators import (
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
    default_data_collator,
)
from hf_lightning.data.datamodule import HFDataModule
from hf_lightning.data.label_smoothing import LabelSmoother
from hf_lightning.module import HFLightningModule
from hf_lightning.optim import get_scheduler
from hf_lightning.seed import enable_full_determinism, set_seed
from hf_lightning.state import TrainerControl, TrainerState
from hf_lightning.trainer import (
    EvalLoopOutput,
    EvalPrediction,
    PredictionOutput,
    Seq2SeqTrainer,
    TrainOutput,
    Trainer,
    build_lightning_trainer,
)

__version__ = "0.1.0"

__all__ = [
    "CallbackHandler",
    "DataCollatorForLanguageModeling",
    "DataCollatorForSeq2Seq",
    "DataCollatorForTokenClassification",
    "DataCollatorWithPadding",
    "DefaultFlowCallback",
    "EarlyStoppingCallback",
    "EvalLoopOutput",
    "EvalPrediction",
    "HFDataModule",
    "HFLightningModule",
    "HfArgumentParser",
    "IntervalStrategy",
    "LabelSmoother",
    "PredictionOutput",
    "PrinterCallback",
    "ProgressCallback",
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
    "set_seed",
]
