"""PrinterCallback and ProgressCallback print what transformers' print, from the same events."""

from types import SimpleNamespace

import pytest

from hf_lightning.callbacks.hf_api import PrinterCallback, ProgressCallback
from hf_lightning.state import TrainerControl, TrainerState


def _hf():
    from transformers import trainer_callback

    return trainer_callback


def _logs():
    return {"loss": 0.123456789, "grad_norm": 2.0, "epoch": 1, "total_flos": 1.5e12, "note": "x" * 150, "ok": "short"}


@pytest.mark.parametrize("local_zero", [True, False])
def test_printer_output_and_total_flos_pop_match_hf(capsys, local_zero):
    outputs, remaining = [], []
    for callback in (PrinterCallback(), _hf().PrinterCallback()):
        logs = _logs()
        callback.on_log(None, TrainerState(is_local_process_zero=local_zero), TrainerControl(), logs=logs)
        outputs.append(capsys.readouterr().out)
        remaining.append(logs)
    assert outputs[0] == outputs[1]
    assert remaining[0] == remaining[1]
    assert "total_flos" not in remaining[0]
    assert ("0.1235" in outputs[0]) is local_zero


def _drive_progress(callback, world_zero, max_steps=5, eval_batches=3):
    """Run a short training with one evaluation; return what the bars looked like along the way."""
    state = TrainerState(max_steps=max_steps, is_world_process_zero=world_zero)
    args, control = None, TrainerControl()
    seen = {}
    callback.on_train_begin(args, state, control)
    for step in range(1, max_steps + 1):
        state.global_step = step
        callback.on_step_end(args, state, control)
    callback.on_log(args, state, control, logs=_logs())
    eval_loader = list(range(eval_batches))
    for _ in eval_loader:
        callback.on_prediction_step(args, state, control, eval_dataloader=eval_loader)
    if world_zero:
        seen["train"] = (callback.training_bar.total, callback.training_bar.n)
        seen["eval"] = (callback.prediction_bar.total, callback.prediction_bar.n, callback.prediction_bar.leave)
    callback.on_evaluate(args, state, control, metrics={})
    seen["eval_bar_after"] = callback.prediction_bar
    callback.on_train_end(args, state, control)
    seen["train_bar_after"] = callback.training_bar
    return seen


@pytest.mark.parametrize("world_zero", [True, False])
def test_progress_bars_and_log_lines_match_hf(capsys, world_zero):
    ours = _drive_progress(ProgressCallback(), world_zero)
    ours_out = capsys.readouterr().out
    theirs = _drive_progress(_hf().ProgressCallback(), world_zero)
    theirs_out = capsys.readouterr().out
    assert ours == theirs
    assert ours_out == theirs_out
    if world_zero:
        assert ours["train"] == (5, 5)
        assert ours["eval"] == (3, 3, False)
        assert "String too long to display, length: 150 > 100" in ours_out
        assert "total_flos" not in ours_out


def test_progress_leaves_shared_logs_untouched():
    callback = ProgressCallback()
    state, control = TrainerState(max_steps=2), TrainerControl()
    callback.on_train_begin(None, state, control)
    logs = _logs()
    callback.on_log(None, state, control, logs=logs)
    callback.on_train_end(None, state, control)
    assert logs == _logs()


def test_progress_standalone_evaluation_keeps_its_bar_and_prints_nothing(capsys):
    state, control = TrainerState(), TrainerControl()
    for callback in (ProgressCallback(), _hf().ProgressCallback()):
        callback.on_prediction_step(None, state, control, eval_dataloader=[0, 1])
        assert callback.prediction_bar.leave is True
        callback.on_log(None, state, control, logs={"eval_loss": 1.0})
        callback.on_predict(None, state, control, metrics={})
        assert callback.prediction_bar is None
    assert capsys.readouterr().out == ""


def test_progress_ignores_unsized_eval_loaders():
    callback = ProgressCallback()
    callback.on_prediction_step(None, TrainerState(), TrainerControl(), eval_dataloader=iter([1, 2]))
    callback.on_prediction_step(None, TrainerState(), TrainerControl(), eval_dataloader=SimpleNamespace())
    assert callback.prediction_bar is None


def test_progress_max_str_len_is_configurable(capsys):
    callback = ProgressCallback(max_str_len=3)
    state, control = TrainerState(max_steps=1), TrainerControl()
    callback.on_train_begin(None, state, control)
    callback.on_log(None, state, control, logs={"note": "abcd"})
    callback.on_train_end(None, state, control)
    assert "length: 4 > 3" in capsys.readouterr().out
