"""Our HfArgumentParser with our TrainingArguments against transformers' parser with transformers' TrainingArguments."""

import json
import warnings
from dataclasses import dataclass, field
from typing import Optional

import pytest

from hf_lightning.args import Seq2SeqTrainingArguments, TrainingArguments
from hf_lightning.args.parser import HfArgumentParser


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "Path to pretrained model or model identifier."})
    cache_dir: Optional[str] = None
    use_fast_tokenizer: bool = True


def _hf_classes(seq2seq=False):
    import transformers

    training_cls = transformers.Seq2SeqTrainingArguments if seq2seq else transformers.TrainingArguments
    return transformers.HfArgumentParser, training_cls


def _shared_values(ours, theirs):
    """The serialised values of the fields both TrainingArguments have (ours also accepts 4.x names)."""
    ours_dict, theirs_dict = ours.to_dict(), theirs.to_dict()
    assert set(theirs_dict) <= set(ours_dict), "every HF field must exist in ours"
    return {k: ours_dict[k] for k in theirs_dict}, theirs_dict


COMMAND_LINES = [
    "--model_name_or_path m --output_dir out",
    "--model_name_or_path m --output_dir out --do_train --do_eval --eval_strategy steps --eval_steps 0.5 "
    "--learning_rate 3e-4 --per_device_train_batch_size 4 --num_train_epochs 2 --lr_scheduler_type cosine "
    "--optim adamw_torch --report_to none --label_names labels start_positions --seed 7",
    "--model-name-or-path m --output-dir out --no_remove_unused_columns --no-use-fast-tokenizer --bf16 false "
    "--include_num_input_tokens_seen --use_cpu --dataloader_drop_last true",
    "--model_name_or_path m --output_dir out --save_strategy epoch --eval_strategy epoch --save_total_limit 2 "
    "--load_best_model_at_end --metric_for_best_model loss --greater_is_better false --warmup_steps 0.1 "
    "--gradient_accumulation_steps 4 --max_steps 10 --logging_steps 5 --lr_scheduler_kwargs {}",
]


@pytest.mark.parametrize("argv", COMMAND_LINES)
def test_command_line_gives_the_same_training_arguments(argv):
    hf_parser_cls, hf_training_cls = _hf_classes()
    ours = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses(
        argv.split(), look_for_args_file=False
    )
    theirs = hf_parser_cls((ModelArguments, hf_training_cls)).parse_args_into_dataclasses(
        argv.split(), look_for_args_file=False
    )
    assert ours[0] == theirs[0]
    assert isinstance(ours[1], TrainingArguments)
    ours_values, theirs_values = _shared_values(ours[1], theirs[1])
    assert ours_values == theirs_values


def test_seq2seq_command_line_gives_the_same_arguments():
    hf_parser_cls, hf_training_cls = _hf_classes(seq2seq=True)
    argv = "--output_dir o --predict_with_generate --generation_max_length 64 --generation_num_beams 2".split()
    (ours,) = HfArgumentParser(Seq2SeqTrainingArguments).parse_args_into_dataclasses(argv, look_for_args_file=False)
    (theirs,) = hf_parser_cls(hf_training_cls).parse_args_into_dataclasses(argv, look_for_args_file=False)
    ours_values, theirs_values = _shared_values(ours, theirs)
    assert ours_values == theirs_values
    assert ours.predict_with_generate is True


CONFIG = {
    "model_name_or_path": "m",
    "output_dir": "out",
    "eval_strategy": "steps",
    "eval_steps": 10,
    "save_steps": 20,
    "learning_rate": 1e-4,
    "report_to": ["tensorboard"],
    "remove_unused_columns": False,
    "lr_scheduler_type": "constant",
}


@pytest.mark.parametrize("method", ["parse_dict", "parse_json_file", "parse_yaml_file"])
def test_dict_json_yaml_give_the_same_training_arguments(method, tmp_path):
    hf_parser_cls, hf_training_cls = _hf_classes()
    source = CONFIG
    if method != "parse_dict":
        source = tmp_path / "args.cfg"
        source.write_text(json.dumps(CONFIG), encoding="utf-8")  # JSON is also valid YAML
    ours = getattr(HfArgumentParser((ModelArguments, TrainingArguments)), method)(source)
    theirs = getattr(hf_parser_cls((ModelArguments, hf_training_cls)), method)(source)
    assert ours[0] == theirs[0]
    ours_values, theirs_values = _shared_values(ours[1], theirs[1])
    assert ours_values == theirs_values


def test_help_exits_zero_and_lists_training_options(capsys):
    parser = HfArgumentParser((ModelArguments, TrainingArguments), prog="train.py")
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args_into_dataclasses(["--help"], look_for_args_file=False)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--eval_strategy {no,steps,epoch}, --eval-strategy {no,steps,epoch}" in out
    assert "--no_remove_unused_columns, --no-remove-unused-columns" in out


def test_unknown_training_option_is_reported():
    parser = HfArgumentParser((ModelArguments, TrainingArguments))
    argv = ["--model_name_or_path", "m", "--output_dir", "o", "--not_an_option", "1"]
    with pytest.raises(
        ValueError, match=r"Some specified arguments are not used by the HfArgumentParser: \['--not_an_option', '1'\]"
    ):
        parser.parse_args_into_dataclasses(argv, look_for_args_file=False)


def test_4x_option_names_reach_our_training_arguments():
    hf_parser_cls, hf_training_cls = _hf_classes()
    with warnings.catch_warnings():
        # The deprecation notices belong to TrainingArguments' own tests; here only the parsed values count.
        warnings.simplefilter("ignore")
        (ours,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
            "--output_dir o --evaluation_strategy steps --eval_steps 5".split(), look_for_args_file=False
        )
    (theirs,) = hf_parser_cls(hf_training_cls).parse_args_into_dataclasses(
        "--output_dir o --eval_strategy steps --eval_steps 5".split(), look_for_args_file=False
    )
    assert (ours.eval_strategy.value, ours.eval_steps) == (theirs.eval_strategy.value, theirs.eval_steps)
