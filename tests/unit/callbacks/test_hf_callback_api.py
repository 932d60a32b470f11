"""CallbackHandler / TrainerCallback against transformers: user callbacks written for HF run unchanged."""

import inspect
import json
import logging
import re
from pathlib import Path

import pytest

from hf_lightning.callbacks import hf_api
from hf_lightning.callbacks.hf_api import CallbackHandler, DefaultFlowCallback, PrinterCallback, TrainerCallback
from hf_lightning.state import TrainerControl, TrainerState

GOLDEN_EVENTS = Path("/work/shared/reference/golden/callback_events.json")

EVENTS = [
    "on_init_end",
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_step_begin",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_substep_end",
    "on_step_end",
    "on_evaluate",
    "on_predict",
    "on_save",
    "on_log",
    "on_prediction_step",
    "on_push_begin",
]
FLAGS = ["should_training_stop", "should_epoch_stop", "should_save", "should_evaluate", "should_log"]
SHARED_KWARGS = {"model", "processing_class", "optimizer", "lr_scheduler", "train_dataloader", "eval_dataloader"}


def _hf():
    from transformers import trainer_callback

    return trainer_callback


def _event_extras(event):
    if event in ("on_evaluate", "on_predict"):
        return {"metrics": {"eval_loss": 1.0}}
    if event == "on_log":
        return {"logs": {"loss": 1.0}}
    return {}


def _make_recorder_class():
    """A user's callback, written against transformers' TrainerCallback (as in the golden script)."""
    hf = _hf()

    def _short_flags(control):
        names = [
            ("should_log", "log"),
            ("should_evaluate", "eval"),
            ("should_save", "save"),
            ("should_epoch_stop", "epoch_stop"),
            ("should_training_stop", "stop"),
        ]
        return [short for attr, short in names if getattr(control, attr)]

    class Recorder(hf.TrainerCallback):
        def __init__(self):
            self.events = []
            self.kwargs = []

        def _record(self, name, state, control, kwargs):
            entry = f"{name} gs={state.global_step} ep={round(float(state.epoch or 0), 4)}"
            if name in ("on_step_end", "on_epoch_end"):
                entry += f" flags={_short_flags(control)}"
            if name == "on_log":
                entry += f" keys={sorted(kwargs['logs'].keys())}"
            self.events.append(entry)
            self.kwargs.append((name, sorted(kwargs)))

    for name in EVENTS:

        def handler(self, args, state, control, _name=name, **kwargs):
            self._record(_name, state, control, kwargs)

        setattr(Recorder, name, handler)
    return Recorder


def _golden_args(tmp_path):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=4,
        save_steps=4,
        save_total_limit=2,
        load_best_model_at_end=True,
        report_to="none",
        use_cpu=True,
    )


_LINE = re.compile(r"^(\w+) gs=(\d+) ep=([\d.]+)(?: flags=.*)?(?: keys=(\[.*\]))?$")


def _replay(handler, args, state, control, lines):
    """Drive a handler with the golden run's events, as HF's Trainer did."""
    for line in lines:
        event, step, epoch, keys = _LINE.match(line).groups()
        state.global_step, state.epoch = int(step), float(epoch)
        kwargs = {}
        if event == "on_log":
            kwargs["logs"] = dict.fromkeys(json.loads(keys.replace("'", '"')), 1.0)
        if event == "on_evaluate":
            kwargs["metrics"] = {"eval_loss": 1.0}
        control = getattr(handler, event)(args, state, control, **kwargs)
    return control


def test_golden_event_sequence_replays_identically(tmp_path):
    """Our DefaultFlowCallback + resets reproduce every flag HF's run showed to a user's recorder."""
    args = _golden_args(tmp_path)
    lines = json.loads(GOLDEN_EVENTS.read_text())
    Recorder = _make_recorder_class()

    recorder = Recorder()
    state = TrainerState()
    state.compute_steps(args, 16)
    state.max_steps = 16
    handler = CallbackHandler([DefaultFlowCallback, recorder], "model", "tok", "opt", "sched")
    _replay(handler, args, state, TrainerControl(), lines)
    assert recorder.events == lines

    hf = _hf()
    hf_recorder = Recorder()
    hf_state = hf.TrainerState()
    hf_state.compute_steps(args, 16)
    hf_state.max_steps = 16
    hf_handler = hf.CallbackHandler([hf.DefaultFlowCallback, hf_recorder], "model", "tok", "opt", "sched")
    _replay(hf_handler, args, hf_state, hf.TrainerControl(), lines)
    assert hf_recorder.events == recorder.events
    assert hf_recorder.kwargs == recorder.kwargs


@pytest.mark.parametrize("event", EVENTS)
def test_resets_before_dispatch_match_hf(event):
    hf = _hf()
    seen = {}

    class Spy(hf.TrainerCallback):
        pass

    def spy(self, args, state, control, **kwargs):
        seen.setdefault("flags", []).append([getattr(control, f) for f in FLAGS])

    setattr(Spy, event, spy)
    raised = dict.fromkeys(FLAGS, True)
    ours = (CallbackHandler([DefaultFlowCallback(), Spy()], None, None, None, None), TrainerControl(**raised))
    theirs = (
        hf.CallbackHandler([hf.DefaultFlowCallback(), Spy()], None, None, None, None),
        hf.TrainerControl(**raised),
    )
    results = []
    for handler, control in (ours, theirs):
        # Off-cadence step before max_steps, flow-free args: DefaultFlowCallback raises nothing that hides a reset.
        state = TrainerState(global_step=3, max_steps=100, logging_steps=7, eval_steps=7, save_steps=7)
        out = getattr(handler, event)(_flow_free_args(), state, control, **_event_extras(event))
        results.append([getattr(out, f) for f in FLAGS])
    assert seen["flags"][0] == seen["flags"][1]
    assert results[0] == results[1]


def _flow_free_args():
    from types import SimpleNamespace

    return SimpleNamespace(
        logging_strategy="no", logging_first_step=False, eval_strategy="no", eval_delay=0, save_strategy="no"
    )


def test_return_value_replaces_control_for_later_callbacks_and_caller():
    replacement = TrainerControl(should_save=True)
    seen = []

    class Replacer(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            return replacement

    class Mutator(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(control)
            control.should_log = True  # returns None: the mutated object is kept

    original = TrainerControl()
    handler = CallbackHandler([DefaultFlowCallback, Replacer, Mutator], None, None, None, None)
    out = handler.on_step_end(_flow_free_args(), TrainerState(global_step=1, max_steps=10), original)
    assert out is replacement
    assert seen == [replacement]
    assert replacement.should_log and replacement.should_save
    assert original == TrainerControl()


def test_return_value_replacement_matches_hf():
    hf = _hf()

    class ReturnsFresh(hf.TrainerCallback):
        def on_log(self, args, state, control, **kwargs):
            fresh = type(control)()
            fresh.should_evaluate = True
            return fresh

    class RaisesStop(hf.TrainerCallback):
        def on_log(self, args, state, control, **kwargs):
            control.should_training_stop = True

    state_args = (_flow_free_args(), TrainerState())
    ours = CallbackHandler([ReturnsFresh, RaisesStop], None, None, None, None)
    theirs = hf.CallbackHandler([ReturnsFresh, RaisesStop], None, None, None, None)
    out = ours.on_log(*state_args, TrainerControl(should_save=True), logs={})
    hf_out = theirs.on_log(*state_args, hf.TrainerControl(should_save=True), logs={})
    assert out.state() == hf_out.state()


@pytest.mark.parametrize("event", EVENTS)
def test_every_event_passes_hf_kwargs(event):
    received = {}

    class Spy(TrainerCallback):
        pass

    def spy(self, args, state, control, **kwargs):
        received.update(kwargs)

    setattr(Spy, event, spy)
    handler = CallbackHandler([DefaultFlowCallback, Spy], "model", "tok", "opt", "sched")
    handler.train_dataloader, handler.eval_dataloader = "train_dl", "eval_dl"
    getattr(handler, event)(_flow_free_args(), TrainerState(max_steps=10), TrainerControl(), **_event_extras(event))
    assert set(received) == SHARED_KWARGS | set(_event_extras(event))
    assert (received["model"], received["processing_class"], received["optimizer"]) == ("model", "tok", "opt")
    assert (received["lr_scheduler"], received["train_dataloader"], received["eval_dataloader"]) == (
        "sched",
        "train_dl",
        "eval_dl",
    )


@pytest.mark.parametrize("event", EVENTS)
def test_event_signatures_match_hf(event):
    hf = _hf()
    for ours, theirs in ((TrainerCallback, hf.TrainerCallback), (CallbackHandler, hf.CallbackHandler)):
        ours_params = [(p.name, p.kind) for p in inspect.signature(getattr(ours, event)).parameters.values()]
        hf_params = [(p.name, p.kind) for p in inspect.signature(getattr(theirs, event)).parameters.values()]
        assert ours_params == hf_params, (ours, event)


def test_public_methods_match_hf():
    hf = _hf()
    hf_names = {n for n in dir(hf.CallbackHandler) if not n.startswith("_")}
    assert hf_names <= {n for n in dir(CallbackHandler) if not n.startswith("_")}
    hf_names = {n for n in dir(hf.TrainerCallback) if not n.startswith("_")}
    assert hf_names == {n for n in dir(TrainerCallback) if not n.startswith("_")}
    assert inspect.signature(CallbackHandler.__init__) == inspect.signature(hf.CallbackHandler.__init__)


def test_default_callbacks_do_nothing_on_every_event():
    callback = TrainerCallback()
    for event in EVENTS:
        extras = {"metrics": {}} if event == "on_predict" else {}
        assert getattr(callback, event)(None, TrainerState(), TrainerControl(), **extras) is None


def test_missing_default_flow_callback_warns(caplog):
    with caplog.at_level(logging.WARNING, logger=hf_api.__name__):
        CallbackHandler([PrinterCallback], None, None, None, None)
    assert "No DefaultFlowCallback among the callbacks" in caplog.text
    assert "PrinterCallback" in caplog.text


def test_transformers_default_flow_callback_counts(caplog):
    with caplog.at_level(logging.WARNING, logger=hf_api.__name__):
        CallbackHandler([_hf().DefaultFlowCallback()], None, None, None, None)
    assert caplog.text == ""


def test_add_pop_remove_like_hf(caplog):
    hf = _hf()
    printer_a, printer_b = PrinterCallback(), PrinterCallback()
    ours = CallbackHandler([DefaultFlowCallback, printer_a], None, None, None, None)
    theirs = hf.CallbackHandler([hf.DefaultFlowCallback, printer_a], None, None, None, None)
    for handler in (ours, theirs):
        with caplog.at_level(logging.WARNING, logger=hf_api.__name__):
            handler.add_callback(printer_b)
        assert handler.callbacks[-1] is printer_b
    assert "Adding a second PrinterCallback" in caplog.text
    assert ours.callback_list == theirs.callback_list == (
        "DefaultFlowCallback\nPrinterCallback\nPrinterCallback"
    )
    for handler in (ours, theirs):
        assert handler.pop_callback(PrinterCallback) is printer_a
        assert handler.pop_callback(printer_b) is printer_b
        assert handler.pop_callback(PrinterCallback) is None
        handler.add_callback(printer_a)
        handler.remove_callback(PrinterCallback)
        handler.remove_callback(PrinterCallback)  # nothing left to remove: ignored
    assert [type(cb).__name__ for cb in ours.callbacks] == ["DefaultFlowCallback"]
    with pytest.raises(ValueError, match="Cannot remove .*PrinterCallback.*: it is not among the callbacks"):
        ours.remove_callback(printer_a)
    ours.add_callback(printer_a)
    ours.remove_callback(printer_a)
    assert printer_a not in ours.callbacks


def test_class_is_instantiated_on_add():
    handler = CallbackHandler([DefaultFlowCallback], None, None, None, None)
    handler.add_callback(PrinterCallback)
    assert isinstance(handler.callbacks[-1], PrinterCallback)


def _recording(name, calls, events=("on_step_end",)):
    """A callback class overriding ``events`` only, each recording ``(name, event)`` into ``calls``."""

    def make(event):
        def method(self, args, state, control, **kwargs):
            calls.append((name, event))

        return method

    return type(name, (TrainerCallback,), {event: make(event) for event in events})()


def test_events_reach_callbacks_added_or_patched_after_first_dispatch():
    # The handler skips callbacks that do not override an event; that shortcut must follow the list as it changes.
    calls: list = []
    handler = CallbackHandler([DefaultFlowCallback(), _recording("a", calls)], None, None, None, None)
    args, state, control = object(), TrainerState(), TrainerControl()
    handler.on_step_begin(args, state, control)
    handler.on_step_end(args, state, control)
    assert calls == [("a", "on_step_end")]

    late = _recording("late", calls, events=("on_step_begin", "on_step_end"))
    handler.add_callback(late)
    handler.on_step_begin(args, state, control)
    handler.on_step_end(args, state, control)
    assert calls[1:] == [("late", "on_step_begin"), ("a", "on_step_end"), ("late", "on_step_end")]

    # An instance attribute counts as an override too.
    patched = TrainerCallback()
    patched.on_step_begin = lambda args, state, control, **kwargs: calls.append(("patched", "on_step_begin"))
    handler.callbacks.append(patched)
    handler.on_step_begin(args, state, control)
    assert calls[-2:] == [("late", "on_step_begin"), ("patched", "on_step_begin")]

    handler.remove_callback(late)
    calls.clear()
    handler.on_step_begin(args, state, control)
    handler.on_step_end(args, state, control)
    assert calls == [("patched", "on_step_begin"), ("a", "on_step_end")]


def test_skipping_no_op_callbacks_keeps_hf_resets_and_returns():
    # No callback overrides on_step_begin: the handler still clears the flags HF clears before the event.
    handler = CallbackHandler([DefaultFlowCallback()], None, None, None, None)
    control = TrainerControl(should_log=True, should_evaluate=True, should_save=True)
    control = handler.on_step_begin(object(), TrainerState(), control)
    assert (control.should_log, control.should_evaluate, control.should_save) == (False, False, False)

    replacement = TrainerControl(should_training_stop=True)

    class Replacer(TrainerCallback):
        def on_optimizer_step(self, args, state, control, **kwargs):
            return replacement

    handler.add_callback(Replacer)
    assert handler.on_optimizer_step(object(), TrainerState(), TrainerControl()) is replacement
