"""The evaluation pieces of the flow: best-metric tracking (a table, no Lightning), the shared metric finishing,
and the keys each of its three callers reports (in training, a plain ``validate()``, the facade's ``evaluate()``)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from hf_lightning.callbacks.evaluation import metric_key, update_best_metric
from hf_lightning.evaluation import EvalAccumulator, dataset_prefix, finish_eval_metrics
from hf_lightning.state import TrainerState
from tests.helpers.models import RegressionModel, regression_data


def _args(metric="loss", greater=False, save_strategy="steps"):
    return SimpleNamespace(metric_for_best_model=metric, greater_is_better=greater, save_strategy=save_strategy)


@pytest.mark.parametrize("name, key", [("loss", "eval_loss"), ("eval_loss", "eval_loss"),
                                       ("accuracy", "eval_accuracy"), ("eval_b_acc", "eval_b_acc")])
def test_metric_key_adds_hf_prefix_once(name, key):
    assert metric_key(name) == key


# (greater_is_better, save_strategy, best before, value, new best?, best after, best_global_step after)
BEST_METRIC_TABLE = [
    (False, "steps", None, 0.5, True, 0.5, 7),
    (False, "steps", 0.5, 0.4, True, 0.4, 7),
    (False, "steps", 0.5, 0.5, False, 0.5, None),
    (False, "steps", 0.5, 0.6, False, 0.5, None),
    (True, "epoch", None, 0.1, True, 0.1, 7),
    (True, "best", 0.8, 0.9, True, 0.9, 7),
    (True, "steps", 0.8, 0.7, False, 0.8, None),
    # HF records the step of the best metric only when checkpoints are saved.
    (False, "no", None, 0.3, True, 0.3, None),
]


@pytest.mark.parametrize("greater, save_strategy, before, value, is_new, after, best_step", BEST_METRIC_TABLE)
def test_update_best_metric_table(greater, save_strategy, before, value, is_new, after, best_step):
    state = TrainerState(global_step=7, best_metric=before)
    args = _args("loss", greater, save_strategy)
    assert update_best_metric(args, state, {"eval_loss": value, "eval_runtime": 1.0}) is is_new
    assert state.best_metric == after
    assert state.best_global_step == best_step


def test_update_best_metric_without_metric_for_best_model_is_never_new():
    state = TrainerState(global_step=3)
    assert update_best_metric(_args(metric=None), state, {"eval_loss": 0.1}) is False
    assert state.best_metric is None


def test_update_best_metric_names_the_available_metrics():
    with pytest.raises(KeyError, match=r"'eval_accuracy', which is not found .* \['eval_loss'\]"):
        update_best_metric(_args("accuracy"), TrainerState(), {"eval_loss": 0.1})


# ---------------------------------------------------------------------------- shared metric finishing
def _accumulator(losses=(1.0, 3.0), batch_size=2):
    acc = EvalAccumulator(SimpleNamespace())
    for loss in losses:
        acc.add(torch.tensor(loss), None, None, batch_size)
    return acc


def test_finish_eval_metrics_orders_keys_as_hf():
    _, _, metrics = finish_eval_metrics(_accumulator(), "eval_a", started=time.time(), total_batch_size=2,
                                        model_preparation_time=0.25)
    assert list(metrics) == ["eval_a_loss", "eval_a_model_preparation_time", "eval_a_runtime",
                             "eval_a_samples_per_second", "eval_a_steps_per_second"]
    assert metrics["eval_a_loss"] == pytest.approx(2.0)
    assert metrics["eval_a_model_preparation_time"] == 0.25


def test_finish_eval_metrics_counts_the_dataset_length_when_given():
    started = time.time() - 1.0
    _, _, seen = finish_eval_metrics(_accumulator(), "eval", started=started, total_batch_size=2)
    _, _, sized = finish_eval_metrics(_accumulator(), "eval", started=started, total_batch_size=2, num_samples=8)
    # 4 samples seen in 2 steps, against a dataset of 8 (4 steps): HF's speed counts the dataset.
    assert sized["eval_samples_per_second"] == pytest.approx(2 * seen["eval_samples_per_second"], rel=0.05)
    assert sized["eval_steps_per_second"] == pytest.approx(2 * seen["eval_steps_per_second"], rel=0.05)


def test_finish_eval_metrics_without_batches():
    preds, labels, metrics = finish_eval_metrics(None, "test", started=time.time(), total_batch_size=4,
                                                 model_preparation_time=0.5)
    assert preds is None and labels is None
    assert list(metrics) == ["test_model_preparation_time", "test_runtime", "test_samples_per_second",
                             "test_steps_per_second"]
    assert metrics["test_steps_per_second"] == 0


@pytest.mark.parametrize("prefix, name, expected", [("eval", None, "eval"), ("eval", "b", "eval_b"),
                                                    ("test", "x", "test_x")])
def test_dataset_prefix(prefix, name, expected):
    assert dataset_prefix(prefix, name) == expected


def test_the_three_evaluations_report_the_same_keys(tmp_path):
    """In training, a plain ``lightning.Trainer.validate`` and the facade's ``evaluate()`` share one finishing step."""
    import hf_lightning
    from hf_lightning import HFDataModule, HFLightningModule, build_lightning_trainer

    torch.set_num_threads(1)
    train, evald = regression_data(n=16), regression_data(n=6, seed=9)

    def args(name, **kw):
        return hf_lightning.TrainingArguments(output_dir=str(tmp_path / name), report_to="none", use_cpu=True,
                                              disable_tqdm=True, per_device_train_batch_size=4,
                                              per_device_eval_batch_size=4, max_steps=2, save_strategy="no", **kw)

    trainer = hf_lightning.Trainer(model=RegressionModel(), args=args("facade", eval_strategy="steps", eval_steps=2),
                                   train_dataset=train, eval_dataset=evald)
    trainer.train()
    in_training = next(e for e in trainer.state.log_history if "eval_loss" in e)
    standalone = trainer.evaluate()

    module = HFLightningModule(RegressionModel(), args("native"))
    build_lightning_trainer(args("native"), enable_progress_bar=False).validate(
        module, datamodule=HFDataModule(args("native"), eval_dataset=evald), verbose=False)
    validated = module.trainer_state.log_history[-1]

    keys = ["eval_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "epoch"]
    assert list(standalone) == keys
    assert [k for k in in_training if k != "step"] == keys
    assert [k for k in validated if k != "step"] == keys
    assert standalone["eval_loss"] == pytest.approx(in_training["eval_loss"])
