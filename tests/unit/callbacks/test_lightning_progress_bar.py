"""Lightning's own progress bars on an HF run, and Lightning's console output (``hf_lightning.console``).

The run: 64 rows, batch 4, gradient accumulation 2, so 8 optimizer steps per epoch, stopped by ``max_steps=3``.
Lightning alone would leave its bar at "3/8"; the bar must count the 3 optimizer steps to a total of 3 and show
HF's last logged loss and learning rate.
"""

from __future__ import annotations

import contextlib
import io
import logging

import pytest
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

from hf_lightning import HFDataModule, HFLightningModule, TrainingArguments, build_lightning_trainer
from hf_lightning.console import VERBOSE_ENV
from tests.helpers.models import RegressionModel, regression_data


class _TQDM(TQDMProgressBar):
    def on_train_epoch_end(self, trainer, pl_module):
        self.epochs = [*getattr(self, "epochs", []), (self.train_progress_bar.n, self.train_progress_bar.total)]
        super().on_train_epoch_end(trainer, pl_module)

    def on_train_end(self, trainer, pl_module):
        bar = self.train_progress_bar
        self.final = (bar.n, bar.total, bar.postfix)
        super().on_train_end(trainer, pl_module)


class _Rich(RichProgressBar):
    def on_train_end(self, trainer, pl_module):
        task = self.progress.tasks[self.train_progress_bar_id]
        self.final = (task.completed, task.total, dict(self._metric_component._metrics))
        super().on_train_end(trainer, pl_module)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("kind,verbose", [("tqdm", False), ("rich", True)])
def test_lightning_bar_counts_optimizer_steps_to_the_real_total_and_shows_loss_and_lr(tmp_path, monkeypatch, kind,
                                                                                         verbose):
    """Also: Lightning's banners ("`Trainer.fit` stopped ...") are hidden unless ``HF_LIGHTNING_VERBOSE=1``."""
    if verbose:
        monkeypatch.setenv(VERBOSE_ENV, "1")
    else:
        monkeypatch.delenv(VERBOSE_ENV, raising=False)
    records = _Records()
    lightning_logger = logging.getLogger("lightning.pytorch")
    lightning_logger.addHandler(records)
    out = io.StringIO()
    bar = _TQDM() if kind == "tqdm" else _Rich(console_kwargs={"file": out, "force_terminal": True, "width": 200})
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             max_steps=3, logging_steps=1, learning_rate=5e-5, save_strategy="no", report_to="none",
                             use_cpu=True)
    try:
        with contextlib.redirect_stdout(out):
            trainer = build_lightning_trainer(args, callbacks=[bar])
            trainer.fit(HFLightningModule(RegressionModel(), args),
                        datamodule=HFDataModule(args, train_dataset=regression_data(n=64)))
    finally:
        lightning_logger.removeHandler(records)
    assert trainer.num_training_batches == 8
    last = [e for e in trainer.callbacks[0].state.log_history if "loss" in e][-1]
    completed, total, postfix = bar.final
    assert (completed, total) == (3, 3)
    if kind == "tqdm":
        assert f"learning_rate={last['learning_rate']:.3g}" in postfix and "loss=" in postfix
        assert "3/3" in out.getvalue()
    else:
        assert postfix["learning_rate"] == f"{last['learning_rate']:.3g}"
        assert postfix["loss"] == pytest.approx(last["loss"])
        assert "3/3" in out.getvalue() and "learning_rate:" in out.getvalue()
    stopped = any("`Trainer.fit` stopped" in m for m in records.messages)
    assert stopped == verbose


def test_lightning_bar_after_a_mid_epoch_resume_counts_only_the_steps_left(tmp_path):
    """Resumed from checkpoint-2 of 8-step epochs: the resumed epoch's bar runs 6 steps to a total of 6 (Lightning:
    6/8), the next epoch 8 of 8."""
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                num_train_epochs=2, logging_steps=1, save_steps=2, report_to="none", use_cpu=True)
    first_args = TrainingArguments(**base, max_steps=2)
    build_lightning_trainer(first_args).fit(HFLightningModule(RegressionModel(), first_args),
                                            datamodule=HFDataModule(first_args, train_dataset=regression_data(n=64)))
    args = TrainingArguments(**base)
    bar = _TQDM()
    with contextlib.redirect_stdout(io.StringIO()):
        trainer = build_lightning_trainer(args, callbacks=[bar])
        trainer.fit(HFLightningModule(RegressionModel(), args),
                    datamodule=HFDataModule(args, train_dataset=regression_data(n=64)),
                    ckpt_path=str(tmp_path / "checkpoint-2"))
    assert trainer.global_step == 16
    assert bar.epochs == [(6, 6), (8, 8)]
