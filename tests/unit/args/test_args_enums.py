"""The argument enums have HF 5.23's names and values, and explain invalid values."""

import pytest
import transformers
from transformers import debug_utils, trainer_utils, training_args

from hf_lightning.args import enums

PAIRS = [
    (enums.IntervalStrategy, trainer_utils.IntervalStrategy),
    (enums.SaveStrategy, trainer_utils.SaveStrategy),
    (enums.HubStrategy, trainer_utils.HubStrategy),
    (enums.SchedulerType, trainer_utils.SchedulerType),
    (enums.FSDPOption, trainer_utils.FSDPOption),
    (enums.OptimizerNames, training_args.OptimizerNames),
    (enums.DebugOption, debug_utils.DebugOption),
    (enums.ParallelMode, training_args.ParallelMode),
]


@pytest.mark.parametrize("ours, theirs", PAIRS, ids=lambda cls: cls.__name__)
def test_members_match_hf(ours, theirs):
    assert [(m.name, m.value) for m in ours] == [(m.name, m.value) for m in theirs]


@pytest.mark.parametrize("ours, theirs", PAIRS[:-1], ids=lambda cls: cls.__name__)
def test_members_are_strings_equal_to_their_values(ours, theirs):
    for member in ours:
        assert isinstance(member, str)
        assert member == member.value == theirs(member.value)
        assert f"{member}" == f"{theirs(member.value)}"


@pytest.mark.parametrize("ours, theirs", PAIRS[:-1], ids=lambda cls: cls.__name__)
def test_invalid_value_lists_the_valid_ones(ours, theirs):
    with pytest.raises(ValueError):
        theirs("not-a-member")
    with pytest.raises(ValueError) as error:
        ours("not-a-member")
    message = str(error.value)
    assert ours.__name__ in message
    assert str([m.value for m in ours]) in message


def test_scheduler_names_include_the_5x_additions():
    values = {m.value for m in enums.SchedulerType}
    assert {"reduce_lr_on_plateau", "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay",
            "greedy"} <= values


def test_top_level_hf_names_are_the_same_objects_users_import():
    assert transformers.IntervalStrategy("steps") == enums.IntervalStrategy.STEPS
    assert transformers.SchedulerType("cosine") == enums.SchedulerType.COSINE
