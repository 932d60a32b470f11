"""hyperparameter_search(backend="ray"): the same Ray Tune search through transformers.Trainer and hf_lightning.Trainer.

Two levels:

- in this process, with a stand-in for ``ray.tune`` that runs each trial function here (the trainer goes through a
  cloudpickle round trip, as through Ray's object store): the plumbing both trainers share with Ray — what is
  reported after each evaluation, the checkpoints handed to Ray, the run folders, the final evaluation of a trial
  that never evaluated, the resume from a Ray checkpoint, the best run — compared with HF's, in the default suite;
- through a real local Ray cluster (worker processes), slow mode.

Both use a tiny BERT built from a config with dropout on.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib
import importlib.machinery
import itertools
import json
import math
import os
import shutil
import sys
import types

import pytest
import torch

from tests.helpers.models import classification_data
from tests.helpers.parity import assert_log_history_equal

RAY_MISSING = "ray[tune] is not installed (it is in the `test` extra: pip install 'ray[tune]')"
# Files only hf_lightning writes in a checkpoint folder (the arguments as JSON, for weights-only resume).
OURS_ONLY = {"training_args.json"}


@pytest.fixture(autouse=True)
def _no_full_gc(monkeypatch):
    """Both searches run ``gc.collect()`` after trials; in a test process holding transformers it takes ~0.5 s."""
    monkeypatch.setattr(gc, "collect", lambda *args: 0)


def model_init(trial=None):
    """A tiny BERT classifier with dropout on; its weights come from the seed train() sets before model_init."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                        vocab_size=64, max_position_embeddings=16, num_labels=3, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.1)
    return BertForSequenceClassification(config)


def _trainer(lib, output_dir, **overrides):
    args = dict(output_dir=str(output_dir), report_to="none", use_cpu=True, disable_tqdm=True, seed=42,
                num_train_epochs=2, per_device_train_batch_size=4, logging_steps=1, eval_strategy="steps",
                eval_steps=3, save_strategy="steps", save_steps=3)
    args.update(overrides)
    return lib.Trainer(args=lib.TrainingArguments(**args), model_init=model_init,
                       train_dataset=classification_data(n=12, seq_len=8), eval_dataset=classification_data(n=6,
                       seq_len=8, seed=9))


def _lib(kind):
    if kind == "hf":
        import transformers
        from accelerate.state import GradientState

        # An earlier in-process HF run leaves weak references to its loaders in accelerate's shared state, which the
        # next trainer's pickle would meet (in a real Ray search the trials train in other processes).
        GradientState._reset_state()
        return transformers
    import hf_lightning

    return hf_lightning


def _tree(folder):
    """``{relative path: sorted file names}`` of every folder under ``folder`` (hf_lightning-only files dropped)."""
    return {os.path.relpath(root, folder): sorted(set(files) - OURS_ONLY) for root, _, files in os.walk(folder)}


# ---------------------------------------------------------------------------------------------- in-process Ray
def _cloudpickle():
    """What Ray's object store pickles with: the standalone package when installed (quicker to import), else Ray's
    own copy."""
    for name in ("cloudpickle", "ray.cloudpickle"):
        with contextlib.suppress(ImportError):
            return importlib.import_module(name)
    return None


class _FakeCheckpoint:
    def __init__(self, path):
        self.path = path

    @classmethod
    def from_directory(cls, path):
        return cls(path)

    @contextlib.contextmanager
    def as_directory(self):
        yield self.path


class _FakeTrial:
    def __init__(self, trial_id, config):
        self.trial_id, self.config, self.last_result, self.reports = trial_id, config, None, []


class _FakeTune(types.ModuleType):
    """Just enough of ``ray.tune`` to run a search's trial function in this process.

    ``tune.grid_search`` values expand as Ray expands them; ``report`` keeps each result and copies the checkpoint
    folder away (as Ray does into its storage); ``restore`` maps a trial id to the checkpoint it restarts from.
    """

    def __init__(self, storage, restore=None):
        super().__init__("ray.tune")
        self.storage, self.restore, self.trials, self._current = storage, restore or {}, [], None
        self.Checkpoint, self.CLIReporter = _FakeCheckpoint, lambda **kwargs: ("CLIReporter", kwargs)

    @staticmethod
    def grid_search(values):
        return {"grid_search": list(values)}

    def with_parameters(self, fn, **kwargs):
        cloudpickle = _cloudpickle()
        stored = cloudpickle.dumps(kwargs)  # what the object store would hold
        return lambda config: fn(config, **cloudpickle.loads(stored))

    def get_context(self):
        return types.SimpleNamespace(get_trial_id=lambda: self._current.trial_id)

    def get_checkpoint(self):
        return self.restore.get(self._current.trial_id)

    def report(self, metrics, checkpoint=None):
        files = None
        if checkpoint is not None:
            kept = os.path.join(self.storage, self._current.trial_id, f"checkpoint_{len(self._current.reports):06d}")
            shutil.copytree(checkpoint.path, kept)
            files = _tree(kept)
        self._current.reports.append((copy.deepcopy(metrics), files))
        self._current.last_result = metrics

    def run(self, trainable, config, num_samples, **kwargs):
        self.run_arguments = dict(config=config, num_samples=num_samples, **kwargs)
        grid = {k: v["grid_search"] for k, v in config.items() if isinstance(v, dict) and "grid_search" in v}
        for i, values in enumerate(itertools.product(*grid.values())):
            self._current = _FakeTrial(f"fake_{i:05d}", {**config, **dict(zip(grid, values))})
            self.trials.append(self._current)
            trainable(dict(self._current.config))
        return self

    def get_best_trial(self, metric, mode, scope):
        assert (metric, scope) == ("objective", "last")
        pick = min if mode == "min" else max
        return pick(self.trials, key=lambda t: t.last_result[metric])


@pytest.fixture
def fake_ray(monkeypatch):
    if _cloudpickle() is None:
        pytest.skip(RAY_MISSING)

    def install(storage, restore=None):
        tune = _FakeTune(str(storage), restore)
        ray = types.ModuleType("ray")
        ray.tune, ray.is_initialized = tune, lambda: True
        # Seen as installed by importlib.util.find_spec (transformers' availability check).
        ray.__spec__ = importlib.machinery.ModuleSpec("ray", None, is_package=True)
        tune.__spec__ = importlib.machinery.ModuleSpec("ray.tune", None, is_package=True)
        monkeypatch.setitem(sys.modules, "ray", ray)
        monkeypatch.setitem(sys.modules, "ray.tune", tune)
        return tune

    return install


def _fake_search(kind, tmp_path, fake_ray, restore=None, args=None, hp_space=None):
    tune = fake_ray(tmp_path / f"ray-{kind}", restore)
    trainer = _trainer(_lib(kind), tmp_path / kind, **(args or {}))
    space = hp_space or {"learning_rate": _FakeTune.grid_search([1e-3, 3e-2])}
    best = trainer.hyperparameter_search(backend="ray", hp_space=lambda trial: space, n_trials=1)
    return trainer, best, tune


def _assert_same_reports(hf_trials, trials):
    assert [t.trial_id for t in trials] == [t.trial_id for t in hf_trials]
    for hf_trial, trial in zip(hf_trials, trials):
        assert trial.config == hf_trial.config
        assert len(trial.reports) == len(hf_trial.reports) > 0
        for (hf_metrics, hf_files), (metrics, files) in zip(hf_trial.reports, trial.reports):
            assert list(metrics) == list(hf_metrics)
            for key in ("eval_loss", "objective", "epoch", "done"):
                assert metrics.get(key) == hf_metrics.get(key), key  # bit-identical
            assert files == hf_files


def test_ray_plumbing_matches_hf(tmp_path, fake_ray):
    """Two grid trials evaluating and saving at step 3 and at the end: the same reports (objective bit-identical),
    the same checkpoints handed to Ray, the same run folders and trial state, the same best run; a third run
    restarts trial 1 from its first Ray checkpoint and ends where the uninterrupted trial ended."""
    hf_trainer, hf_best, hf_tune = _fake_search("hf", tmp_path, fake_ray)
    trainer, best, tune = _fake_search("ours", tmp_path, fake_ray)

    _assert_same_reports(hf_tune.trials, tune.trials)
    assert tune.run_arguments == hf_tune.run_arguments
    assert tune.run_arguments["resources_per_trial"] == {"cpu": 1}
    assert tune.run_arguments["progress_reporter"] == ("CLIReporter", {"metric_columns": ["objective"]})
    assert [files is not None for _, files in tune.trials[0].reports] == [True, True]
    assert tune.trials[0].reports[0][1] == {
        ".": [],
        "checkpoint-3": ["config.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json",
                         "training_args.bin"]}
    assert (best.run_id, best.objective, best.hyperparameters) == (hf_best.run_id, hf_best.objective,
                                                                   hf_best.hyperparameters)
    assert best.run_summary is tune
    assert trainer.model is None and hf_trainer.model is None and trainer.hp_search_backend is None
    # The driver's trainer never trained: the trials ran on copies, so its arguments are the search's own.
    assert trainer.args.learning_rate == hf_trainer.args.learning_rate == 5e-5

    assert _tree(trainer.args.output_dir) == _tree(hf_trainer.args.output_dir)
    assert sorted(os.listdir(trainer.args.output_dir)) == ["run-fake_00000", "run-fake_00001"]
    for run in ("run-fake_00000", "run-fake_00001"):
        with open(os.path.join(hf_trainer.args.output_dir, run, "checkpoint-6", "trainer_state.json")) as f:
            hf_state = json.load(f)
        with open(os.path.join(trainer.args.output_dir, run, "checkpoint-6", "trainer_state.json")) as f:
            state = json.load(f)
        for key in ("is_hyper_param_search", "trial_name", "trial_params", "global_step", "best_metric"):
            assert state[key] == hf_state[key], key
        assert state["trial_params"]["learning_rate"] in (1e-3, 3e-2)
        assert_log_history_equal(hf_state["log_history"], state["log_history"], ordered=False)

    # Ray restarts trial 1 from the checkpoint it reported at step 3 (no RNG state in it, as in HF's).
    space = {"learning_rate": 3e-2}
    restore = {"fake_00000": _FakeCheckpoint(os.path.join(tune.storage, "fake_00001", "checkpoint_000000"))}
    _, _, resumed = _fake_search("resumed", tmp_path, fake_ray, restore=restore, hp_space=space)
    restore = {"fake_00000": _FakeCheckpoint(os.path.join(hf_tune.storage, "fake_00001", "checkpoint_000000"))}
    _, _, hf_resumed = _fake_search("hf", tmp_path / "again", fake_ray, restore=restore, hp_space=space)
    _assert_same_reports(hf_resumed.trials, resumed.trials)
    # Only the step-6 evaluation is reported after the resume.
    assert [m["epoch"] for m, _ in resumed.trials[0].reports] == [2.0]


def test_ray_final_evaluation_matches_hf(tmp_path, fake_ray):
    """No evaluation during training: each trial is evaluated once at the end and reported with ``done`` and a
    checkpoint; ``hp_name`` names the run folders and gets the trial's config; ``maximize`` picks the other run."""
    args = dict(eval_strategy="no", save_strategy="epoch")
    runs = {}
    space = {"learning_rate": _FakeTune.grid_search([1e-3, 3e-2])}
    for kind in ("hf", "ours"):
        tune = fake_ray(tmp_path / f"ray-{kind}")
        trainer = _trainer(_lib(kind), tmp_path / kind, **args)
        best = trainer.hyperparameter_search(backend="ray", hp_space=lambda trial: space, n_trials=1,
                                             direction="maximize",
                                             hp_name=lambda config: f"lr_{config['learning_rate']}")
        runs[kind] = (trainer, best, tune)
    (hf_trainer, hf_best, hf_tune), (trainer, best, tune) = runs["hf"], runs["ours"]
    _assert_same_reports(hf_tune.trials, tune.trials)
    assert [m["done"] for m, _ in tune.trials[0].reports] == [True]
    assert (best.run_id, best.objective) == (hf_best.run_id, hf_best.objective)
    assert _tree(trainer.args.output_dir) == _tree(hf_trainer.args.output_dir)
    assert sorted(os.listdir(trainer.args.output_dir)) == ["lr_0.001", "lr_0.03"]


def test_ray_bad_input_before_work(tmp_path, fake_ray):
    """A scheduler that needs intermediate results without evaluation (HF's rule) and several directions fail before
    any trial, naming the fix."""
    tune = fake_ray(tmp_path / "ray")
    trainer = _trainer(_lib("ours"), tmp_path / "ours", eval_strategy="no")
    # Ray's ASHAScheduler is AsyncHyperBandScheduler; a subclass is refused too.
    scheduler = type("MyASHA", (type("AsyncHyperBandScheduler", (), {}),), {})()
    with pytest.raises(RuntimeError, match=r"MyASHA as a scheduler.*`do_eval=True` and `eval_strategy='steps'`"):
        trainer.hyperparameter_search(backend="ray", hp_space=lambda trial: {}, scheduler=scheduler)
    with pytest.raises(ValueError, match=r"Ray Tune optimises one objective; pass direction='minimize' or "):
        trainer.hyperparameter_search(backend="ray", hp_space=lambda trial: {}, direction=["minimize", "maximize"])
    assert tune.trials == [] and os.listdir(trainer.args.output_dir) == []


def test_default_backend_is_ray_without_optuna(monkeypatch):
    """HF's order: Optuna when installed, else Ray Tune."""
    from hf_lightning.trainer import hp_search

    monkeypatch.setattr(hp_search, "_is_installed", lambda package: package == "ray")
    assert hp_search.resolve_backend(None) is hp_search.HPSearchBackend.RAY


# ---------------------------------------------------------------------------------------------- a real Ray cluster
@pytest.fixture
def local_ray(monkeypatch):
    """A one-CPU local Ray (trials run one at a time, in worker processes), offline, with deterministic trial ids;
    the workers import this worktree (PYTHONPATH) and take this module's functions by value."""
    ray = pytest.importorskip("ray", reason=RAY_MISSING)
    import ray.cloudpickle

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("_TEST_TUNE_TRIAL_UUID", "trial")
    monkeypatch.setenv("RAY_AIR_NEW_OUTPUT", "0")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get(
                 "PYTHONPATH")])), "OMP_NUM_THREADS": "1"}})
    try:
        yield ray
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


class _FailOnce:
    """Raises once at step 4 of the trial with ``learning_rate=3e-2`` (a file marks that it did, across Ray's
    worker processes), so Ray restarts that trial from the checkpoint it reported at step 3."""

    def __init__(self, lib, marker):
        self.callback = type("FailOnce", (lib.TrainerCallback,), {"on_step_end": self.on_step_end})()
        self.marker = marker

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 4 and args.learning_rate == 3e-2 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise RuntimeError("a trial failure Ray retries")


def _ray_search(kind, tmp_path):
    from ray import tune

    lib = _lib(kind)
    trainer = _trainer(lib, tmp_path / kind)
    trainer.add_callback(_FailOnce(lib, str(tmp_path / f"failed-{kind}")).callback)
    space = {"learning_rate": tune.grid_search([1e-3, 3e-2]), "seed": 7}
    best = trainer.hyperparameter_search(backend="ray", hp_space=lambda trial: space, n_trials=1,
                                         storage_path=str(tmp_path / f"ray-{kind}"), name="search",
                                         reuse_actors=True, verbose=0, max_failures=1)
    results = {}
    for trial in sorted(best.run_summary.trials, key=lambda t: t.trial_id):
        with open(os.path.join(trial.path, "result.json")) as f:
            rows = [json.loads(line) for line in f]
        checkpoints = sorted(name for name in os.listdir(trial.path) if name.startswith("checkpoint_"))
        results[trial.trial_id] = (trial.config, rows, {c: _tree(os.path.join(trial.path, c)) for c in checkpoints},
                                   trial.num_failures)
    return trainer, best, results


@pytest.mark.slow
def test_ray_search_matches_hf(tmp_path, local_ray):
    """Through a real local Ray: the same trials, reported results (objective bit-identical), Ray checkpoints,
    best run, run folders and trial state as transformers.Trainer's search; the second trial fails once at step 4
    and Ray resumes it from its step-3 checkpoint in a new worker."""
    hf_trainer, hf_best, hf_results = _ray_search("hf", tmp_path)
    trainer, best, results = _ray_search("ours", tmp_path)

    assert list(results) == list(hf_results) == ["trial_00000", "trial_00001"]
    for trial_id, (config, rows, checkpoints, failures) in results.items():
        hf_config, hf_rows, hf_checkpoints, hf_failures = hf_results[trial_id]
        assert config == hf_config and checkpoints == hf_checkpoints
        assert failures == hf_failures == (1 if trial_id == "trial_00001" else 0)
        assert [r["training_iteration"] for r in rows] == [1, 2]
        assert [r["epoch"] for r in rows] == [1.0, 2.0]
        for row, hf_row in zip(rows, hf_rows, strict=True):
            assert {k for k in row if k.startswith("eval_")} == {k for k in hf_row if k.startswith("eval_")}
            for key in ("eval_loss", "objective", "epoch"):
                assert row[key] == hf_row[key], (trial_id, key)
    assert (best.run_id, best.objective, best.hyperparameters) == (hf_best.run_id, hf_best.objective,
                                                                   hf_best.hyperparameters)
    assert trainer.model is None and trainer.hp_search_backend is None
    assert _tree(trainer.args.output_dir) == _tree(hf_trainer.args.output_dir)
    assert sorted(os.listdir(trainer.args.output_dir)) == ["run-trial_00000", "run-trial_00001"]
    for run in ("run-trial_00000", "run-trial_00001"):
        states = []
        for output_dir in (hf_trainer.args.output_dir, trainer.args.output_dir):
            with open(os.path.join(output_dir, run, "checkpoint-6", "trainer_state.json")) as f:
                states.append(json.load(f))
        for key in ("is_hyper_param_search", "trial_name", "trial_params", "global_step", "train_batch_size"):
            assert states[1][key] == states[0][key], key
        assert states[1]["trial_params"]["seed"] == 7
        assert_log_history_equal(states[0]["log_history"], states[1]["log_history"], ordered=False)


@pytest.mark.slow
def test_default_hp_space_matches_hf():
    pytest.importorskip("ray.tune", reason=RAY_MISSING)
    from transformers.trainer_utils import default_hp_space_ray as hf_space

    from hf_lightning.trainer.hp_search_ray import default_hp_space_ray

    def describe(domain):
        return (type(domain).__name__, type(domain.sampler).__name__, getattr(domain, "lower", None),
                getattr(domain, "upper", None), getattr(domain, "categories", None))

    ours, hf = default_hp_space_ray(None), hf_space(None)
    assert {k: describe(v) for k, v in ours.items()} == {k: describe(v) for k, v in hf.items()}
    assert list(ours) == list(hf)

