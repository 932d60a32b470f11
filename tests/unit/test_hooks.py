"""``TrainerHooks``: the facade provides every override point with HF's parameters."""

from __future__ import annotations

import inspect

import pytest

from hf_lightning.hooks import TrainerHooks

HOOKS = ["compute_loss", "training_step", "prediction_step", "create_optimizer", "create_scheduler", "log",
         "evaluate"]


def test_the_protocol_lists_the_override_points():
    assert sorted(n for n in vars(TrainerHooks) if not n.startswith("_")) == sorted(HOOKS)


@pytest.mark.parametrize("name", HOOKS)
def test_the_facade_implements_each_hook(name):
    from hf_lightning import Seq2SeqTrainer, Trainer

    expected = list(inspect.signature(getattr(TrainerHooks, name)).parameters)
    for cls in (Trainer, Seq2SeqTrainer):
        params = list(inspect.signature(getattr(cls, name)).parameters)
        # Same leading parameters; an implementation may add optional ones (create_scheduler's optimizer).
        assert params[: len(expected)] == expected, (cls.__name__, name, params)
