"""hyperparameter_search: the same Optuna search through transformers.Trainer and hf_lightning.Trainer."""

from __future__ import annotations

import gc
import json
import math
import os

import pytest
import torch

from tests.helpers.models import RegressionModel, regression_data
from tests.helpers.parity import assert_log_history_equal
from tests.helpers.recorder import EventRecorder

OPTUNA_MISSING = "optuna is not installed (it is in the `test` extra: pip install optuna)"


@pytest.fixture(autouse=True)
def _no_full_gc(monkeypatch):
    """Both searches run ``gc.collect()`` between trials; in a test process holding transformers it takes ~0.5 s
    a call and changes no result."""
    monkeypatch.setattr(gc, "collect", lambda *args: 0)


def _model_init():
    """Weights drawn from the global RNG, so the seed train() sets before model_init matters (HF's order)."""
    model = RegressionModel()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


def _hp_space(trial):
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-3, 1e-1, log=True),
        "seed": trial.suggest_int("seed", 1, 40),
        "per_device_train_batch_size": trial.suggest_categorical("per_device_train_batch_size", [2, 4]),
    }


class _PruneOddTrials:
    """An Optuna pruner (duck-typed) that stops every odd-numbered trial at its first report."""

    def prune(self, study, trial):
        return trial.number % 2 == 1


def _search(kind: str, tmp_path, args: dict | None = None, **search_kwargs):
    import optuna

    torch.set_num_threads(1)
    base = dict(output_dir=str(tmp_path / kind), report_to="none", use_cpu=True, disable_tqdm=True, seed=42,
                num_train_epochs=2, logging_steps=1, eval_strategy="steps", eval_steps=3, save_strategy="steps",
                save_steps=3)
    base.update(args or {})
    if kind == "hf":
        import transformers as lib
    else:
        import hf_lightning as lib
    recorder = EventRecorder()
    trainer = lib.Trainer(args=lib.TrainingArguments(**base), model_init=_model_init,
                          train_dataset=regression_data(n=12), eval_dataset=regression_data(n=6, seed=7),
                          callbacks=[recorder])
    storage = optuna.storages.InMemoryStorage()
    search_kwargs.setdefault("hp_space", _hp_space)
    search_kwargs.setdefault("n_trials", 3)
    best = trainer.hyperparameter_search(backend="optuna", sampler=optuna.samplers.RandomSampler(seed=0),
                                         storage=storage, study_name="search", **search_kwargs)
    study = optuna.load_study(study_name="search", storage=storage)
    return trainer, best, study, recorder.events


def _trial_summary(study):
    return [(t.number, t.state.name, t.params, t.values) for t in study.trials]


def _assert_close_values(hf, ours):
    assert len(hf) == len(ours)
    for (n1, s1, p1, v1), (n2, s2, p2, v2) in zip(hf, ours):
        assert (n1, s1, p1) == (n2, s2, p2)
        if v1 is None:
            assert v2 is None
        else:
            assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(v1, v2)), (v1, v2)


def _runs(output_dir):
    """``{run folder: its checkpoint folders by step}``."""
    return {run: sorted(os.listdir(os.path.join(output_dir, run)), key=lambda name: int(name.split("-")[1]))
            for run in sorted(os.listdir(output_dir)) if os.path.isdir(os.path.join(output_dir, run))}


def _last_state(output_dir, run, checkpoint):
    with open(os.path.join(output_dir, run, checkpoint, "trainer_state.json")) as f:
        return json.load(f)


def test_search_matches_hf(tmp_path):
    """Three seeded trials: the same trials, objectives, best run, run folders, trial state and events."""
    pytest.importorskip("optuna", reason=OPTUNA_MISSING)
    hf_trainer, hf_best, hf_study, hf_events = _search("hf", tmp_path)
    trainer, best, study, events = _search("ours", tmp_path)

    assert type(best).__name__ == "BestRun" and best._fields == hf_best._fields
    assert (best.run_id, best.hyperparameters) == (hf_best.run_id, hf_best.hyperparameters)
    assert math.isclose(best.objective, hf_best.objective, rel_tol=1e-5)
    _assert_close_values(_trial_summary(hf_study), _trial_summary(study))
    # HF leaves the last trial's values on the arguments.
    for key in ("learning_rate", "seed", "per_device_train_batch_size"):
        assert getattr(trainer.args, key) == getattr(hf_trainer.args, key)
    assert trainer.args.output_dir == str(tmp_path / "ours")  # the trial's run folder was only temporary
    assert trainer.hp_search_backend is None
    assert events == hf_events

    hf_runs, runs = _runs(hf_trainer.args.output_dir), _runs(trainer.args.output_dir)
    assert runs == hf_runs and list(runs) == ["run-0", "run-1", "run-2"]
    for run, checkpoints in runs.items():
        hf_state = _last_state(hf_trainer.args.output_dir, run, checkpoints[-1])
        state = _last_state(trainer.args.output_dir, run, checkpoints[-1])
        for key in ("is_hyper_param_search", "trial_name", "trial_params", "global_step", "train_batch_size"):
            assert state[key] == hf_state[key], key
        assert state["is_hyper_param_search"] is True
        assert_log_history_equal(hf_state["log_history"], state["log_history"], ordered=False)


def test_pruned_trials_match_hf(tmp_path):
    """A pruned trial fires on_train_end and stops at the same evaluation; the study sees the same states."""
    pytest.importorskip("optuna", reason=OPTUNA_MISSING)
    hf = _search("hf", tmp_path, pruner=_PruneOddTrials())
    ours = _search("ours", tmp_path, pruner=_PruneOddTrials())
    summary = _trial_summary(ours[2])
    assert [s for _, s, _, _ in summary] == ["COMPLETE", "PRUNED", "COMPLETE"]
    _assert_close_values(_trial_summary(hf[2]), summary)
    assert ours[3] == hf[3]
    assert (ours[1].run_id, ours[1].hyperparameters) == (hf[1].run_id, hf[1].hyperparameters)


@pytest.mark.parametrize("direction", ["maximize", ["minimize", "maximize"]], ids=["maximize", "two_objectives"])
def test_objective_direction_and_hp_name(tmp_path, direction):
    """No evaluation during training: each trial is evaluated once at the end; hp_name names the run folders."""
    pytest.importorskip("optuna", reason=OPTUNA_MISSING)

    def objective(metrics):
        return metrics["eval_loss"] if isinstance(direction, str) else [metrics["eval_loss"], -metrics["eval_loss"]]

    kwargs = dict(direction=direction, compute_objective=objective, hp_name=lambda trial: f"trial_{trial.number}",
                  n_trials=2, args=dict(eval_strategy="no", save_strategy="epoch"))
    hf = _search("hf", tmp_path, **kwargs)
    ours = _search("ours", tmp_path, **kwargs)
    _assert_close_values(_trial_summary(hf[2]), _trial_summary(ours[2]))
    assert _runs(ours[0].args.output_dir) == _runs(hf[0].args.output_dir)
    assert list(_runs(ours[0].args.output_dir)) == ["trial_0", "trial_1"]
    runs = _runs(ours[0].args.output_dir)
    state = _last_state(ours[0].args.output_dir, "trial_1", runs["trial_1"][-1])
    assert state["trial_name"] == "trial_1"
    if isinstance(direction, list):
        assert isinstance(ours[1], list) and [b.run_id for b in ours[1]] == [b.run_id for b in hf[1]]
    else:
        assert ours[1].run_id == hf[1].run_id and math.isclose(ours[1].objective, hf[1].objective, rel_tol=1e-5)


def _trainer(tmp_path, **kwargs):
    import hf_lightning

    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    return hf_lightning.Trainer(args=args, train_dataset=regression_data(n=8), **kwargs)


@pytest.mark.parametrize("backend,error,match", [
    ("wandb", ValueError, r"backend='wandb'\) is not supported by hf_lightning.*use backend='optuna'.*backend='ray'"),
    ("hyperopt", ValueError, r"backend='hyperopt'\): unknown backend. Use backend='optuna' or backend='ray'"),
])
def test_unsupported_backends(tmp_path, backend, error, match):
    with pytest.raises(error, match=match):
        _trainer(tmp_path, model_init=_model_init).hyperparameter_search(backend=backend)


@pytest.mark.parametrize("backend,match", [
    (None, r"No hyperparameter search backend available.*`pip install optuna` or `pip install 'ray\[tune\]'`"),
    ("optuna", r"You picked the optuna backend, but it is not installed. Run `pip install optuna`"),
    ("ray", r"You picked the ray backend, but it is not installed. Run `pip install 'ray\[tune\]'`"),
])
def test_backend_not_installed(tmp_path, monkeypatch, backend, match):
    from hf_lightning.trainer import hp_search

    monkeypatch.setattr(hp_search, "_is_installed", lambda package: False)
    with pytest.raises(RuntimeError, match=match):
        _trainer(tmp_path, model_init=_model_init).hyperparameter_search(backend=backend)


def test_search_needs_model_init(tmp_path):
    pytest.importorskip("optuna", reason=OPTUNA_MISSING)
    with pytest.raises(RuntimeError, match="you need to pass your model through a model_init function"):
        _trainer(tmp_path, model=RegressionModel()).hyperparameter_search(backend="optuna")


def test_model_init_receives_the_trial(tmp_path):
    """A one-argument model_init gets None at construction and the Optuna trial in each search trial."""
    optuna = pytest.importorskip("optuna", reason=OPTUNA_MISSING)
    seen = []

    def model_init(trial):
        seen.append(trial)
        return _model_init()

    import hf_lightning

    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True,
                                          save_strategy="no", disable_tqdm=True)
    trainer = hf_lightning.Trainer(args=args, model_init=model_init, train_dataset=regression_data(n=4),
                                   eval_dataset=regression_data(n=2, seed=7))
    trainer.hyperparameter_search(backend="optuna", n_trials=2, hp_space=lambda trial: {},
                                  sampler=optuna.samplers.RandomSampler(seed=0))
    assert seen[0] is None
    assert [t.number for t in seen[1:]] == [0, 1]


def test_default_objective_matches_hf():
    from transformers.trainer_utils import default_compute_objective as hf_objective

    from hf_lightning.trainer.hp_search import default_compute_objective

    for metrics in ({"eval_loss": 0.5, "epoch": 1.0, "eval_runtime": 2.0, "eval_samples_per_second": 3.0},
                    {"eval_loss": 0.5, "eval_acc": 0.75, "eval_f1": 0.5, "eval_steps_per_second": 1.0}):
        assert default_compute_objective(metrics) == hf_objective(metrics)
