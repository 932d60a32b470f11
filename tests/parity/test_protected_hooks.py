"""HF's protected members that subclasses override: ``_maybe_log_save_evaluate``, ``_load_from_checkpoint``,
``_save``, ``_set_signature_columns_if_needed``, ``_remove_unused_columns``.

Each override is written once as a mixin and mixed into ``transformers.Trainer`` and ``hf_lightning.Trainer``
(dropout on); the mixins record their calls, so a silently ignored override fails even where the default happens
to give the same numbers.
"""

from __future__ import annotations

import os
import shutil

import torch

from tests.helpers.models import DictDataset, lm_data, tiny_gpt2
from tests.helpers.parity import assert_parity, run, run_pair

BASE = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=6, logging_steps=2,
            learning_rate=3e-3, save_strategy="no")


def _record(trainer, name: str, value=None) -> None:
    trainer.__dict__.setdefault("calls", []).append((name, value))


def _files(folder: str) -> list[str]:
    return sorted(os.listdir(folder))


# ---------------------------------------------------------------------------------------------- step end
class _ExtraLogs:
    """The common pattern: add a value to the training log, then let HF do its work."""

    def _maybe_log_save_evaluate(self, tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, start_time,
                                 learning_rate=None):
        if self.control.should_log and self.state.global_step > self._globalstep_last_logged:
            self.log({"loss_sum_since_last_log": tr_loss.item(), "lr_passed": learning_rate})
        _record(self, "step_end", self.state.global_step)
        super()._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, start_time,
                                         learning_rate=learning_rate)


class _WrittenOut:
    """HF's step end written out in the subclass (no ``super()``), as subclasses copied from HF's source do; it
    adds the mean loss over the steps since the last log as ``my_loss``."""

    def _maybe_log_save_evaluate(self, tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, start_time,
                                 learning_rate=None):
        _record(self, "step_end", self.state.global_step)
        if self.control.should_log and self.state.global_step > self._globalstep_last_logged:
            logs = {}
            tr_loss_scalar = tr_loss.mean().item()
            tr_loss -= tr_loss
            logs["my_loss"] = round(tr_loss_scalar / (self.state.global_step - self._globalstep_last_logged), 4)
            if grad_norm is not None:
                logs["grad_norm"] = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm
            logs["learning_rate"] = learning_rate if learning_rate is not None else self._get_learning_rate()
            self._total_loss_scalar += tr_loss_scalar
            self._globalstep_last_logged = self.state.global_step
            self.store_flos()
            self.log(logs, start_time)
        if self.control.should_evaluate:
            metrics = self._evaluate(trial, ignore_keys_for_eval)
            self._determine_best_metric(metrics=metrics, trial=trial)
        if self.control.should_save:
            self._save_checkpoint(model, trial)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)


def _trainers(mixin):
    import transformers

    import hf_lightning

    return (type("HFSub", (mixin, transformers.Trainer), {}), type("OursSub", (mixin, hf_lightning.Trainer), {}))


def _eval_run_args(**extra) -> dict:
    return dict(BASE, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2, save_total_limit=2,
                load_best_model_at_end=True, metric_for_best_model="eval_loss", **extra)


def test_maybe_log_save_evaluate_override_adds_logs(tmp_path):
    train, evald = lm_data(n_train=24, n_eval=8)
    hf_cls, ours_cls = _trainers(_ExtraLogs)
    hf, ours = run_pair(tiny_gpt2, tmp_path, train_dataset=train, eval_dataset=evald, args=_eval_run_args(),
                        hf_trainer_cls=hf_cls, ours_trainer_cls=ours_cls)
    assert any("loss_sum_since_last_log" in entry for entry in hf.log_history)
    assert_parity(hf, ours)
    # After every optimizer step and at the end of every epoch, in HF's order.
    assert ours.trainer.calls == hf.trainer.calls
    assert hf.checkpoints() == ours.checkpoints()


def test_maybe_log_save_evaluate_written_out_without_super(tmp_path):
    train, evald = lm_data(n_train=24, n_eval=8)
    hf_cls, ours_cls = _trainers(_WrittenOut)
    hf, ours = run_pair(tiny_gpt2, tmp_path, train_dataset=train, eval_dataset=evald, args=_eval_run_args(),
                        hf_trainer_cls=hf_cls, ours_trainer_cls=ours_cls)
    assert any("my_loss" in entry for entry in hf.log_history)
    assert not any("loss" in entry for entry in hf.log_history)
    assert_parity(hf, ours)
    assert ours.trainer.calls == hf.trainer.calls
    assert hf.checkpoints() == ours.checkpoints()
    assert ours.trainer.state.best_model_checkpoint.endswith(os.path.basename(hf.trainer.state.best_model_checkpoint))


# ---------------------------------------------------------------------------------------------- resume
class _LoadsAndRecords:
    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        _record(self, "load", (os.path.basename(resume_from_checkpoint), model is None))
        super()._load_from_checkpoint(resume_from_checkpoint, model)


def test_load_from_checkpoint_override_is_used_on_resume(tmp_path):
    train, _ = lm_data(n_train=24, n_eval=0)
    args = dict(BASE, save_strategy="steps", save_steps=3)
    source = run("hf", tiny_gpt2, tmp_path / "source", train_dataset=train, args=args)
    hf_cls, ours_cls = _trainers(_LoadsAndRecords)
    results = []
    for kind, cls in (("hf", hf_cls), ("ours", ours_cls)):
        out = tmp_path / f"{kind}_resumed"
        out.mkdir()
        shutil.copytree(f"{source.output_dir}/checkpoint-3", out / kind / "checkpoint-3")
        results.append(run(kind, tiny_gpt2, out, train_dataset=train, args=args, trainer_cls=cls, resume=True))
    hf, ours = results
    assert hf.trainer.calls == [("load", ("checkpoint-3", True))]
    assert ours.trainer.calls == hf.trainer.calls
    assert_parity(hf, ours)


# ---------------------------------------------------------------------------------------------- saving
class _SavesExtraFile:
    def _save(self, output_dir=None, state_dict=None):
        _record(self, "save", os.path.basename(output_dir))
        super()._save(output_dir, state_dict)
        with open(os.path.join(output_dir, "extra.txt"), "w") as f:
            f.write(f"step {self.state.global_step}\n")


def test_save_override_writes_every_checkpoint_and_save_model(tmp_path):
    train, _ = lm_data(n_train=24, n_eval=0)
    hf_cls, ours_cls = _trainers(_SavesExtraFile)
    hf, ours = run_pair(tiny_gpt2, tmp_path, train_dataset=train, args=dict(BASE, save_strategy="steps", save_steps=3),
                        hf_trainer_cls=hf_cls, ours_trainer_cls=ours_cls)
    assert_parity(hf, ours)
    assert hf.checkpoints() == ours.checkpoints() == ["checkpoint-3", "checkpoint-6"]
    for name in hf.checkpoints():
        with open(os.path.join(ours.output_dir, name, "extra.txt")) as f:
            assert f.read() == f"step {name.split('-')[1]}\n"
        # training_args.json: ours only, the safe-loading copy of training_args.bin (docs/checkpoints.md).
        ours_files = [f for f in _files(os.path.join(ours.output_dir, name)) if f != "training_args.json"]
        assert ours_files == _files(os.path.join(hf.output_dir, name))
    # HF passes the checkpoint folder itself; ours writes into the folder being staged, then renames it.
    assert [value.startswith("checkpoint-") or "checkpoint-" in value for _, value in ours.trainer.calls] == \
        [True, True]
    for result in (hf, ours):
        result.trainer.save_model(os.path.join(result.output_dir, "final"))
    ours_final = [f for f in _files(os.path.join(ours.output_dir, "final")) if f != "training_args.json"]
    assert ours_final == _files(os.path.join(hf.output_dir, "final"))
    assert ("save", "final") in ours.trainer.calls


# ---------------------------------------------------------------------------------------------- columns
def _rows_with_mask_from(n: int = 24) -> list[dict]:
    train, _ = lm_data(n_train=n, n_eval=0)
    return [{"input_ids": row["input_ids"].tolist(), "labels": row["labels"].tolist(), "mask_from": 3 + i % 5,
             "text": f"row {i}"} for i, row in enumerate(train.rows)]


def _masking_collator(features: list[dict]) -> dict:
    """Needs ``mask_from``, a column the model's forward does not take: labels before it are ignored."""
    ids = torch.tensor([f["input_ids"] for f in features])
    labels = torch.tensor([f["labels"] for f in features])
    for i, f in enumerate(features):
        labels[i, : f["mask_from"]] = -100
    return {"input_ids": ids, "labels": labels}


class _KeepsMaskColumn:
    def _set_signature_columns_if_needed(self):
        _record(self, "signature")
        if self._signature_columns is None:
            self._signature_columns = ["input_ids", "labels", "mask_from"]


def test_signature_columns_override_keeps_a_column(tmp_path):
    import datasets

    hf_cls, ours_cls = _trainers(_KeepsMaskColumn)
    for kind, data in (("torch", DictDataset(_rows_with_mask_from())),
                       ("datasets", datasets.Dataset.from_list(_rows_with_mask_from()))):
        hf, ours = run_pair(tiny_gpt2, tmp_path / kind, train_dataset=data, args=BASE,
                            trainer_kwargs=dict(data_collator=_masking_collator),
                            hf_trainer_cls=hf_cls, ours_trainer_cls=ours_cls)
        assert ("signature", None) in ours.trainer.calls
        assert_parity(hf, ours)


class _FiltersAndRecords:
    def _remove_unused_columns(self, dataset, description=None):
        _record(self, "remove_unused_columns", (description, tuple(dataset.column_names)))
        return super()._remove_unused_columns(dataset, description).remove_columns(["mask_from"])


def test_remove_unused_columns_override_filters_datasets(tmp_path):
    import datasets

    train = datasets.Dataset.from_list(_rows_with_mask_from())
    evald = datasets.Dataset.from_list(_rows_with_mask_from(8))
    hf_cls, ours_cls = _trainers(type("Both", (_FiltersAndRecords, _KeepsMaskColumn), {}))
    hf, ours = run_pair(tiny_gpt2, tmp_path, train_dataset=train, eval_dataset=evald,
                        args=dict(BASE, eval_strategy="steps", eval_steps=3),
                        hf_trainer_cls=hf_cls, ours_trainer_cls=ours_cls)
    recorded = [call for call in hf.trainer.calls if call[0] == "remove_unused_columns"]
    assert ("remove_unused_columns", ("Training", ("input_ids", "labels", "mask_from", "text"))) in recorded
    assert ("remove_unused_columns", ("Evaluation", ("input_ids", "labels", "mask_from", "text"))) in recorded
    assert {c for c in ours.trainer.calls if c[0] == "remove_unused_columns"} == set(recorded)
    assert_parity(hf, ours)
