"""Contract of the Lightning callback hf_lightning adds: it pickles, and its ``state_dict`` round-trips."""

from __future__ import annotations

import json
import pickle

from hf_lightning import TrainingArguments
from hf_lightning.callbacks import EarlyStoppingCallback, HFFlowCallback


def _flow(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, disable_tqdm=True)
    return HFFlowCallback(args, callbacks=[EarlyStoppingCallback(early_stopping_patience=2)])


def test_flow_callback_pickles(tmp_path):
    flow = _flow(tmp_path)
    flow.state.log_history.append({"loss": 1.0, "step": 1})
    clone = pickle.loads(pickle.dumps(flow))
    assert [type(cb).__name__ for cb in clone.handler.callbacks] == [type(cb).__name__ for cb in flow.handler.callbacks]
    assert clone.state.log_history == flow.state.log_history
    # The helpers share the clone's state, not the original's.
    assert clone.logbook.events is clone.events and clone.evaluation.events is clone.events
    clone.hf_log({"loss": 2.0})
    assert clone.state.log_history[-1]["loss"] == 2.0 and len(flow.state.log_history) == 1


def test_flow_callback_state_dict_round_trips(tmp_path):
    """Lightning stores ``state_dict()`` in its ``.ckpt`` files and hands it back to ``load_state_dict`` on restore.

    The entry is HF's state for reference: a Lightning ``.ckpt`` restore leaves the run's own state as it is (HF's
    state resumes from ``checkpoint-N`` folders, through ``CheckpointResume``).
    """
    flow = _flow(tmp_path)
    flow.state.global_step = 5
    flow.state.log_history.append({"loss": 1.0, "step": 5})
    saved = flow.state_dict()
    assert json.loads(json.dumps(saved)) == saved
    assert saved["trainer_state"]["global_step"] == 5
    fresh = _flow(tmp_path)
    fresh.load_state_dict(pickle.loads(pickle.dumps(saved)))
    assert fresh.state.global_step == 0
    flow.load_state_dict(saved)
    assert flow.state_dict() == saved
