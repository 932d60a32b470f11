"""TrainerState / TrainerControl / ExportableState against transformers' own classes."""

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_lightning.callbacks.hf_api import EarlyStoppingCallback
from hf_lightning.state import ExportableState, TrainerControl, TrainerState, is_exportable_state

GOLDEN_STATE = Path("/work/shared/reference/golden/trainer_state.json")


def _hf():
    from transformers import trainer_callback

    return trainer_callback


STATE_VALUES = [
    {},
    {"epoch": 1.5, "global_step": 12, "max_steps": 16, "logging_steps": 2, "eval_steps": 4, "save_steps": 4},
    {
        "epoch": 0.3333333333333333,
        "global_step": 3,
        "max_steps": 9,
        "train_batch_size": 8,
        "num_train_epochs": 3,
        "num_input_tokens_seen": 1234,
        "total_flos": 312999936.0,
        "log_history": [
            {"loss": 4.32, "grad_norm": 0.97, "learning_rate": 4.6875e-05, "epoch": 0.25, "step": 2},
            {"eval_loss": float("nan"), "eval_runtime": 0.01, "epoch": 0.25, "step": 2, "note": "é"},
        ],
        "best_metric": 4.334794998168945,
        "best_global_step": 2,
        "best_model_checkpoint": "out/checkpoint-2",
        "is_local_process_zero": False,
        "is_world_process_zero": False,
        "is_hyper_param_search": True,
        "trial_name": "trial-0",
        "trial_params": {"learning_rate": 0.001, "warmup": 3, "fused": True, "name": "x"},
    },
    {"epoch": 2, "logging_steps": 0.5, "stateful_callbacks": {"Custom": {"args": {}, "attributes": {"n": 1}}}},
]


@pytest.mark.parametrize("values", STATE_VALUES)
def test_save_to_json_is_byte_identical_to_hf(tmp_path, values):
    ours, theirs = tmp_path / "ours.json", tmp_path / "hf.json"
    TrainerState(**values).save_to_json(ours)
    _hf().TrainerState(**values).save_to_json(theirs)
    assert ours.read_bytes() == theirs.read_bytes()


@dataclasses.dataclass
class _Point:
    x: int = 1
    tags: tuple = ("a", "b")


def test_save_to_json_writes_nested_values_as_hf(tmp_path):
    # Entries a user's callback may append to log_history: tuples, nested dicts, a dataclass (asdict's territory).
    history = [{"step": 1, "pair": (1, 2.5), "nested": {"k": [1, {"z": None}]}, "point": _Point(), "x": float("inf")}]
    ours, theirs = tmp_path / "ours.json", tmp_path / "hf.json"
    TrainerState(log_history=history).save_to_json(ours)
    _hf().TrainerState(log_history=history).save_to_json(theirs)
    assert ours.read_bytes() == theirs.read_bytes()
    assert json.loads(ours.read_text())["log_history"][0]["point"] == {"x": 1, "tags": ["a", "b"]}


def test_save_to_json_rejects_unserializable_value_as_hf(tmp_path):
    path = tmp_path / "trainer_state.json"
    with pytest.raises(TypeError, match="Object of type object is not JSON serializable"):
        TrainerState(log_history=[{"step": 1, "bad": object()}]).save_to_json(path)
    with pytest.raises(TypeError, match="Object of type object is not JSON serializable"):
        _hf().TrainerState(log_history=[{"step": 1, "bad": object()}]).save_to_json(tmp_path / "hf.json")
    assert not path.exists()


def test_stateful_callbacks_list_is_exported_like_hf(tmp_path):
    hf = _hf()
    ours = TrainerState(
        stateful_callbacks=[
            TrainerControl(should_save=True),
            EarlyStoppingCallback(3, 0.5),
            EarlyStoppingCallback(2),
        ]
    )
    theirs = hf.TrainerState(
        stateful_callbacks=[
            hf.TrainerControl(should_save=True),
            hf.EarlyStoppingCallback(3, 0.5),
            hf.EarlyStoppingCallback(2),
        ]
    )
    assert ours.stateful_callbacks == theirs.stateful_callbacks
    assert isinstance(ours.stateful_callbacks["EarlyStoppingCallback"], list)
    ours.save_to_json(tmp_path / "ours.json")
    theirs.save_to_json(tmp_path / "hf.json")
    assert (tmp_path / "ours.json").read_bytes() == (tmp_path / "hf.json").read_bytes()


def test_stateful_callbacks_accepts_transformers_exportable_callbacks():
    hf = _hf()
    callback = hf.EarlyStoppingCallback(4, 0.1)
    callback.early_stopping_patience_counter = 2
    state = TrainerState(stateful_callbacks=[callback, hf.TrainerControl()])
    assert state.stateful_callbacks["EarlyStoppingCallback"] == callback.state()
    assert state.stateful_callbacks["TrainerControl"] == hf.TrainerControl().state()


def test_stateful_callbacks_rejects_non_exportable():
    with pytest.raises(TypeError, match="inherit `ExportableState`; got object"):
        TrainerState(stateful_callbacks=[object()])


def test_golden_trainer_state_round_trips_byte_for_byte(tmp_path):
    state = TrainerState.load_from_json(GOLDEN_STATE)
    assert state.global_step == 16
    assert state.stateful_callbacks["TrainerControl"]["args"]["should_save"] is True
    state.save_to_json(tmp_path / "trainer_state.json")
    assert (tmp_path / "trainer_state.json").read_bytes() == GOLDEN_STATE.read_bytes()


def test_loaded_state_equals_hf_loaded_state():
    ours = TrainerState.load_from_json(GOLDEN_STATE)
    theirs = _hf().TrainerState.load_from_json(GOLDEN_STATE)
    assert dataclasses.asdict(ours) == dataclasses.asdict(theirs)


def test_hf_reads_what_we_write(tmp_path):
    path = tmp_path / "trainer_state.json"
    TrainerState(**STATE_VALUES[1]).save_to_json(path)
    theirs = _hf().TrainerState.load_from_json(path)
    assert dataclasses.asdict(theirs) == dataclasses.asdict(TrainerState(**STATE_VALUES[1]))


def test_field_names_order_and_defaults_match_hf():
    ours = [(f.name, f.default) for f in dataclasses.fields(TrainerState)]
    theirs = [(f.name, f.default) for f in dataclasses.fields(_hf().TrainerState)]
    assert ours == theirs
    assert dataclasses.asdict(TrainerState()) == dataclasses.asdict(_hf().TrainerState())


def test_load_from_json_rejects_unknown_keys(tmp_path):
    path = tmp_path / "trainer_state.json"
    shutil.copy(GOLDEN_STATE, path)
    data = json.loads(path.read_text())
    data["made_up"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(TypeError, match=r"not TrainerState fields: \['made_up'\]"):
        TrainerState.load_from_json(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [("{not json", "is not valid JSON"), ("[1, 2]", "must hold a JSON object of TrainerState fields, got list")],
)
def test_load_from_json_rejects_bad_content(tmp_path, text, message):
    path = tmp_path / "trainer_state.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        TrainerState.load_from_json(path)


STEP_VALUES = [None, 0.0, 0.01, 0.1, 0.25, 0.333, 0.5, 0.999, 1, 2, 7, 10, 500]
MAX_STEPS = [0, 1, 7, 16, 99, 1000]


@pytest.mark.parametrize("max_steps", MAX_STEPS)
def test_compute_steps_matches_hf_on_a_grid(max_steps):
    hf = _hf()
    for logging_steps in STEP_VALUES:
        for eval_steps in STEP_VALUES:
            for save_steps in (None, 0.2, 4):
                args = SimpleNamespace(logging_steps=logging_steps, eval_steps=eval_steps, save_steps=save_steps)
                ours, theirs = TrainerState(), hf.TrainerState()
                ours.compute_steps(args, max_steps)
                theirs.compute_steps(args, max_steps)
                assert (ours.logging_steps, ours.eval_steps, ours.save_steps) == (
                    theirs.logging_steps,
                    theirs.eval_steps,
                    theirs.save_steps,
                ), (args, max_steps)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"logging_steps": 0.1, "eval_strategy": "steps", "eval_steps": 0.25, "save_steps": 0.5},
        {"logging_steps": 3, "eval_strategy": "no", "save_steps": 7},
        {"logging_steps": 2, "eval_strategy": "steps", "save_steps": 0.05},
    ],
)
def test_compute_steps_matches_hf_with_real_training_arguments(tmp_path, kwargs):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs)
    ours, theirs = TrainerState(), _hf().TrainerState()
    ours.compute_steps(args, 16)
    theirs.compute_steps(args, 16)
    assert dataclasses.asdict(ours) == dataclasses.asdict(theirs)


class _FakeTrainer:
    def __init__(self, local_zero, world_zero, hp_name=None, trial=None):
        self._local_zero = local_zero
        self._world_zero = world_zero
        self.hp_name = hp_name
        self._trial = trial

    def is_local_process_zero(self):
        return self._local_zero

    def is_world_process_zero(self):
        return self._world_zero


@pytest.mark.parametrize(
    "trainer",
    [
        _FakeTrainer(True, True),
        _FakeTrainer(True, False),
        _FakeTrainer(False, False, hp_name=lambda trial: f"run-{trial['id']}", trial={"id": 7}),
    ],
)
def test_init_training_references_matches_hf_with_a_trainer(trainer):
    ours, theirs = TrainerState(trial_params={"old": 1}), _hf().TrainerState(trial_params={"old": 1})
    ours.init_training_references(trainer, 12, 3, None)
    theirs.init_training_references(trainer, 12, 3, None)
    assert dataclasses.asdict(ours) == dataclasses.asdict(theirs)


def test_init_training_references_without_a_trainer():
    state = TrainerState()
    state.init_training_references(
        max_steps=8, num_train_epochs=2, trial={"lr": 0.1}, is_local_process_zero=True, is_world_process_zero=False
    )
    assert (state.max_steps, state.num_train_epochs) == (8, 2)
    assert state.trial_params == {"lr": 0.1}
    assert (state.is_local_process_zero, state.is_world_process_zero) == (True, False)
    state.init_training_references(None, 8, 2, SimpleNamespace(params={"wd": 0.0}))
    assert state.trial_params == {"wd": 0.0}


def test_init_training_references_rejects_unknown_trial():
    with pytest.raises(TypeError, match="Unknown type for trial int"):
        TrainerState().init_training_references(None, 8, 2, 3)


CONTROL_RESETS = ["_new_training", "_new_epoch", "_new_step"]


@pytest.mark.parametrize("reset", CONTROL_RESETS)
def test_control_resets_match_hf(reset):
    all_true = dict.fromkeys(
        ["should_training_stop", "should_epoch_stop", "should_save", "should_evaluate", "should_log"], True
    )
    ours, theirs = TrainerControl(**all_true), _hf().TrainerControl(**all_true)
    getattr(ours, reset)()
    getattr(theirs, reset)()
    assert ours.state() == theirs.state()


def test_control_state_round_trips_through_from_state():
    control = TrainerControl(should_save=True, should_training_stop=True)
    assert control.state() == _hf().TrainerControl(should_save=True, should_training_stop=True).state()
    assert TrainerControl.from_state(control.state()) == control


def test_exportable_state_requires_state_method():
    class NoState(ExportableState):
        pass

    with pytest.raises(NotImplementedError, match="NoState must implement `state\\(\\)`"):
        NoState().state()


def test_from_state_sets_args_and_attributes():
    class Counter(ExportableState):
        def __init__(self, step=1):
            self.step = step
            self.count = 0

        def state(self):
            return {"args": {"step": self.step}, "attributes": {"count": self.count}}

    rebuilt = Counter.from_state({"args": {"step": 3}, "attributes": {"count": 5}})
    assert (rebuilt.step, rebuilt.count) == (3, 5)


def test_is_exportable_state():
    hf = _hf()
    assert is_exportable_state(TrainerControl())
    assert is_exportable_state(hf.EarlyStoppingCallback())
    assert not is_exportable_state(hf.PrinterCallback())
    assert not is_exportable_state(object())


PURE_MODULES = [
    "hf_lightning/state.py",
    "hf_lightning/flow.py",
    "hf_lightning/callbacks/hf_api.py",
    "hf_lightning/outputs.py",
    "hf_lightning/checkpointing/paths.py",
    "hf_lightning/seed.py",
]
FORBIDDEN_IMPORTS = {"lightning", "pytorch_lightning", "transformers", "accelerate", "datasets"}


@pytest.mark.parametrize("relative_path", PURE_MODULES)
def test_module_imports_no_lightning_nor_transformers(relative_path):
    import ast

    source = Path(__file__).resolve().parents[2] / relative_path
    imported = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert not imported & FORBIDDEN_IMPORTS
