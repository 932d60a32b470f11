"""``Trainer.hyperparameter_search``: HF's trial loop over ``model_init``, with Optuna or Ray Tune as the backend.

Each trial runs the trainer's ordinary ``train()`` (Lightning's loop) with HF 5.23's per-trial rules:

- the seed is set from the arguments, ``model_init`` builds a fresh model (given the trial when it takes one
  argument), and only *then* are the trial's hyperparameters (``hp_space(trial)``) written onto ``args`` — cast to
  the type of the current value, unknown names skipped with a warning. The values stay on ``args`` after the trial,
  so the next Optuna trial's model is built with the previous trial's seed, as in HF (a Ray trial starts from a
  copy of the trainer as the search found it);
- checkpoints go to ``output_dir/run-<trial number>`` (Ray: ``run-<trial id>``), or ``output_dir/<hp_name(trial)>``;
- after every evaluation during training the objective (``compute_objective(metrics)``) is reported to the trial;
  a trial Optuna's pruner stops fires ``on_train_end`` and raises ``optuna.TrialPruned``;
- a trial whose training never evaluated is evaluated once at the end;
- the study's best trial comes back as :class:`BestRun` (a list of them for several ``direction``\\ s).

Ray Tune's side (the trials run in Ray's worker processes) is in :mod:`hf_lightning.trainer.hp_search_ray`;
``"wandb"`` (its sweeps need W&B's server) is refused with the alternatives named.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import importlib.util
import inspect
import logging
import os
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any, NamedTuple

import torch

from hf_lightning.callbacks.hf_api import TrainerCallback

logger = logging.getLogger(__name__)

__all__ = [
    "BestRun",
    "HPSearchBackend",
    "default_compute_objective",
    "default_hp_space_optuna",
    "resolve_backend",
    "run_hyperparameter_search",
]


class HPSearchBackend(str, Enum):
    """HF's backend names. hf_lightning runs ``OPTUNA`` and ``RAY``; ``WANDB`` is refused with a clear error."""

    OPTUNA = "optuna"
    RAY = "ray"
    WANDB = "wandb"


class BestRun(NamedTuple):
    """The best trial of a search, as HF's ``BestRun``.

    Attributes:
        run_id: the trial number (Optuna) or Ray's trial id, as a string; its checkpoints are in
            ``output_dir/run-<run_id>`` (unless ``hp_name`` named the run).
        objective: the objective of that trial (a list for a multi-objective search).
        hyperparameters: the trial's sampled parameters (Ray: the trial's whole config).
        run_summary: backend-specific summary (``None`` for Optuna, Ray's ``ExperimentAnalysis`` for Ray).
    """

    run_id: str
    objective: float | list[float]
    hyperparameters: dict[str, Any]
    run_summary: Any | None = None


def default_compute_objective(metrics: dict[str, float]) -> float:
    """HF's default objective: ``eval_loss`` when it is the only metric, else the sum of the other metrics.

    ``epoch`` and the speed metrics (``*_runtime``, ``*_per_second``) never count.
    """
    metrics = copy.deepcopy(metrics)
    loss = metrics.pop("eval_loss", None)
    metrics.pop("epoch", None)
    for key in [k for k in metrics if k.endswith("_runtime") or k.endswith("_per_second")]:
        metrics.pop(key)
    return loss if not metrics else sum(metrics.values())


def default_hp_space_optuna(trial: Any) -> dict[str, Any]:
    """HF's default Optuna search space: learning rate, epochs, seed and train batch size."""
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-6, 1e-4, log=True),
        "num_train_epochs": trial.suggest_int("num_train_epochs", 1, 5),
        "seed": trial.suggest_int("seed", 1, 40),
        "per_device_train_batch_size": trial.suggest_categorical("per_device_train_batch_size", [4, 8, 16, 32, 64]),
    }


def _call_model_init(model_init: Callable, trial: Any) -> torch.nn.Module:
    """``Trainer.call_model_init``'s rule for the user's function while the trainer's own slot holds the trial's."""
    fn = model_init.func if isinstance(model_init, functools.partial) else model_init
    count = len(inspect.signature(fn).parameters)
    if isinstance(model_init, functools.partial):
        count -= len(model_init.args) + len(model_init.keywords)
    if count > 1:
        raise RuntimeError("model_init should have 0 or 1 argument.")
    model = model_init(trial) if count == 1 else model_init()
    if model is None:
        raise RuntimeError("model_init should not return None.")
    return model


# ---------------------------------------------------------------------------------------------- backends
def _is_installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


# name -> (importable module, pip requirement); one place knows what each backend needs.
_BACKEND_PACKAGES: dict[HPSearchBackend, tuple[str, str]] = {
    HPSearchBackend.OPTUNA: ("optuna", "optuna"),
    HPSearchBackend.RAY: ("ray", "'ray[tune]'"),
    HPSearchBackend.WANDB: ("wandb", "wandb"),
}
# The backends hf_lightning runs, in the order HF picks a default among the installed ones.
_RUNNABLE = (HPSearchBackend.OPTUNA, HPSearchBackend.RAY)


def resolve_backend(backend: str | HPSearchBackend | None) -> HPSearchBackend:
    """The backend to run: the one named (checked installed and supported), or the first installed of Optuna and
    Ray Tune (HF's order).

    Raises:
        ValueError: an unknown name, or a backend hf_lightning does not run (``wandb``).
        RuntimeError: the backend's package is not installed (the message gives the ``pip install``).
    """
    if backend is None:
        for candidate in _RUNNABLE:
            if _is_installed(_BACKEND_PACKAGES[candidate][0]):
                return candidate
        raise RuntimeError(
            "No hyperparameter search backend available. hf_lightning searches with Optuna or Ray Tune: run "
            + " or ".join(f"`pip install {_BACKEND_PACKAGES[b][1]}`" for b in _RUNNABLE) + "."
        )
    try:
        chosen = HPSearchBackend(getattr(backend, "value", backend))
    except ValueError:
        raise ValueError(
            f"hyperparameter_search(backend={backend!r}): unknown backend. Use backend='optuna' or backend='ray' "
            f"(HF also knows {[b.value for b in HPSearchBackend]})."
        ) from None
    if chosen not in _RUNNABLE:
        raise ValueError(
            f"hyperparameter_search(backend={chosen.value!r}) is not supported by hf_lightning (W&B sweeps need "
            "W&B's server); use backend='optuna' (`pip install optuna`) or backend='ray' "
            "(`pip install 'ray[tune]'`)."
        )
    module, requirement = _BACKEND_PACKAGES[chosen]
    if not _is_installed(module):
        raise RuntimeError(f"You picked the {chosen.value} backend, but it is not installed. Run "
                           f"`pip install {requirement}`.")
    return chosen


# ---------------------------------------------------------------------------------------------- the search
def run_hyperparameter_search(
    trainer: Any,
    hp_space: Callable[[Any], dict[str, Any]] | None = None,
    compute_objective: Callable[[dict[str, float]], float] | None = None,
    n_trials: int = 20,
    direction: str | list[str] = "minimize",
    backend: str | HPSearchBackend | None = None,
    hp_name: Callable[[Any], str] | None = None,
    **kwargs: Any,
) -> BestRun | list[BestRun]:
    """Run ``n_trials`` trainings of ``trainer`` and return the best (see ``Trainer.hyperparameter_search``).

    Sets ``trainer.hp_search_backend`` / ``hp_space`` / ``hp_name`` / ``compute_objective`` as HF does
    (``hp_search_backend`` goes back to ``None`` at the end) and ``trainer.objective`` per trial.
    """
    chosen = resolve_backend(backend)
    if trainer.model_init is None:
        raise RuntimeError("To use hyperparameter search, you need to pass your model through a model_init function.")
    if getattr(trainer.args, "world_size", 1) > 1:
        raise RuntimeError(
            "hyperparameter_search runs in one process in hf_lightning: launch the script without torchrun / "
            "a distributed launcher (each trial may still use every device of this machine)."
        )
    trainer.hp_search_backend = chosen
    if chosen is HPSearchBackend.RAY:
        from hf_lightning.trainer import hp_search_ray

        default_space, run = hp_search_ray.default_hp_space_ray, hp_search_ray.run_ray
    else:
        default_space, run = default_hp_space_optuna, _run_optuna
    trainer.hp_space = default_space if hp_space is None else hp_space
    trainer.hp_name = hp_name
    trainer.compute_objective = default_compute_objective if compute_objective is None else compute_objective
    try:
        return run(trainer, n_trials, direction, **kwargs)
    finally:
        trainer.hp_search_backend = None


def _run_optuna(trainer: Any, n_trials: int, direction: str | list[str], **kwargs: Any) -> BestRun | list[BestRun]:
    import optuna

    def objective(trial: Any) -> float | list[float]:
        trainer.objective = None
        with _trial_session(trainer, trial, run_id=str(trial.number), params=lambda: trainer.hp_space(trial),
                            trial_params=lambda: dict(trial.params), report=functools.partial(_report, trial=trial)):
            trainer.train()
        if getattr(trainer, "objective", None) is None:
            # The training never evaluated: score the final model once.
            trainer.objective = trainer.compute_objective(trainer.evaluate())
        _release_memory()
        return trainer.objective

    optimize_kwargs = {
        "timeout": kwargs.pop("timeout", None),
        "n_jobs": kwargs.pop("n_jobs", 1),
        "gc_after_trial": kwargs.pop("gc_after_trial", False),
        "catch": kwargs.pop("catch", ()),
    }
    directions = direction if isinstance(direction, list) else None
    study = optuna.create_study(direction=None if directions else direction, directions=directions, **kwargs)
    study.optimize(objective, n_trials=n_trials, **optimize_kwargs)
    if directions is None:
        best = study.best_trial
        return BestRun(str(best.number), best.value, best.params)
    return [BestRun(str(best.number), best.values, best.params) for best in study.best_trials]


@contextlib.contextmanager
def _trial_session(trainer: Any, trial: Any, *, run_id: str, params: Callable[[], dict[str, Any]],
                   trial_params: Callable[[], dict[str, Any]],
                   report: Callable[[Any, dict[str, float]], None]) -> Iterator[None]:
    """Make the next ``train()`` call one trial of the search, and undo the plumbing afterwards.

    Args:
        trainer: the trainer whose ``train()`` runs the trial.
        trial: the backend's trial (Optuna's ``Trial``, Ray's config dict): what ``model_init`` and ``hp_name`` get.
        run_id: the trial's id in the default run folder name ``run-<run_id>``.
        params: the trial's ``TrainingArguments`` values, asked for once the model is built.
        trial_params: the ``trial_params`` saved in the run's ``TrainerState``.
        report: ``report(trainer, metrics)``, called after each evaluation during training.

    The trial's hyperparameters are *not* undone: HF leaves them on ``args``.
    """
    args = trainer.args
    user_model_init = trainer.model_init
    root_dir = args.output_dir
    run_name = trainer.hp_name(trial) if trainer.hp_name is not None else f"run-{run_id}"
    reporter = _TrialStateCallback(trial_params, run_name if trainer.hp_name is not None else None)

    def model_init() -> torch.nn.Module:
        # train() seeds, then calls this: HF builds the model before it applies the trial's values.
        model = _call_model_init(user_model_init, trial)
        _apply_hyperparameters(args, params())
        return model

    trainer._trial = trial
    trainer.model_init = model_init
    # The previous trial's optimizer holds the previous model's parameters; HF's train() drops both when
    # model_init rebuilds the model (model_init excludes user-given optimizers, so nothing of the user's is lost).
    trainer.optimizer, trainer.lr_scheduler = None, None
    # The flow callback saves and rotates checkpoints under args.output_dir, so the trial's run folder
    # takes its place while the trial trains.
    args.output_dir = os.path.join(root_dir, run_name)
    # train() calls trainer.evaluate() at each evaluation; HF reports to the trial right after it.
    own_evaluate = vars(trainer).get("evaluate")
    trainer.evaluate = functools.partial(_evaluate_and_report, trainer, trainer.evaluate, report)
    trainer.add_callback(reporter)
    try:
        yield
    finally:
        trainer.remove_callback(reporter)
        if own_evaluate is None:
            del trainer.evaluate
        else:
            trainer.evaluate = own_evaluate
        args.output_dir = root_dir
        trainer.model_init = user_model_init


def _apply_hyperparameters(args: Any, params: dict[str, Any]) -> None:
    for key, value in params.items():
        if not hasattr(args, key):
            logger.warning("Trying to set %s in the hyperparameter search but there is no corresponding field in "
                           "`TrainingArguments`.", key)
            continue
        current = getattr(args, key)
        # HF casts to the field's current type (an int epoch count becomes 3.0 for a float field).
        setattr(args, key, type(current)(value) if current is not None else value)
    logger.info("Trial hyperparameters: %s", params)


def _evaluate_and_report(trainer: Any, evaluate: Callable, report: Callable, *args: Any, **kwargs: Any) -> dict:
    metrics = evaluate(*args, **kwargs)
    if trainer.is_in_train:
        report(trainer, metrics)
    return metrics


def _report(trainer: Any, metrics: dict[str, float], trial: Any) -> None:
    import optuna

    trainer.objective = trainer.compute_objective(dict(metrics))
    study = getattr(trial, "study", None)
    # Optuna cannot prune multi-objective studies, so HF only reports single objectives.
    if study is not None and len(study.directions) == 1:
        trial.report(trainer.objective, trainer.state.global_step)
        if trial.should_prune():
            trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.flow.control)
            raise optuna.TrialPruned()


class _TrialStateCallback(TrainerCallback):
    """Marks the run's ``TrainerState`` as a search trial (saved in each checkpoint's ``trainer_state.json``)."""

    def __init__(self, trial_params: Callable[[], dict[str, Any]], trial_name: str | None) -> None:
        self.trial_params = trial_params
        self.trial_name = trial_name

    def on_train_begin(self, args, state, control, **kwargs):
        state.is_hyper_param_search = True
        if self.trial_name is not None:
            state.trial_name = self.trial_name
        state.trial_params = self.trial_params()


def _release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
