"""Helpers shared by the TrainingArguments tests: build HF's and our arguments side by side."""

import copy
import warnings

import pytest


def _quietly(cls, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**kwargs)


@pytest.fixture
def build_both(monkeypatch):
    """Return `build(kwargs) -> (hf_args, our_args)`, both built from the same keyword arguments.

    HF's FSDP set-up writes an environment variable; it is restored after the test.
    """
    import transformers

    from hf_lightning.args import TrainingArguments

    monkeypatch.delenv("FSDP_CPU_RAM_EFFICIENT_LOADING", raising=False)
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)

    def build(kwargs, hf_kwargs=None):
        # Separate copies: HF's to_dict() rewrites nested dicts of its arguments in place.
        hf_kwargs = copy.deepcopy(kwargs if hf_kwargs is None else hf_kwargs)
        return _quietly(transformers.TrainingArguments, hf_kwargs), _quietly(TrainingArguments, kwargs)

    return build


@pytest.fixture
def quietly():
    """Construct a class with all warnings suppressed: `quietly(cls, **kwargs)`."""
    return lambda cls, **kwargs: _quietly(cls, kwargs)
