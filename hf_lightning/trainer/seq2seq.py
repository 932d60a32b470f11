"""``Seq2SeqTrainer``: the facade plus generation-based evaluation (HF 5.23's ``trainer_seq2seq.py`` rules).

With ``predict_with_generate=True``, ``evaluate()`` / ``predict()`` (and the evaluations during training) call
``model.generate`` per batch and hand the generated token ids to ``compute_metrics`` instead of logits. The
module's evaluation step already calls the trainer's ``prediction_step``, so this class only overrides that hook
and records the generation options each ``evaluate`` / ``predict`` call resolved.

HF rules reproduced here:

- options resolve as: keywords given to ``evaluate`` / ``predict`` > ``generation_max_length`` /
  ``generation_num_beams`` > the model's ``generation_config`` (``args.generation_config`` replaces it at
  construction);
- generated ids and labels are right-padded with the pad token up to the *model's* ``generation_config.max_length``
  (or ``max_new_tokens + 1``), not the length asked for in the keywords; batches longer than that keep their length
  and are joined with ``-100`` padding across batches;
- the loss is the model's own loss on the batch (or the label smoother's), without ``num_items_in_batch``;
- the model's ``generation_config`` gets generate's defaults filled in for unset fields after the first generation,
  so checkpoints saved afterwards hold the same ``generation_config.json`` as HF's.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hf_lightning._utils import unwrap_model
from hf_lightning.outputs import PredictionOutput
from hf_lightning.trainer.facade import Trainer

__all__ = ["GENERATION_CONFIG_FILE", "Seq2SeqTrainer"]

GENERATION_CONFIG_FILE = "generation_config.json"

# generate()'s built-in length when neither the call nor the model's generation config sets one.
_DEFAULT_MAX_LENGTH = 20


class Seq2SeqTrainer(Trainer):
    """HF's ``Seq2SeqTrainer``: the Lightning-backed facade with ``generate``-based evaluation.

    Takes the same arguments as :class:`~hf_lightning.trainer.facade.Trainer`, with ``args`` normally a
    ``Seq2SeqTrainingArguments``. When ``args.generation_config`` is set it replaces ``model.generation_config``
    (a copy of a ``GenerationConfig`` object, or one built with the model's own generation-config class from a
    dict, a ``generation_config.json`` file or a folder holding one).

    Raises:
        ValueError: ``generation_config`` cannot be loaded or fails the generation config's strict validation.

    Example:
        >>> trainer = Seq2SeqTrainer(model=model, args=Seq2SeqTrainingArguments("out", predict_with_generate=True),
        ...                          eval_dataset=val, data_collator=collator, compute_metrics=fn)  # doctest: +SKIP
        >>> trainer.evaluate(max_new_tokens=32, num_beams=4)                                     # doctest: +SKIP
    """

    #: HF's Seq2SeqTrainer repeats every batch loss eval_batch_size times, so a partial last batch weighs like a
    #: full one in eval_loss (its plain Trainer weighs it by its real size).
    eval_loss_full_batch_weight = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gen_kwargs: dict[str, Any] = {}
        value = getattr(self.args, "generation_config", None)
        if value is not None:
            current = getattr(self.model, "generation_config", None)
            self.model.generation_config = self.load_generation_config(
                value, config_cls=type(current) if current is not None else None
            )

    @staticmethod
    def load_generation_config(gen_config_arg: Any, config_cls: type | None = None) -> Any:
        """Resolve ``Seq2SeqTrainingArguments.generation_config`` into a generation-config object.

        Args:
            gen_config_arg: a ``GenerationConfig``-like object (copied), a dict of settings, a path to a JSON
                file, or a folder holding ``generation_config.json``.
            config_cls: the class to build from a dict or file (``transformers.GenerationConfig``; the trainer
                passes the class of ``model.generation_config``, so hf_lightning never imports transformers).

        Returns:
            The generation config, validated strictly when it supports ``validate(strict=True)``.

        Raises:
            ValueError: no file at the path, a dict/path without ``config_cls``, or a config that fails
                validation.
        """
        if hasattr(gen_config_arg, "to_dict") and not isinstance(gen_config_arg, (str, Path, Mapping)):
            config = copy.deepcopy(gen_config_arg)
        else:
            settings = _read_generation_settings(gen_config_arg)
            if config_cls is None or not hasattr(config_cls, "from_dict"):
                raise ValueError(
                    "`generation_config` given as a dict or path needs a model with a `generation_config` attribute "
                    "(a transformers GenerationConfig) to build it from. Pass a GenerationConfig object instead."
                )
            config = config_cls.from_dict(settings)
        validate = getattr(config, "validate", None)
        if callable(validate):
            # Fail now rather than at the end of training, when save_pretrained validates strictly.
            try:
                validate(strict=True)
            except ValueError as exc:
                raise ValueError(f"{exc}\n\nFix these issues to train your model.") from exc
        return config

    # ------------------------------------------------------------------ evaluate / predict
    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval", **gen_kwargs: Any) -> dict[str, float]:
        """HF's ``Seq2SeqTrainer.evaluate``: ``Trainer.evaluate`` with ``generate`` options.

        Args:
            eval_dataset: overrides ``self.eval_dataset``.
            ignore_keys: output keys left out of the predictions.
            metric_key_prefix: prefix of the metric keys.
            **gen_kwargs: ``generate`` keywords (``max_length``, ``max_new_tokens``, ``num_beams``, ...), used
                when ``predict_with_generate=True``; they take precedence over ``generation_max_length`` /
                ``generation_num_beams``.

        Returns:
            The metrics dict, as ``Trainer.evaluate``.
        """
        self._gen_kwargs = self._resolve_gen_kwargs(gen_kwargs)
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def predict(self, test_dataset: Any, ignore_keys: list[str] | None = None,
                metric_key_prefix: str = "test", **gen_kwargs: Any) -> PredictionOutput:
        """HF's ``Seq2SeqTrainer.predict``: ``Trainer.predict`` with ``generate`` options (see :meth:`evaluate`).

        With ``predict_with_generate=True`` the predictions are generated token ids, padded as the module docstring
        describes.
        """
        self._gen_kwargs = self._resolve_gen_kwargs(gen_kwargs)
        return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def _resolve_gen_kwargs(self, gen_kwargs: dict[str, Any]) -> dict[str, Any]:
        resolved = dict(gen_kwargs)
        max_length = getattr(self.args, "generation_max_length", None)
        num_beams = getattr(self.args, "generation_num_beams", None)
        # The arguments only fill what the call left unset; max_new_tokens counts as a length.
        if resolved.get("max_length") is None and resolved.get("max_new_tokens") is None and max_length is not None:
            resolved["max_length"] = max_length
        if resolved.get("num_beams") is None and num_beams is not None:
            resolved["num_beams"] = num_beams
        return resolved

    # ------------------------------------------------------------------ the evaluation step
    def prediction_step(self, model: nn.Module, inputs: dict, prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None, **gen_kwargs: Any):
        """HF's ``Seq2SeqTrainer.prediction_step``: ``(loss, generated_ids, labels)`` for one batch.

        Falls back to ``Trainer.prediction_step`` (logits) unless ``predict_with_generate`` is on and predictions
        are wanted. ``gen_kwargs`` given here replace those the current ``evaluate`` / ``predict`` call resolved.
        """
        if not getattr(self.args, "predict_with_generate", False) or prediction_loss_only:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)

        has_labels = inputs.get("labels") is not None
        inputs = self._prepare_inputs(inputs)
        if not gen_kwargs:
            gen_kwargs = dict(self._gen_kwargs)
        for key in ("num_beams", "max_length"):
            if key in gen_kwargs and gen_kwargs[key] is None:
                gen_kwargs.pop(key)
        generator = unwrap_model(self.model)
        if not callable(getattr(generator, "generate", None)):
            raise ValueError(
                f"predict_with_generate=True needs a model with a `generate` method; {type(generator).__name__} has "
                "none. Set predict_with_generate=False to evaluate on logits."
            )
        gen_kwargs.setdefault("synced_gpus", _parameters_are_sharded(generator))

        generation_inputs = dict(inputs)
        # decoder_input_ids the collator built from the labels would make generate continue the reference.
        labels = inputs.get("labels")
        decoder_ids = inputs.get("decoder_input_ids")
        if has_labels and decoder_ids is not None and labels.shape == decoder_ids.shape:
            generation_inputs = {k: v for k, v in inputs.items()
                                 if k not in ("decoder_input_ids", "decoder_attention_mask")}
        with _full_parameters(generator):
            generated = generator.generate(**generation_inputs, **gen_kwargs)

        config = generator.generation_config
        if getattr(config, "_from_model_config", False):
            # HF clears it after the first generation so generate stops re-deriving the config from model.config.
            config._from_model_config = False
        _fill_generation_defaults(config)
        target = _padded_length(config, generated.shape[-1])
        if target is not None:
            generated = self._pad_tensors_to_max_len(generated, target)

        loss = None
        if has_labels:
            with torch.no_grad():
                outputs = model(**inputs)
            smoother = self.lightning_module.label_smoother
            if smoother is not None:
                loss = smoother(outputs, inputs["labels"]).detach().mean()
            else:
                loss = (outputs["loss"] if isinstance(outputs, Mapping) else outputs[0]).detach().mean()

        if getattr(self.args, "prediction_loss_only", False):
            return loss, None, None
        if has_labels:
            target = _padded_length(config, labels.shape[-1])
            if target is not None:
                labels = self._pad_tensors_to_max_len(labels, target)
        else:
            labels = None
        return loss, generated, labels

    def _pad_tensors_to_max_len(self, tensor: torch.Tensor, max_length: int) -> torch.Tensor:
        """Right-pad ``tensor`` (batch, length) to ``max_length`` with the pad token (HF's helper)."""
        tokenizer = self.processing_class
        if tokenizer is not None and hasattr(tokenizer, "pad_token_id"):
            # A tokenizer without a pad token pads with its end-of-sequence token, as HF.
            pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        else:
            pad_id = getattr(getattr(self.model, "config", None), "pad_token_id", None)
            if pad_id is None:
                raise ValueError(
                    "Pad_token_id must be set in the configuration of the model, in order to pad tensors: set "
                    "`model.config.pad_token_id` or pass a tokenizer with a pad token as `processing_class`."
                )
        padded = tensor.new_full((tensor.shape[0], max_length), pad_id)
        padded[:, : tensor.shape[-1]] = tensor
        return padded


def _read_generation_settings(value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return dict(value)
    path = Path(value)
    if path.is_dir():
        path = path / GENERATION_CONFIG_FILE
    if not path.is_file():
        raise ValueError(
            f"`generation_config`: no generation config file at {str(value)!r}. hf_lightning does not download "
            f"from the Hub: pass a local `{GENERATION_CONFIG_FILE}`, a folder holding one, a dict or a "
            "GenerationConfig object."
        )
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _fill_generation_defaults(config: Any) -> None:
    """Give the model's generation config generate's defaults for its unset fields, as HF's step does."""
    defaults_of = getattr(config, "_get_default_generation_params", None)
    update = getattr(config, "update", None)
    if callable(defaults_of) and callable(update):
        update(**defaults_of(), defaults_only=True)
    elif getattr(config, "max_length", None) is None:
        config.max_length = _DEFAULT_MAX_LENGTH


def _padded_length(config: Any, length: int) -> int | None:
    """The length HF pads a generated / label batch of ``length`` to, or ``None`` to keep it."""
    max_length = getattr(config, "max_length", None)
    max_new_tokens = getattr(config, "max_new_tokens", None)
    if max_length is not None and length < max_length:
        return max_length
    if max_new_tokens is not None and length < max_new_tokens + 1:
        return max_new_tokens + 1
    return None


def _parameters_are_sharded(model: nn.Module) -> bool:
    """Whether every process must take part in each generate step (ZeRO-3 or FSDP shards the weights)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    fsdp2 = getattr(torch.distributed.fsdp, "FSDPModule", ())
    for module in model.modules():
        if isinstance(module, FullyShardedDataParallel) or (fsdp2 and isinstance(module, fsdp2)):
            return True
    # DeepSpeed ZeRO-3 tags each partitioned parameter with a ds_id.
    return any(hasattr(p, "ds_id") for p in model.parameters())


def _full_parameters(model: nn.Module):
    """FSDP(1) must gather the full weights around generate when the model itself is the FSDP wrapper."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if torch.distributed.is_available() and isinstance(model, FullyShardedDataParallel):
        return FullyShardedDataParallel.summon_full_params(model)
    return contextlib.nullcontext()

