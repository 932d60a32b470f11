"""``Trainer.hyperparameter_search(backend="ray")``: HF 5.23's Ray Tune search, each trial one ``train()``.

The search runs ``ray.tune.run`` over one function trainable, as HF does:

- the trainer goes into Ray's object store (``tune.with_parameters``), so each trial runs in a Ray worker process on
  its own copy of the trainer as it was when the search started (its model dropped first: ``model_init`` builds a
  fresh one per trial). Everything the trainer holds must pickle (datasets, collator, ``model_init``, callbacks);
- ``hp_space(None)`` is the ``config`` given to Ray (``tune.loguniform``, ``tune.choice``, ``tune.grid_search``...);
  each trial gets its resolved config dict, which ``model_init`` receives (when it takes an argument), which is
  written onto ``args`` once the model is built (the Optuna rules of :mod:`~hf_lightning.trainer.hp_search`) and
  which is the run's ``TrainerState.trial_params``;
- checkpoints go to ``output_dir/run-<Ray's trial id>`` (or ``output_dir/<hp_name(config)>``);
- after each evaluation during training the metrics and ``objective`` are sent with ``ray.tune.report``, with a Ray
  checkpoint (``checkpoint-<step>``: the model, ``trainer_state.json``, ``optimizer.pt``, ``scheduler.pt``) when
  that step saves; a trial that never evaluated is evaluated at the end and reported with ``done=True`` and a
  checkpoint; a trial Ray restarts from a checkpoint (``max_failures``, ``PopulationBasedTraining``) resumes from it;
- the best trial by ``objective`` (``RAY_SCOPE``, default ``"last"``) comes back as ``BestRun`` with Ray's
  ``ExperimentAnalysis`` as ``run_summary``.

Ray is started here (``include_dashboard=False``, nothing reached over the network) when the script has not
called ``ray.init`` itself; call it first to choose the CPUs, GPUs or cluster. ``ray`` is imported only when this
backend runs.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from hf_lightning.checkpointing.layout import (
    OPTIMIZER_NAME,
    PREFIX_CHECKPOINT_DIR,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
)
from hf_lightning.trainer.hp_search import BestRun, _release_memory, _trial_session

logger = logging.getLogger(__name__)

__all__ = ["default_hp_space_ray", "run_ray", "save_tune_checkpoint"]

# Schedulers (and their subclasses) that decide from the results reported during training: HF refuses them without
# evaluation. ``ASHAScheduler`` is Ray's alias of ``AsyncHyperBandScheduler``.
_INTERMEDIATE_RESULT_SCHEDULERS = frozenset({"AsyncHyperBandScheduler", "MedianStoppingRule", "HyperBandForBOHB",
                                             "PopulationBasedTraining"})


def default_hp_space_ray(trial: Any) -> dict[str, Any]:
    """HF's default Ray Tune search space: learning rate, epochs, seed and train batch size."""
    from ray import tune

    return {
        "learning_rate": tune.loguniform(1e-6, 1e-4),
        "num_train_epochs": tune.choice(list(range(1, 6))),
        "seed": tune.uniform(1, 40),
        "per_device_train_batch_size": tune.choice([4, 8, 16, 32, 64]),
    }


def run_ray(trainer: Any, n_trials: int, direction: str | list[str], **kwargs: Any) -> BestRun:
    """Run the search with ``ray.tune.run`` (``kwargs`` are its arguments) and return the best trial.

    Raises:
        ValueError: several ``direction``\\ s (Ray Tune searches one objective).
        RuntimeError: a scheduler that needs intermediate results without evaluation during training (HF's rule),
            or no trial reported an objective.
    """
    import ray
    import ray.tune

    if not isinstance(direction, str):
        raise ValueError(
            f"hyperparameter_search(backend='ray', direction={direction!r}): Ray Tune optimises one objective; "
            "pass direction='minimize' or 'maximize' (or use backend='optuna' for several objectives)."
        )
    _check_scheduler(trainer.args, kwargs.get("scheduler"))
    if not trainer._memory_tracker.skip:
        logger.warning("Memory tracking for your Trainer is currently enabled. Automatically disabling the memory "
                       "tracker since the memory tracker is not serializable.")
        trainer._memory_tracker.skip = True
    if "resources_per_trial" not in kwargs:
        # HF's default: one CPU (and one GPU when the arguments see one) per trial.
        kwargs["resources_per_trial"] = {"cpu": 1}
        if trainer.args.n_gpu > 0:
            kwargs["resources_per_trial"]["gpu"] = 1
        logger.info("No `resources_per_trial` arg was passed into `hyperparameter_search`. Setting it to a default "
                    "value of %s for each trial.", kwargs["resources_per_trial"])
    if "progress_reporter" not in kwargs:
        kwargs["progress_reporter"] = ray.tune.CLIReporter(metric_columns=["objective"])

    # Each trial builds its own model with model_init; the driver's model and fitted pieces stay out of the pickle.
    trainer.model = None
    trainer.callback_handler.model = None
    trainer._module, trainer._datamodule, trainer._pl_trainer = None, None, None
    if not ray.is_initialized():
        logger.info("Starting a local Ray instance without its dashboard (call ray.init() first to choose).")
        ray.init(include_dashboard=False)
    analysis = ray.tune.run(ray.tune.with_parameters(_objective, local_trainer=trainer),
                            config=trainer.hp_space(None), num_samples=n_trials, **kwargs)
    best = analysis.get_best_trial(metric="objective", mode=direction[:3], scope=os.getenv("RAY_SCOPE", "last"))
    if best is None:
        raise RuntimeError("hyperparameter_search(backend='ray'): no trial reported an objective (see Ray's trial "
                           "errors above).")
    return BestRun(best.trial_id, best.last_result["objective"], best.config, analysis)


def _check_scheduler(args: Any, scheduler: Any) -> None:
    if scheduler is None or not {cls.__name__ for cls in type(scheduler).__mro__} & _INTERMEDIATE_RESULT_SCHEDULERS:
        return
    if not args.do_eval or str(getattr(args.eval_strategy, "value", args.eval_strategy)) == "no":
        name = type(scheduler).__name__
        raise RuntimeError(
            f"You are using {name} as a scheduler but you haven't enabled evaluation during training: your trials "
            f"will not report intermediate results to Ray Tune, so it cannot stop them early or exploit other "
            f"trials' parameters. Pass `do_eval=True` and `eval_strategy='steps'` (or 'epoch') in the Trainer "
            f"`args`, or do not use {name}."
        )


def _objective(trial: dict[str, Any], local_trainer: Any) -> None:
    """One Ray trial, in a Ray worker: train on the trial's config (resuming from Ray's checkpoint if it has one)."""
    import ray.tune

    trainer = local_trainer
    trainer.objective = None
    params = dict(trial)
    params.pop("wandb", None)  # HF drops a W&B config that rides along in Ray's config
    run_id = ray.tune.get_context().get_trial_id()
    checkpoint = ray.tune.get_checkpoint()
    with _trial_session(trainer, trial, run_id=run_id, params=lambda: params, trial_params=lambda: params,
                        report=_report):
        if checkpoint:
            # HF's placeholder: a resume whose training is already done must not be evaluated and reported again.
            trainer.objective = "objective"
            with checkpoint.as_directory() as checkpoint_dir:
                folder = next(Path(checkpoint_dir).glob(f"{PREFIX_CHECKPOINT_DIR}*")).as_posix()
                trainer.train(resume_from_checkpoint=folder)
        else:
            trainer.train()
    if getattr(trainer, "objective", None) is None:
        # The training never evaluated: score the final model once and hand Ray a checkpoint of it.
        metrics = trainer.evaluate()
        trainer.objective = trainer.compute_objective(metrics)
        metrics.update({"objective": trainer.objective, "done": True})
        with tempfile.TemporaryDirectory() as checkpoint_dir:
            save_tune_checkpoint(trainer, checkpoint_dir)
            ray.tune.report(metrics, checkpoint=ray.tune.Checkpoint.from_directory(checkpoint_dir))
    _release_memory()


def _report(trainer: Any, metrics: dict[str, float]) -> None:
    """HF's report after an evaluation during training: metrics plus ``objective``, and a checkpoint if this step
    saves (the flags as the flow decided them before the evaluation)."""
    import ray.tune

    metrics = dict(metrics)
    # As HF: the objective function gets the very dict that is reported (whatever it changes in it is reported).
    trainer.objective = trainer.compute_objective(metrics)
    with tempfile.TemporaryDirectory() as checkpoint_dir:
        checkpoint = None
        if trainer.flow.control.should_save:
            save_tune_checkpoint(trainer, checkpoint_dir)
            checkpoint = ray.tune.Checkpoint.from_directory(checkpoint_dir)
        metrics["objective"] = trainer.objective
        ray.tune.report(metrics, checkpoint=checkpoint)


def save_tune_checkpoint(trainer: Any, checkpoint_dir: str) -> None:
    """HF's ``_tune_save_checkpoint``: ``checkpoint_dir/checkpoint-<step>`` with the model (``save_model``),
    ``trainer_state.json`` (holding the current ``TrainerControl``), ``optimizer.pt`` and ``scheduler.pt``."""
    output_dir = os.path.join(checkpoint_dir, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")
    trainer.save_model(output_dir, _internal_call=True)
    if trainer.args.should_save:
        trainer.state.stateful_callbacks["TrainerControl"] = trainer.flow.control.state()
        trainer.state.save_to_json(os.path.join(output_dir, TRAINER_STATE_NAME))
        torch.save(trainer.optimizer.state_dict(), os.path.join(output_dir, OPTIMIZER_NAME))
        torch.save(trainer.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))
