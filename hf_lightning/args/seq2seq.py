"""`Seq2SeqTrainingArguments`: `TrainingArguments` plus HF's generation options."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_lightning.args.training_args import TrainingArguments

__all__ = ["Seq2SeqTrainingArguments"]


@dataclass
class Seq2SeqTrainingArguments(TrainingArguments):
    """`TrainingArguments` with the five generation fields of HF 5.23's `Seq2SeqTrainingArguments`.

    `generation_config` may be a model folder or file path (str / `Path`), a dict of
    generation settings, or a `GenerationConfig`-like object (anything with a
    `to_dict()` method); it is stored as given and read by the seq2seq trainer.
    """

    sortish_sampler: bool = field(
        default=False, metadata={"help": "Sample training batches of roughly sorted lengths (sortish sampler)."}
    )
    predict_with_generate: bool = field(
        default=False, metadata={"help": "Evaluate and predict with generate() so generative metrics can be computed."}
    )
    generation_max_length: int | None = field(
        default=None,
        metadata={"help": "max_length for generate() in evaluation (default: the model's generation config)."},
    )
    generation_num_beams: int | None = field(
        default=None,
        metadata={"help": "num_beams for generate() in evaluation (default: the model's generation config)."},
    )
    # HF types the third member as its GenerationConfig; any object with `to_dict()` is accepted here.
    generation_config: str | Path | dict | None = field(
        default=None,
        metadata={"help": "Generation settings for evaluation: a path to a GenerationConfig, a dict or an object."},
    )

    def to_dict(self) -> dict[str, Any]:
        """`TrainingArguments.to_dict()` with `generation_config` made JSON-friendly.

        A config object becomes its `to_dict()`; a `Path` becomes its string (HF leaves
        the `Path`, which `to_json_string()` then cannot encode).
        """
        result = super().to_dict()
        value = self.generation_config
        if value is not None and not isinstance(value, (str, dict)):
            if isinstance(value, Path):
                result["generation_config"] = str(value)
            elif callable(getattr(value, "to_dict", None)):
                result["generation_config"] = value.to_dict()
        return result
