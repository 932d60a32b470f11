"""Lightning's own callbacks and loggers on an HF run: they see HF's metrics at HF's moments.

One run through a ``lightning.Trainer`` the user builds (no ``build_lightning_trainer``: the module brings HF's
flow through ``configure_callbacks``) with Lightning's ``ModelCheckpoint(monitor="eval_loss")``,
``EarlyStopping(monitor="eval_loss")``, ``LearningRateMonitor`` and a ``CSVLogger``, beside the same run through
``transformers.Trainer`` with HF's ``EarlyStoppingCallback`` set to stop at the same evaluation. Each Lightning
piece is checked against the run's own ``log_history``, which is checked against HF's.
"""

from __future__ import annotations

import csv
import math
import os

import lightning.pytorch as pl
import pytest
import torch

from tests.helpers.models import lm_data
from tests.helpers.parity import assert_log_history_equal, assert_weights_close
from tests.helpers.recorder import EventRecorder

ARGS = dict(per_device_train_batch_size=4, per_device_eval_batch_size=4, num_train_epochs=2, logging_steps=1,
            eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2, learning_rate=3e-3,
            metric_for_best_model="loss", greater_is_better=False, report_to="none", use_cpu=True,
            disable_tqdm=True, seed=42)
# The loss falls by far less than this per evaluation, so both early stoppings count every evaluation after the
# first as "no improvement" and stop at the third one (step 6 of 20).
THRESHOLD, PATIENCE, STOP_STEP = 10.0, 2, 6


def _gpt2_with_dropout():
    from transformers import GPT2Config, GPT2LMHeadModel, set_seed

    set_seed(42)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16,
                                      resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, bos_token_id=0,
                                      eos_token_id=0))


def _logit_mean(eval_pred):
    return {"logit_mean": float(eval_pred.predictions.mean())}


def _hf_run(tmp_path, train, evald):
    import transformers

    torch.set_num_threads(1)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), **ARGS)
    recorder = EventRecorder()
    trainer = transformers.Trainer(
        model=_gpt2_with_dropout(), args=args, train_dataset=train, eval_dataset=evald, compute_metrics=_logit_mean,
        callbacks=[recorder, transformers.EarlyStoppingCallback(PATIENCE, early_stopping_threshold=THRESHOLD)])
    trainer.train()
    return trainer, recorder


class MetricsSeen(pl.Callback):
    """Placed after HF's flow: what ``callback_metrics`` holds when its hooks run."""

    def __init__(self):
        self.at_batch_end, self.at_validation_end = {}, {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.at_batch_end[trainer.global_step] = {k: float(v) for k, v in trainer.callback_metrics.items()}

    def on_validation_end(self, trainer, pl_module):
        self.at_validation_end[trainer.global_step] = {k: float(v) for k, v in trainer.callback_metrics.items()}


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_lightning_callbacks_and_logger_see_hf_metrics_at_hf_steps(tmp_path):
    from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    import hf_lightning
    from hf_lightning import HFDataModule, HFLightningModule

    train, evald = lm_data(n_train=40, n_eval=8)
    hf_trainer, hf_recorder = _hf_run(tmp_path, train, evald)

    torch.set_num_threads(1)
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path / "ours"), **ARGS)
    # Built before the module, which seeds as HF's Trainer does once the model exists.
    model = _gpt2_with_dropout()
    checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "lightning_ckpt"), monitor="eval_loss", mode="min",
                                 save_top_k=-1, filename="{step}-{eval_loss:.6f}")
    stopping = EarlyStopping(monitor="eval_loss", mode="min", patience=PATIENCE, min_delta=THRESHOLD)
    seen, recorder = MetricsSeen(), EventRecorder()
    logger = CSVLogger(str(tmp_path / "csv"), name="", version="")
    # As a Lightning user writes it: the HF-style callback goes to the module, Lightning's to the trainer.
    trainer = pl.Trainer(callbacks=[checkpoint, stopping, LearningRateMonitor(logging_interval="step"), seen],
                         logger=logger, enable_progress_bar=False, accelerator="cpu", devices=1, log_every_n_steps=1)
    trainer.fit(HFLightningModule(model, args, compute_metrics=_logit_mean, callbacks=[recorder]),
                datamodule=HFDataModule(args, train_dataset=train, eval_dataset=evald))
    flow = next(cb for cb in trainer.callbacks if isinstance(cb, hf_lightning.callbacks.HFFlowCallback))
    history = flow.state.log_history

    # The run itself is HF's: same log_history, events (on_epoch_end, then the summary log and on_train_end),
    # checkpoint-N folders and weights as HF's Trainer stopped by its EarlyStoppingCallback.
    assert trainer.global_step == hf_trainer.state.global_step == STOP_STEP
    assert_log_history_equal(hf_trainer.state.log_history, history)
    assert recorder.events == hf_recorder.events
    assert sorted(os.listdir(args.output_dir)) == sorted(os.listdir(hf_trainer.args.output_dir)) == \
        ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert_weights_close({k: v.detach() for k, v in hf_trainer.model.state_dict().items()},
                         {k: v.detach() for k, v in model.state_dict().items()})
    assert flow.control.should_training_stop

    train_logs = {e["step"]: e for e in history if "loss" in e}
    eval_logs = {e["step"]: e for e in history if "eval_loss" in e}
    assert sorted(eval_logs) == [2, 4, 6] and sorted(train_logs) == list(range(1, STOP_STEP + 1))

    # callback_metrics: a callback after the flow sees each step's training log in on_train_batch_end, and the
    # fresh evaluation in on_validation_end, under HF's keys, equal to log_history's values.
    for step, entry in train_logs.items():
        for key in ("loss", "grad_norm", "learning_rate", "epoch"):
            assert seen.at_batch_end[step][key] == entry[key], (step, key)
    assert sorted(seen.at_validation_end) == [2, 4, 6]
    for step, entry in eval_logs.items():
        for key in ("eval_loss", "eval_logit_mean", "epoch"):
            assert seen.at_validation_end[step][key] == entry[key], (step, key)

    # ModelCheckpoint saved at every evaluation, scored with that evaluation's eval_loss.
    scores = {int(os.path.basename(p).split("-")[0].split("=")[1]): float(s) for p, s in
              checkpoint.best_k_models.items()}
    assert scores == {step: e["eval_loss"] for step, e in eval_logs.items()}
    assert sorted(os.listdir(tmp_path / "lightning_ckpt")) == sorted(
        f"step={s}-eval_loss={e['eval_loss']:.6f}.ckpt" for s, e in eval_logs.items())
    assert float(checkpoint.best_model_score) == min(e["eval_loss"] for e in eval_logs.values())

    # EarlyStopping counted the evaluations and stopped the fit at the third one.
    assert stopping.wait_count == PATIENCE and float(stopping.best_score) == eval_logs[2]["eval_loss"]

    # The CSVLogger got every log under HF's TensorBoard names at HF's steps (what report_to's loggers get), and
    # LearningRateMonitor's rows hold the learning rate HF logged for the step they precede.
    rows = _read_csv(tmp_path / "csv" / "metrics.csv")
    for entry in history[:-1]:
        step = entry["step"]
        row = {k: v for r in rows if r["step"] == str(step) for k, v in r.items() if v != ""}
        for key, value in entry.items():
            if key == "step":
                continue
            name = f"eval/{key[5:]}" if key.startswith("eval_") else f"train/{key}"
            assert math.isclose(float(row[name]), value, rel_tol=1e-12), (step, key)
    lr_column = next(k for k in rows[0] if k.startswith("lr-"))
    lr_rows = {int(r["step"]): float(r[lr_column]) for r in rows if r[lr_column] != ""}
    assert lr_rows == pytest.approx({s - 1: e["learning_rate"] for s, e in train_logs.items()}, rel=1e-12)
    assert float(trainer.logged_metrics["eval/loss"]) == eval_logs[6]["eval_loss"]
    assert float(trainer.callback_metrics["train_loss"]) == history[-1]["train_loss"]
