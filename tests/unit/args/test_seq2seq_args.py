"""`Seq2SeqTrainingArguments` against `transformers.Seq2SeqTrainingArguments` 5.23."""

import dataclasses
import inspect
import json
import warnings
from pathlib import Path

import pytest
import transformers
from transformers import GenerationConfig

from hf_lightning.args import Seq2SeqTrainingArguments, TrainingArguments


def _both(**kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.Seq2SeqTrainingArguments(**kwargs), Seq2SeqTrainingArguments(**kwargs)


def test_fields_defaults_and_positional_order_match_hf():
    theirs = {f.name: f for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments)}
    ours = {f.name: f for f in dataclasses.fields(Seq2SeqTrainingArguments)}
    for name in ("sortish_sampler", "predict_with_generate", "generation_max_length", "generation_num_beams",
                 "generation_config"):
        assert ours[name].default == theirs[name].default
    hf_params = list(inspect.signature(transformers.Seq2SeqTrainingArguments).parameters)
    assert list(inspect.signature(Seq2SeqTrainingArguments).parameters)[: len(hf_params)] == hf_params
    assert issubclass(Seq2SeqTrainingArguments, TrainingArguments)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"predict_with_generate": True, "generation_max_length": 64, "generation_num_beams": 4},
        {"sortish_sampler": True, "generation_config": "path/to/model"},
        {"generation_config": {"max_new_tokens": 8, "do_sample": False}},
    ],
    ids=repr,
)
def test_serialization_matches_hf(kwargs):
    hf, ours = _both(report_to="none", **kwargs)
    assert ours.to_dict() == hf.to_dict()
    assert ours.to_json_string() == hf.to_json_string()
    assert ours.to_sanitized_dict() == hf.to_sanitized_dict()


def test_generation_config_object_becomes_its_dict():
    config = GenerationConfig(max_length=12, num_beams=2)
    hf, ours = _both(report_to="none", generation_config=config)
    assert ours.generation_config is config
    assert ours.to_dict() == hf.to_dict()
    json.loads(ours.to_json_string())


def test_generation_config_path_is_serialized_as_text():
    # Documented difference: HF keeps the Path object, which its to_json_string() cannot encode.
    args = Seq2SeqTrainingArguments(generation_config=Path("gen/config"))
    assert args.to_dict()["generation_config"] == "gen/config"
    assert json.loads(args.to_json_string())["generation_config"] == "gen/config"


def test_inherits_derivations_and_4x_names():
    with pytest.warns(FutureWarning):
        args = Seq2SeqTrainingArguments(evaluation_strategy="steps", logging_steps=5, predict_with_generate=True)
    assert (args.eval_strategy, args.eval_steps, args.do_eval) == ("steps", 5, True)
