"""HfArgumentParser against transformers' own: the same dataclasses and inputs must parse to the same values."""

import argparse
import dataclasses
import json
import re
import sys
from dataclasses import dataclass, field
from enum import Enum
from typing import List, Literal, Optional, Union

import pytest

from hf_lightning.args.parser import HfArg, HfArgumentParser, string_to_bool

# ---------------------------------------------------------------------------------------------------------------
# Dataclasses shaped like the ones in HF's example scripts (run_glue.py, run_clm.py) and a TrainingArguments-like
# one with every kind of field the parser treats specially.
# ---------------------------------------------------------------------------------------------------------------

GLUE_TASKS = ["cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb", "wnli"]


class IntervalStrategy(str, Enum):
    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"


class SchedulerType(str, Enum):
    LINEAR = "linear"
    COSINE = "cosine"
    CONSTANT = "constant"


class DebugOption(str, Enum):
    UNDERFLOW_OVERFLOW = "underflow_overflow"
    TPU_METRICS_DEBUG = "tpu_metrics_debug"


class Precision(Enum):
    FP32 = 32
    BF16 = "bf16"


@dataclass
class GlueModelArguments:
    model_name_or_path: str = field(metadata={"help": "Path to pretrained model or model identifier."})
    config_name: Optional[str] = field(default=None, metadata={"help": "Pretrained config name or path."})
    tokenizer_name: Optional[str] = None
    cache_dir: Optional[str] = None
    use_fast_tokenizer: bool = field(default=True, metadata={"help": "Whether to use a fast tokenizer."})
    model_revision: str = "main"
    token: str = None
    trust_remote_code: bool = False
    ignore_mismatched_sizes: bool = False


@dataclass
class GlueDataArguments:
    task_name: Optional[str] = field(default=None, metadata={"help": "The GLUE task.", "choices": GLUE_TASKS})
    dataset_name: Optional[str] = None
    max_seq_length: int = 128
    overwrite_cache: bool = False
    pad_to_max_length: bool = True
    max_train_samples: Optional[int] = None
    train_file: Optional[str] = None
    validation_file: Optional[str] = None


@dataclass
class ClmModelArguments:
    model_name_or_path: Optional[str] = None
    model_type: Optional[str] = field(default=None, metadata={"choices": ["gpt2", "llama", "bert"]})
    config_overrides: Optional[str] = None
    torch_dtype: Optional[str] = field(default=None, metadata={"choices": ["auto", "bfloat16", "float16", "float32"]})
    low_cpu_mem_usage: bool = False


@dataclass
class ClmDataArguments:
    dataset_name: Optional[str] = None
    dataset_config_name: Optional[str] = None
    block_size: Optional[int] = None
    streaming: bool = False
    validation_split_percentage: Optional[int] = 5
    preprocessing_num_workers: Optional[int] = None
    keep_linebreaks: bool = True


@dataclass
class TrainLikeArguments:
    output_dir: Optional[str] = None
    do_train: bool = False
    do_eval: bool = False
    eval_strategy: Union[IntervalStrategy, str] = "no"
    lr_scheduler_type: SchedulerType | str = "linear"
    learning_rate: float = 5e-5
    num_train_epochs: float = 3.0
    max_steps: int = -1
    warmup_steps: float = 0
    per_device_train_batch_size: int = 8
    logging_steps: float = field(default=500, metadata={"aliases": ["--log_every", "-L"], "help": "Log every N."})
    report_to: None | str | list[str] = "none"
    label_names: Optional[List[str]] = None
    remove_unused_columns: bool = True
    greater_is_better: Optional[bool] = None
    load_best_model_at_end: Optional[bool] = False
    skip_memory_metrics: Optional[bool] = True
    include_num_input_tokens_seen: str | bool = "no"
    debug: str | list[DebugOption] = ""
    optim: Literal["adamw_torch", "sgd", "adafactor"] = "adamw_torch"
    precision: Precision = Precision.FP32
    seeds: list[int] = field(default_factory=lambda: [42])
    lr_scheduler_kwargs: dict | str | None = None
    train_batch_size: int = field(default=0, init=False)

    def __post_init__(self):
        # What HF's TrainingArguments does with the raw values the parser hands over.
        self.eval_strategy = IntervalStrategy(self.eval_strategy)
        self.lr_scheduler_type = SchedulerType(self.lr_scheduler_type)
        if isinstance(self.debug, str):
            self.debug = [DebugOption(s) for s in self.debug.split()]
        elif self.debug is None:
            self.debug = []
        self.train_batch_size = self.per_device_train_batch_size


@dataclass
class GroupedArguments:
    _argument_group_name = "grouped options"
    alpha: int = 1
    beta_value: str = field(default="b", metadata={"aliases": "--bv"})


GLUE = (GlueModelArguments, GlueDataArguments, TrainLikeArguments)
CLM = (ClmModelArguments, ClmDataArguments, TrainLikeArguments)


def _hf_parser(dataclass_types, **kwargs):
    from transformers import HfArgumentParser as HFParser

    return HFParser(dataclass_types, **kwargs)


def _typed(value):
    """A structure that compares equal only when values *and* their types agree (3 != 3.0, enum by value)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, {f.name: _typed(getattr(value, f.name)) for f in dataclasses.fields(value)})
    if isinstance(value, argparse.Namespace):
        return ("Namespace", {k: _typed(v) for k, v in vars(value).items()})
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_typed(v) for v in value])
    if isinstance(value, Enum):
        return ("enum", type(value).__name__, value.value)
    return (type(value).__name__, value)


def _parse_both(dataclass_types, method, *args, **kwargs):
    ours = getattr(HfArgumentParser(dataclass_types), method)(*args, **kwargs)
    theirs = getattr(_hf_parser(dataclass_types), method)(*args, **kwargs)
    return ours, theirs


# ---------------------------------------------------------------------------------------------------------------
# Command lines
# ---------------------------------------------------------------------------------------------------------------

COMMAND_LINES = [
    pytest.param(GLUE, [], id="glue-defaults-missing-required"),
    pytest.param(
        GLUE,
        "--model_name_or_path bert-base-cased --task_name mrpc --output_dir out --do_train --do_eval "
        "--max_seq_length 64 --per_device_train_batch_size 4 --learning_rate 2e-5 --num_train_epochs 3",
        id="glue-readme",
    ),
    pytest.param(
        GLUE,
        "--model-name-or-path bert --no_use_fast_tokenizer --no-pad-to-max-length --remove_unused_columns false",
        id="hyphen-alias-and-negations",
    ),
    pytest.param(
        GLUE,
        "--model_name_or_path m --do_train TRUE --do_eval 0 --trust_remote_code y --greater_is_better no "
        "--ignore-mismatched-sizes Yes --load_best_model_at_end f",
        id="bool-words",
    ),
    pytest.param(
        GLUE,
        "--model_name_or_path m --eval_strategy steps --lr_scheduler_type cosine --optim sgd --precision 32 "
        "--debug underflow_overflow tpu_metrics_debug",
        id="enums-literal-enum-list",
    ),
    pytest.param(
        GLUE,
        "--model_name_or_path m --precision bf16 --eval-strategy epoch",
        id="non-str-enum-and-alias",
    ),
    pytest.param(
        GLUE,
        "--model_name_or_path m --label_names labels start_positions --seeds 1 2 3 --report_to tensorboard",
        id="lists",
    ),
    pytest.param(
        GLUE,
        "--model_name_or_path m --include_num_input_tokens_seen --load_best_model_at_end --log_every 10",
        id="bare-flags-and-metadata-alias",
    ),
    pytest.param(
        GLUE,
        "--model_name_or_path m --max_train_samples 100 --token abc --warmup_steps 0.1 "
        "--include_num_input_tokens_seen false -L 7 --lr_scheduler_kwargs {}",
        id="optional-values",
    ),
    pytest.param(GLUE, "--model_name_or_path m --no-skip-memory-metrics", id="optional-bool-negation"),
    pytest.param(GLUE, "--model_name_or_path m --skip_memory_metrics", id="optional-bool-bare"),
    pytest.param(GLUE, "--model_name_or_path a --model_name_or_path b --seeds 1 --seeds 2", id="last-wins"),
    pytest.param(GLUE, "--model_name_or_path m --remove_unused_columns --no_remove_unused_columns", id="neg-last"),
    pytest.param(GLUE, "--model_name_or_path m --no_remove_unused_columns --remove_unused_columns", id="pos-last"),
    pytest.param(
        CLM,
        "--model_type gpt2 --config_overrides n_embd=10 --dataset_name wikitext --block_size 128 --streaming "
        "--no_keep_linebreaks --torch_dtype bfloat16 --output_dir o --validation_split_percentage 10",
        id="clm",
    ),
    pytest.param(CLM, "", id="clm-defaults"),
    pytest.param(CLM, "--keep_linebreaks false --low_cpu_mem_usage --streaming n", id="clm-bools"),
    pytest.param((GroupedArguments,), "--alpha 3 --bv x", id="argument-group"),
    pytest.param((GroupedArguments,), "--beta-value y", id="argument-group-alias"),
]


@pytest.mark.parametrize(("dataclass_types", "argv"), COMMAND_LINES)
def test_command_line_parses_as_hf(dataclass_types, argv):
    argv = argv.split() if isinstance(argv, str) else argv
    if dataclass_types is GLUE and "--model_name_or_path" not in argv and "--model-name-or-path" not in argv:
        for parser in (HfArgumentParser(dataclass_types), _hf_parser(dataclass_types)):
            with pytest.raises(SystemExit) as exit_info:
                parser.parse_args_into_dataclasses(argv, look_for_args_file=False)
            assert exit_info.value.code == 2
        return
    ours, theirs = _parse_both(dataclass_types, "parse_args_into_dataclasses", argv, look_for_args_file=False)
    assert _typed(ours) == _typed(theirs)
    assert [type(x) for x in ours] == list(dataclass_types)


def test_values_that_need_the_dataclass_to_convert_them():
    (train,) = HfArgumentParser(TrainLikeArguments).parse_args_into_dataclasses(
        "--eval_strategy steps --precision 32 --include_num_input_tokens_seen --debug underflow_overflow".split(),
        look_for_args_file=False,
    )
    # The parser hands enum *values* over; __post_init__ converts the ones it knows about.
    assert train.eval_strategy is IntervalStrategy.STEPS
    assert train.precision == 32
    assert train.include_num_input_tokens_seen is True
    assert train.debug == [DebugOption.UNDERFLOW_OVERFLOW]
    (defaults,) = HfArgumentParser(TrainLikeArguments).parse_args_into_dataclasses([], look_for_args_file=False)
    # A str default goes through the argument's type, as argparse does for string defaults.
    assert defaults.include_num_input_tokens_seen is False
    assert defaults.debug == []
    assert defaults.seeds == [42]
    assert defaults.precision is Precision.FP32


def test_extra_arguments_come_back_in_a_namespace():
    results = []
    for parser in (HfArgumentParser(ClmDataArguments), _hf_parser(ClmDataArguments)):
        parser.add_argument("--extra", type=int, default=3)
        parser.add_argument("--flag_only", action="store_true")
        results.append(parser.parse_args_into_dataclasses(["--extra", "5", "--streaming"], look_for_args_file=False))
    ours, theirs = results
    assert _typed(ours) == _typed(theirs)
    assert vars(ours[1]) == {"extra": 5, "flag_only": False}


def test_return_remaining_strings():
    argv = ["--model_type", "gpt2", "--unknown", "1", "positional"]
    ours, theirs = _parse_both(
        CLM, "parse_args_into_dataclasses", argv, return_remaining_strings=True, look_for_args_file=False
    )
    assert _typed(ours) == _typed(theirs)
    assert ours[-1] == ["--unknown", "1", "positional"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--model_type", "gpt2", "--bogus", "1"],
        ["stray"],
        ["--train_batch_size", "3"],  # init=False fields get no option
    ],
)
def test_unused_arguments_error(argv):
    messages = []
    for parser in (HfArgumentParser(CLM), _hf_parser(CLM)):
        with pytest.raises(ValueError, match=r"Some specified arguments are not used by the HfArgumentParser: \[") as e:
            parser.parse_args_into_dataclasses(argv, look_for_args_file=False)
        messages.append(str(e.value))
    assert messages[0] == messages[1]


@pytest.mark.parametrize(
    ("argv", "stderr_pattern"),
    [
        (["--do_train", "maybe"], r"argument --do_train/--do-train: invalid boolean value 'maybe': use one of yes/no"),
        (["--greater_is_better"], r"expected one argument"),  # Optional[bool] = None needs a value
        (["--eval_strategy", "sometimes"], r"invalid choice: 'sometimes'"),
        (["--optim", "adam"], r"invalid choice: 'adam'"),
        (["--seeds"], r"expected at least one argument"),
        (["--max_steps", "ten"], r"invalid int value: 'ten'"),
    ],
)
def test_invalid_values_exit_with_usage_error(argv, stderr_pattern, capsys):
    for parser in (HfArgumentParser(TrainLikeArguments), _hf_parser(TrainLikeArguments)):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args_into_dataclasses(argv, look_for_args_file=False)
        assert exit_info.value.code == 2
    ours_err, hf_err = capsys.readouterr().err.split("usage:")[1:]
    assert re.search(stderr_pattern, ours_err)
    assert argv[-1] in hf_err


def test_help_exits_zero_and_matches_hf(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    outputs = []
    for parser in (HfArgumentParser(GLUE, prog="run_glue.py"), _hf_parser(GLUE, prog="run_glue.py")):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args_into_dataclasses(["--help"], look_for_args_file=False)
        assert exit_info.value.code == 0
        outputs.append(capsys.readouterr().out)
    ours, theirs = outputs
    assert ours == theirs
    assert "--model_name_or_path MODEL_NAME_OR_PATH, --model-name-or-path MODEL_NAME_OR_PATH" in ours
    assert "--no_use_fast_tokenizer, --no-use-fast-tokenizer" in ours
    assert "Whether to use a fast tokenizer. (default: True)" in ours
    assert "{adamw_torch,sgd,adafactor}" in ours


def test_help_shows_argument_groups(capsys):
    parser = HfArgumentParser([GroupedArguments, ClmDataArguments], prog="p")
    with pytest.raises(SystemExit, match="0"):
        parser.parse_args_into_dataclasses(["-h"], look_for_args_file=False)
    out = capsys.readouterr().out
    assert "grouped options:" in out
    assert "--beta_value BETA_VALUE, --beta-value BETA_VALUE, --bv BETA_VALUE" in out


def test_custom_formatter_class_is_kept():
    parser = HfArgumentParser(ClmDataArguments, formatter_class=argparse.RawTextHelpFormatter, prog="p")
    assert parser.formatter_class is argparse.RawTextHelpFormatter
    assert HfArgumentParser(ClmDataArguments).formatter_class is argparse.ArgumentDefaultsHelpFormatter


# ---------------------------------------------------------------------------------------------------------------
# Args files
# ---------------------------------------------------------------------------------------------------------------


def test_args_filename_is_read_before_the_command_line(tmp_path):
    args_file = tmp_path / "train.args"
    args_file.write_text("--model_type gpt2 --learning_rate 0.1\n--do_train --seeds 7 8\n")
    ours, theirs = _parse_both(
        CLM, "parse_args_into_dataclasses", ["--learning_rate", "0.2"], args_filename=str(args_file)
    )
    assert _typed(ours) == _typed(theirs)
    assert (ours[2].learning_rate, ours[2].do_train, ours[2].seeds, ours[0].model_type) == (0.2, True, [7, 8], "gpt2")


def test_args_file_beside_the_script(tmp_path, monkeypatch):
    (tmp_path / "run_clm.args").write_text("--block_size 64 --streaming")
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "run_clm.py"), "--block_size", "32", "--max_steps", "5"])
    ours, theirs = _parse_both(CLM, "parse_args_into_dataclasses")
    assert _typed(ours) == _typed(theirs)
    assert (ours[1].block_size, ours[1].streaming, ours[2].max_steps) == (32, True, 5)
    ours, theirs = _parse_both(CLM, "parse_args_into_dataclasses", look_for_args_file=False)
    assert _typed(ours) == _typed(theirs)
    assert ours[1].streaming is False


def test_args_file_flag_later_files_win(tmp_path):
    first, second = tmp_path / "a.args", tmp_path / "b.args"
    first.write_text("--block_size 1 --dataset_name first --streaming")
    second.write_text("--block_size 2")
    argv = ["--args_file", str(first), "--max_steps", "3", "--args_file", str(second), "--args_file", "missing.args"]
    ours, theirs = _parse_both(
        CLM, "parse_args_into_dataclasses", argv, look_for_args_file=False, args_file_flag="--args_file"
    )
    assert _typed(ours) == _typed(theirs)
    assert (ours[1].block_size, ours[1].dataset_name, ours[1].streaming, ours[2].max_steps) == (2, "first", True, 3)


# ---------------------------------------------------------------------------------------------------------------
# dict / JSON / YAML
# ---------------------------------------------------------------------------------------------------------------

CONFIG = {
    "model_name_or_path": "bert-base-cased",
    "task_name": "mrpc",
    "max_seq_length": 64,
    "pad_to_max_length": False,
    "output_dir": "out",
    "do_train": True,
    "eval_strategy": "epoch",
    "lr_scheduler_type": "cosine",
    "learning_rate": "1e-3",  # stays a string: no argparse conversion for dicts
    "report_to": ["tensorboard"],
    "label_names": ["labels"],
    "debug": "underflow_overflow",
    "precision": "bf16",
    "seeds": [1, 2],
}


def test_parse_dict_as_hf():
    ours, theirs = _parse_both(GLUE, "parse_dict", CONFIG)
    assert _typed(ours) == _typed(theirs)
    assert ours[2].learning_rate == "1e-3"
    assert ours[2].eval_strategy is IntervalStrategy.EPOCH


def test_parse_json_file_as_hf(tmp_path):
    path = tmp_path / "args.json"
    path.write_text(json.dumps(CONFIG), encoding="utf-8")
    ours, theirs = _parse_both(GLUE, "parse_json_file", path)
    assert _typed(ours) == _typed(theirs)
    ours_str_path = HfArgumentParser(GLUE).parse_json_file(str(path))
    assert _typed(ours_str_path) == _typed(theirs)


def test_parse_yaml_file_as_hf(tmp_path):
    path = tmp_path / "args.yaml"
    path.write_text(
        "model_type: gpt2\nblock_size: 128\nstreaming: true\nkeep_linebreaks: no\nlearning_rate: 0.001\n"
        "seeds: [3, 4]\nlabel_names:\n  - labels\n",
        encoding="utf-8",
    )
    ours, theirs = _parse_both(CLM, "parse_yaml_file", path)
    assert _typed(ours) == _typed(theirs)
    assert ours[1].keep_linebreaks is False


@pytest.mark.parametrize("method", ["parse_dict", "parse_json_file", "parse_yaml_file"])
def test_unknown_keys_error_lists_them_sorted(method, tmp_path):
    data = {"model_type": "gpt2", "zeta": 1, "alpha_unknown": 2}
    if method == "parse_dict":
        source = data
    else:
        source = tmp_path / "args.file"
        source.write_text(json.dumps(data), encoding="utf-8")  # JSON is also valid YAML
    messages = []
    for parser in (HfArgumentParser(CLM), _hf_parser(CLM)):
        expected = r"^Some keys are not used by the HfArgumentParser: \['alpha_unknown', 'zeta'\]$"
        with pytest.raises(ValueError, match=expected) as e:
            getattr(parser, method)(source)
        messages.append(str(e.value))
        kept = getattr(parser, method)(source, allow_extra_keys=True)
        assert kept[0].model_type == "gpt2"
    assert messages[0] == messages[1]


def test_parse_yaml_file_without_pyyaml(tmp_path, monkeypatch):
    path = tmp_path / "args.yaml"
    path.write_text("model_type: gpt2\n", encoding="utf-8")
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(ImportError, match=r"parse_yaml_file needs PyYAML.*pip install pyyaml"):
        HfArgumentParser(CLM).parse_yaml_file(path)


def test_parse_dict_rejects_a_non_mapping():
    with pytest.raises(TypeError, match=r"parse_dict expects a dict of field names to values, got list"):
        HfArgumentParser(CLM).parse_dict(["--model_type", "gpt2"])


def test_parse_dict_missing_required_field_is_the_dataclass_error():
    for parser in (HfArgumentParser(GlueModelArguments), _hf_parser(GlueModelArguments)):
        with pytest.raises(TypeError, match="model_name_or_path"):
            parser.parse_dict({})


# ---------------------------------------------------------------------------------------------------------------
# Construction: accepted inputs and clear errors for annotations the parser cannot handle
# ---------------------------------------------------------------------------------------------------------------


def test_single_dataclass_iterable_or_none():
    assert HfArgumentParser(ClmDataArguments).dataclass_types == [ClmDataArguments]
    assert HfArgumentParser((c for c in CLM)).dataclass_types == list(CLM)
    parser = HfArgumentParser()
    parser.add_argument("--x", type=int, default=1)
    assert vars(parser.parse_args_into_dataclasses([], look_for_args_file=False)[0]) == {"x": 1}


def test_non_dataclass_is_rejected():
    with pytest.raises(TypeError, match=r"HfArgumentParser takes dataclass types, got .*pass the class itself"):
        HfArgumentParser([ClmDataArguments()])
    with pytest.raises(TypeError, match=r"HfArgumentParser takes dataclass types, got <class 'int'>"):
        HfArgumentParser(int)


@dataclass
class TwoTypeUnion:
    value: Union[int, float] = 1


@dataclass
class ThreeTypeOptionalUnion:
    value: int | float | None = None


@pytest.mark.parametrize("dataclass_type", [TwoTypeUnion, ThreeTypeOptionalUnion])
def test_union_without_a_single_type_is_rejected_as_in_hf(dataclass_type):
    with pytest.raises(ValueError, match=r"Field 'value' is annotated .*only supported as Optional\[X\]"):
        HfArgumentParser(dataclass_type)
    with pytest.raises(ValueError, match=r"Problem encountered in field 'value'"):
        _hf_parser(dataclass_type)


@dataclass
class BareList:
    names: list = field(default_factory=list)


def test_list_without_item_type_is_rejected():
    with pytest.raises(TypeError, match=r"Field 'names' is annotated <class 'list'>: a list field needs its item type"):
        HfArgumentParser(BareList)


@dataclass
class BoolOrString:
    mode: Optional[Union[bool, str]] = None
    other: int = 0


def test_bool_union_fails_only_when_given(capsys):
    parser = HfArgumentParser(BoolOrString)
    assert parser.parse_args_into_dataclasses(["--other", "2"], look_for_args_file=False) == (BoolOrString(None, 2),)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args_into_dataclasses(["--mode", "x"], look_for_args_file=False)
    assert exit_info.value.code == 2
    assert "field 'mode' is annotated typing.Union[bool, str, NoneType]" in capsys.readouterr().err


@dataclass
class RequiredKinds:
    name: str
    level: IntervalStrategy
    tags: list[str]
    flag: bool
    maybe: Optional[bool]
    factory_list: list[int] = field(default_factory=list)
    factory_value: dict = field(default_factory=dict)


def test_required_and_default_rules_match_hf(capsys):
    for parser in (HfArgumentParser(RequiredKinds), _hf_parser(RequiredKinds)):
        with pytest.raises(SystemExit):
            parser.parse_args_into_dataclasses([], look_for_args_file=False)
    errors = capsys.readouterr().err.split("usage:")[1:]
    assert all("the following arguments are required: --name, --level, --tags" in e for e in errors)
    argv = "--name n --level epoch --tags a b".split()
    ours, theirs = _parse_both(RequiredKinds, "parse_args_into_dataclasses", argv, look_for_args_file=False)
    assert _typed(ours) == _typed(theirs)
    # A bool without default is False; Optional[bool] without default is None.
    assert (ours[0].flag, ours[0].maybe, ours[0].factory_value) == (False, None, {})


def test_dataclass_fields_are_not_modified():
    before = {f.name: f.type for f in dataclasses.fields(TrainLikeArguments)}
    HfArgumentParser(TrainLikeArguments)
    assert {f.name: f.type for f in dataclasses.fields(TrainLikeArguments)} == before


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------

BOOL_WORDS = ["yes", "YES", "true", "True", "t", "T", "y", "1", "no", "No", "false", "FALSE", "f", "n", "0"]
BOOL_WORDS += [True, False]


@pytest.mark.parametrize("word", BOOL_WORDS)
def test_string_to_bool_as_hf(word):
    from transformers.hf_argparser import string_to_bool as hf_string_to_bool

    assert string_to_bool(word) is hf_string_to_bool(word)


@pytest.mark.parametrize("word", ["maybe", "", "2", "on"])
def test_string_to_bool_rejects_other_words(word):
    with pytest.raises(argparse.ArgumentTypeError, match=rf"invalid boolean value '{word}': use one of yes/no"):
        string_to_bool(word)


def test_hfarg_builds_the_same_field_as_hf():
    from transformers.hf_argparser import HfArg as HFHfArg

    for kwargs in (
        {"default": 1, "aliases": ["--lr", "-l"], "help": "rate"},
        {"default_factory": list, "aliases": "--xs"},
        {"metadata": {"choices": [1, 2]}, "help": "h", "init": True},
        {},
    ):
        ours, theirs = HfArg(**kwargs), HFHfArg(**kwargs)
        assert (ours.default, ours.default_factory, dict(ours.metadata), ours.init) == (
            theirs.default,
            theirs.default_factory,
            dict(theirs.metadata),
            theirs.init,
        )


def test_hfarg_does_not_change_the_metadata_passed_in():
    metadata = {"choices": [1, 2]}
    HfArg(default=1, aliases="--a", help="h", metadata=metadata)
    assert metadata == {"choices": [1, 2]}


# ---------------------------------------------------------------------------------------------------------------
# transformers' own TrainingArguments, the richest set of annotations in the wild, through both parsers
# ---------------------------------------------------------------------------------------------------------------

HF_TRAINING_COMMAND_LINES = [
    "--output_dir o",
    "--output_dir o --eval_strategy steps --eval_steps 0.5 --report_to none --optim adamw_torch "
    "--lr_scheduler_type cosine --no_remove_unused_columns --bf16 false --label_names a b "
    "--debug underflow_overflow --include_num_input_tokens_seen --use_cpu",
    "--output-dir o --save_strategy epoch --eval-strategy epoch --save_total_limit 2 --load_best_model_at_end "
    "--metric_for_best_model loss --greater_is_better false --warmup_steps 0.1 "
    "--gradient_accumulation_steps 4 --max_steps 10 --seed 7",
]


def test_hf_training_arguments_help_is_identical(capsys, monkeypatch):
    from transformers import TrainingArguments as HFTrainingArguments

    monkeypatch.setenv("COLUMNS", "120")
    outputs = []
    for parser in (HfArgumentParser(HFTrainingArguments, prog="x"), _hf_parser(HFTrainingArguments, prog="x")):
        parser.print_help()
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("argv", HF_TRAINING_COMMAND_LINES)
def test_hf_training_arguments_parse_the_same(argv):
    from transformers import TrainingArguments as HFTrainingArguments

    ours, theirs = _parse_both(
        HFTrainingArguments, "parse_args_into_dataclasses", argv.split(), look_for_args_file=False
    )
    assert ours[0].to_dict() == theirs[0].to_dict()
