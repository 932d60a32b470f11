"""``Seq2SeqTrainer``: the facade with ``Seq2SeqTrainingArguments``.

Generation-based evaluation (``predict_with_generate``) belongs to the evaluation work; until it lands,
``predict_with_generate=True`` is refused with a clear error instead of silently computing loss-only metrics.
"""

from __future__ import annotations

from typing import Any

from hf_lightning.trainer.facade import Trainer


class Seq2SeqTrainer(Trainer):
    """HF's ``Seq2SeqTrainer`` interface over the same Lightning-backed facade."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if getattr(self.args, "predict_with_generate", False):
            raise ValueError(
                "predict_with_generate=True is not supported by hf_lightning yet: generation-based evaluation is "
                "not implemented. Set predict_with_generate=False (loss-based evaluation)."
            )
