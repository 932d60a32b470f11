"""The HF-style facade, ``build_lightning_trainer`` and HF's output types."""

from typing import TYPE_CHECKING

from hf_lightning._lazy import lazy_exports

if TYPE_CHECKING:
    from hf_lightning.outputs import EvalLoopOutput, EvalPrediction, PredictionOutput, TrainOutput
    from hf_lightning.trainer.build import build_lightning_trainer
    from hf_lightning.trainer.facade import Trainer
    from hf_lightning.trainer.seq2seq import Seq2SeqTrainer

# Lazy, so importing one module of this package (strategies, hp_search) does not load the facade.
__getattr__, __dir__ = lazy_exports(__name__, {
    "hf_lightning.outputs": ("EvalLoopOutput", "EvalPrediction", "PredictionOutput", "TrainOutput"),
    "hf_lightning.trainer.build": ("build_lightning_trainer",),
    "hf_lightning.trainer.facade": ("Trainer",),
    "hf_lightning.trainer.seq2seq": ("Seq2SeqTrainer",),
})

__all__ = [
    "EvalLoopOutput",
    "EvalPrediction",
    "PredictionOutput",
    "Seq2SeqTrainer",
    "TrainOutput",
    "Trainer",
    "build_lightning_trainer",
]
