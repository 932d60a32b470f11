"""HFLightningModule inside a ``lightning.Trainer`` the user built (no ``build_lightning_trainer``): what
``configure_callbacks`` brings, the settings it derives, and the conflicting settings it refuses before any step."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from hf_lightning import HFDataModule, HFLightningModule, TrainerCallback, TrainingArguments, build_lightning_trainer
from hf_lightning.callbacks.training_flow import HFFlowCallback
from hf_lightning.checkpointing.io import HFCheckpointIO
from tests.helpers.models import RegressionModel, regression_data


def _args(output_dir, **kw):
    base = dict(output_dir=str(output_dir), per_device_train_batch_size=4, num_train_epochs=2, logging_steps=2,
                save_steps=3, learning_rate=1e-2, report_to="none", use_cpu=True, disable_tqdm=True, seed=7)
    return TrainingArguments(**{**base, **kw})


def _trainer(**kw):
    return pl.Trainer(**{"accelerator": "cpu", "enable_progress_bar": False, "enable_model_summary": False, **kw})


class _Events(TrainerCallback):
    def __init__(self):
        self.events = []

    def on_init_end(self, args, state, control, **kwargs):
        self.events.append("on_init_end")

    def on_prediction_step(self, args, state, control, **kwargs):
        self.events.append("on_prediction_step")

    def on_train_begin(self, args, state, control, **kwargs):
        self.events.append("on_train_begin")

    def on_save(self, args, state, control, **kwargs):
        self.events.append(f"on_save {state.global_step}")


# (lightning.Trainer keywords, TrainingArguments keywords, texts the error must show)
CONFLICTS = {
    "accumulate_grad_batches": (dict(accumulate_grad_batches=2), dict(gradient_accumulation_steps=2),
                                ["lightning.Trainer(accumulate_grad_batches=2)", "gradient_accumulation_steps"]),
    "gradient_clip_val": (dict(gradient_clip_val=0.5), {}, ["lightning.Trainer(gradient_clip_val=0.5)",
                                                            "max_grad_norm"]),
    "val_check_interval_batches": (dict(val_check_interval=2), dict(eval_strategy="steps", eval_steps=2),
                                   ["lightning.Trainer(val_check_interval=2)", "eval_strategy / eval_steps"]),
    "val_check_interval_fraction": (dict(val_check_interval=0.5), {}, ["lightning.Trainer(val_check_interval=0.5)"]),
    "check_val_every_n_epoch": (dict(check_val_every_n_epoch=2), dict(eval_strategy="epoch"),
                                ["lightning.Trainer(check_val_every_n_epoch=2)", "eval_strategy='epoch'"]),
    "max_steps": (dict(max_steps=30), {}, ["lightning.Trainer(max_steps=30) differs from "
                                           "TrainingArguments(max_steps=-1, num_train_epochs=2",
                                           "set TrainingArguments(max_steps=30)"]),
    "max_steps_vs_args_max_steps": (dict(max_steps=5), dict(max_steps=4), ["lightning.Trainer(max_steps=5)"]),
    "max_epochs": (dict(max_epochs=5), {}, ["lightning.Trainer(max_epochs=5)",
                                            "set TrainingArguments(num_train_epochs=5)"]),
    "max_epochs_beside_args_max_steps": (dict(max_epochs=2), dict(max_steps=4), ["lightning.Trainer(max_epochs=2)",
                                                                                 "max_steps > 0 overrides epochs"]),
    "lightning_mixed_precision": (dict(precision="bf16-mixed"), {}, ["lightning.Trainer(precision='bf16-mixed')",
                                                                     "set bf16=True", "HFMixedPrecision('bf16-mixed'"]),
    "bf16_args_in_fp32_trainer": ({}, dict(bf16=True), ["TrainingArguments(bf16=True)", "precision='32-true'",
                                                        "plugins=[HFMixedPrecision('bf16-mixed', 'cpu')]"]),
    "default_model_checkpoint": ({}, {}, ["ModelCheckpoint without `monitor`",
                                          "lightning.Trainer(enable_checkpointing=False)"]),
    "monitorless_model_checkpoint": (dict(callbacks=[ModelCheckpoint(every_n_train_steps=1)]), {},
                                     ["ModelCheckpoint without `monitor`", "ModelCheckpoint(monitor=...)"]),
}


@pytest.mark.parametrize("name", list(CONFLICTS))
def test_conflicting_trainer_setting_is_refused_before_any_step_or_write(tmp_path, monkeypatch, name):
    trainer_kw, args_kw, texts = CONFLICTS[name]
    monkeypatch.chdir(tmp_path)  # Lightning's default_root_dir (lightning_logs/, .ckpt files) is the cwd
    if not ({"enable_checkpointing", "callbacks"} & set(trainer_kw)) and name != "default_model_checkpoint":
        trainer_kw = dict(trainer_kw, enable_checkpointing=False)
    args = _args(tmp_path / "out", **args_kw)
    model = RegressionModel()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    events = _Events()
    module = HFLightningModule(model, args, callbacks=[events])
    trainer = _trainer(**trainer_kw)  # Lightning's default logger: it would write lightning_logs/ in the cwd
    with pytest.raises(ValueError) as raised:
        trainer.fit(module, datamodule=HFDataModule(args, train_dataset=regression_data(),
                                                    eval_dataset=regression_data(8)))
    for text in texts:
        assert text in str(raised.value)
    assert list(tmp_path.iterdir()) == []
    assert trainer.global_step == 0 and events.events == []
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_all_conflicts_are_reported_at_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = _args(tmp_path / "out")
    trainer = _trainer(accumulate_grad_batches=3, gradient_clip_val=1.0, max_steps=9)
    with pytest.raises(ValueError) as raised:
        trainer.fit(HFLightningModule(RegressionModel(), args),
                    datamodule=HFDataModule(args, train_dataset=regression_data()))
    message = str(raised.value)
    for setting in ("accumulate_grad_batches=3", "gradient_clip_val=1.0", "max_steps=9", "ModelCheckpoint"):
        assert setting in message
    assert list(tmp_path.iterdir()) == []


def test_user_built_trainer_gets_hf_semantics_from_the_module(tmp_path, monkeypatch):
    """Derived settings: no sanity-check evaluation, HF's evaluation and save cadence, HFCheckpointIO, the flow callback
    once and first; a second fit on the same trainer is accepted (the plan's limits are the module's own)."""
    monkeypatch.chdir(tmp_path)
    args = _args(tmp_path / "out", eval_strategy="steps", eval_steps=3, save_total_limit=2,
                 per_device_eval_batch_size=8)
    events = _Events()
    module = HFLightningModule(RegressionModel(), args, callbacks=[events])
    user_callback = pl.Callback()
    trainer = _trainer(enable_checkpointing=False, logger=False, callbacks=[user_callback], max_steps=-1)
    datamodule = HFDataModule(args, train_dataset=regression_data(), eval_dataset=regression_data(8))
    trainer.fit(module, datamodule=datamodule)
    # 24 rows / 4 = 6 steps per epoch, 2 epochs; eval every 3 steps over one batch of 8; saves at 3, 6, 9, 12.
    assert trainer.global_step == 12
    assert events.events[:2] == ["on_init_end", "on_train_begin"]  # no sanity-check validation before training
    assert events.events.count("on_prediction_step") == 4
    assert [e for e in events.events if e.startswith("on_save")] == [f"on_save {s}" for s in (3, 6, 9, 12)]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoint-12", "checkpoint-9"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert isinstance(trainer.strategy.checkpoint_io, HFCheckpointIO)
    flows = [cb for cb in trainer.callbacks if isinstance(cb, HFFlowCallback)]
    assert flows == [module.flow] and trainer.callbacks[0] is module.flow
    assert [e["step"] for e in module.trainer_state.log_history if "eval_loss" in e] == [3, 6, 9, 12]
    # The same module and trainer again: no second flow callback, no limit conflict.
    trainer.fit(module, datamodule=datamodule)
    assert [cb for cb in trainer.callbacks if isinstance(cb, HFFlowCallback)] == [module.flow]
    assert events.events.count("on_init_end") == 1


def test_module_callbacks_join_the_flow_of_build_lightning_trainer(tmp_path):
    args = _args(tmp_path / "out", save_strategy="no", max_steps=2)
    events = _Events()
    trainer = build_lightning_trainer(args, enable_progress_bar=False)
    module = HFLightningModule(RegressionModel(), args, callbacks=[events])
    trainer.fit(module, datamodule=HFDataModule(args, train_dataset=regression_data()))
    (flow,) = [cb for cb in trainer.callbacks if isinstance(cb, HFFlowCallback)]
    assert module.flow is None and events in flow.handler.callbacks
    assert "on_train_begin" in events.events and trainer.global_step == 2


def test_module_refuses_lightning_callbacks(tmp_path):
    with pytest.raises(TypeError, match=r"pass them to lightning.Trainer\(callbacks=...\)"):
        HFLightningModule(RegressionModel(), _args(tmp_path / "out"), callbacks=[pl.Callback()])


def test_settings_that_agree_with_the_arguments_are_accepted(tmp_path, monkeypatch):
    """HF's autocast plugin with bf16=True, max_steps equal to the arguments', Lightning's default val interval."""
    from hf_lightning.precision import HFMixedPrecision

    monkeypatch.chdir(tmp_path)
    args = _args(tmp_path / "out", bf16=True, max_steps=3, save_strategy="no")
    trainer = _trainer(plugins=[HFMixedPrecision("bf16-mixed", "cpu")], max_steps=3, logger=False,
                       val_check_interval=1.0, accumulate_grad_batches=1)
    module = HFLightningModule(RegressionModel(), args)
    trainer.fit(module, datamodule=HFDataModule(args, train_dataset=regression_data()))
    assert trainer.global_step == 3 and [e["step"] for e in module.trainer_state.log_history][-1] == 3


def test_a_checkpoint_io_the_user_chose_stays(tmp_path, monkeypatch):
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    class MyIO(TorchCheckpointIO):
        pass

    monkeypatch.chdir(tmp_path)
    args = _args(tmp_path / "out", max_steps=3)
    trainer = _trainer(plugins=[MyIO()], logger=False, enable_checkpointing=False)
    trainer.fit(HFLightningModule(RegressionModel(), args),
                datamodule=HFDataModule(args, train_dataset=regression_data()))
    assert type(trainer.strategy.checkpoint_io) is MyIO
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoint-3"]
