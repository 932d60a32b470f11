"""Resume and stateful callbacks / changed arguments: the same run on ``transformers.Trainer`` and ours.

Two instances of one stateful callback class are stored as a list and restored pairwise (the i-th from the i-th
saved state); a saved callback the resumed run does not have, and arguments that changed since the checkpoint, give
HF's warnings.
"""

from __future__ import annotations

import logging

import pytest
import torch

from tests.helpers.models import RegressionModel, regression_data

ARGS = dict(per_device_train_batch_size=4, max_steps=6, save_steps=3, logging_steps=1, learning_rate=1e-2,
            report_to="none", use_cpu=True, disable_tqdm=True, seed=42, restore_callback_states_from_checkpoint=True)


def _lib(name):
    import transformers

    import hf_lightning

    return transformers if name == "hf" else hf_lightning


def _counter_class(lib_name):
    """A stateful callback named ``Counter`` for either library (saved states are keyed by class name)."""
    if lib_name == "hf":
        from transformers import TrainerCallback
        from transformers.trainer_callback import ExportableState
    else:
        from hf_lightning import TrainerCallback
        from hf_lightning.state import ExportableState

    class Counter(TrainerCallback, ExportableState):
        def __init__(self, tag="", step_by=1):
            self.tag, self.step_by, self.count = tag, step_by, 0

        def on_step_end(self, args, state, control, **kwargs):
            self.count += self.step_by

        def state(self):
            return {"args": {"tag": self.tag, "step_by": self.step_by}, "attributes": {"count": self.count}}

    return Counter


def _train(lib_name, output_dir, callbacks, resume=None, **extra):
    lib = _lib(lib_name)
    torch.set_num_threads(1)
    args = lib.TrainingArguments(output_dir=str(output_dir), **{**ARGS, **extra})
    trainer = lib.Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(n=24),
                          callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _counters(trainer):
    return [(cb.tag, cb.step_by, cb.count) for cb in trainer.callback_handler.callbacks
            if type(cb).__name__ == "Counter"]


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings_of():
    """Collect the WARNING messages of the named loggers (transformers' loggers do not propagate to root)."""
    attached = []

    def attach(*names):
        handler = _Capture()
        for name in names:
            logging.getLogger(name).addHandler(handler)
            attached.append((name, handler))
        return handler.messages

    yield attach
    for name, handler in attached:
        logging.getLogger(name).removeHandler(handler)


def test_two_instances_of_one_stateful_callback_resume_pairwise(tmp_path):
    """Tags, args, restored counts and order equal HF's (HF appends each save's states to the list it resumes
    from, so the pairing picks the first saved pair: a quirk reproduced on purpose)."""
    outcomes = {}
    for lib_name in ("hf", "ours"):
        counter = _counter_class(lib_name)
        _train(lib_name, tmp_path / lib_name / "first", [counter("a", 1), counter("b", 10)])
        resumed = _train(lib_name, tmp_path / lib_name / "second", [counter("a", 1), counter("b", 10)],
                         resume=str(tmp_path / lib_name / "first" / "checkpoint-3"))
        outcomes[lib_name] = _counters(resumed)
    # Each instance keeps its own args: the second is not rebuilt from the first one's saved state.
    assert [(tag, step_by) for tag, step_by, _ in outcomes["ours"]] == [("a", 1), ("b", 10)]
    assert outcomes["ours"] == outcomes["hf"]


def test_saved_callback_missing_from_the_run_warns_as_hf(tmp_path, warnings_of):
    messages = warnings_of("transformers.trainer", "hf_lightning.resume")
    for lib_name in ("hf", "ours"):
        _train(lib_name, tmp_path / lib_name / "first", [_counter_class(lib_name)()])
        _train(lib_name, tmp_path / lib_name / "second", [],
               resume=str(tmp_path / lib_name / "first" / "checkpoint-3"))
    expected = "Checkpoint included callbacks not included in current configuration. Ignoring. (Counter)"
    assert messages.count(expected) == 2, messages


def test_changed_arguments_warning_names_the_values_as_hf(tmp_path, warnings_of):
    messages = warnings_of("transformers.trainer_utils", "hf_lightning.resume")
    for lib_name in ("hf", "ours"):
        _train(lib_name, tmp_path / lib_name / "first", [])
        # save_steps 3 -> 5 and logging_steps 1 -> 2: both named with the value from each side.
        _train(lib_name, tmp_path / lib_name / "second", [], resume=str(tmp_path / lib_name / "first" / "checkpoint-3"),
               save_steps=5, logging_steps=2)
    relevant = [m for m in messages if "do not match" in m]
    assert len(relevant) == 2, messages
    assert relevant[0] == relevant[1]
    assert "save_steps: 5 (from args) != 3 (from trainer_state.json)" in relevant[1]
