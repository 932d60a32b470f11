"""The HF-style facade, ``build_lightning_trainer`` and HF's output types."""

from hf_lightning.trainer.build import build_lightning_trainer
from hf_lightning.trainer.facade import Trainer
from hf_lightning.outputs import EvalLoopOutput, EvalPrediction, PredictionOutput, TrainOutput
from hf_lightning.trainer.seq2seq import Seq2SeqTrainer

__all__ = [
    "EvalLoopOutput",
    "EvalPrediction",
    "PredictionOutput",
    "Seq2SeqTrainer",
    "TrainOutput",
    "Trainer",
    "build_lightning_trainer",
]
