"""HfArgumentParser with dataclasses whose annotations are strings (`from __future__ import annotations`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal, Optional

import pytest

from hf_lightning.args.parser import HfArgumentParser


class Color(str, Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class PostponedArguments:
    name: str
    count: Optional[int] = None
    ratio: float | None = 0.5
    tags: list[str] = field(default_factory=lambda: ["a"])
    color: Color = Color.RED
    mode: Literal["x", "y"] = "x"
    enabled: bool = True
    strict: Optional[bool] = None


def _hf_parser(dataclass_types):
    from transformers import HfArgumentParser as HFParser

    return HFParser(dataclass_types)


def _asdict(instances):
    return [
        {k: (v.value if isinstance(v, Enum) else v) for k, v in dataclasses.asdict(instance).items()}
        for instance in instances
    ]


@pytest.mark.parametrize(
    "argv",
    [
        "--name n",
        "--name n --count 3 --ratio 2 --tags b c --color blue --mode y --no_enabled --strict yes",
        "--name n --enabled false --strict 0",
    ],
)
def test_string_annotations_parse_as_hf(argv):
    ours = HfArgumentParser(PostponedArguments).parse_args_into_dataclasses(argv.split(), look_for_args_file=False)
    theirs = _hf_parser(PostponedArguments).parse_args_into_dataclasses(argv.split(), look_for_args_file=False)
    assert _asdict(ours) == _asdict(theirs)
    assert [type(v) for v in vars(ours[0]).values()] == [type(v) for v in vars(theirs[0]).values()]


def test_unresolvable_annotation_is_a_clear_error():
    class LocalType:
        pass

    @dataclass
    class Local:
        value: LocalType = None

    with pytest.raises(RuntimeError, match=r"Could not resolve the type annotations of Local .*LocalType"):
        HfArgumentParser(Local)
    with pytest.raises(RuntimeError, match="Type resolution failed"):
        _hf_parser(Local)
