"""``report_to`` → Lightning loggers; TensorBoard output compared with HF's ``TensorBoardCallback`` output.

The TensorBoard event files of the same run through transformers.Trainer and hf_lightning.Trainer are read back
with tensorboard's ``EventAccumulator``: same scalar tags at the same steps with the same values, the same text
summaries (``args``, ``model_config``) and HF's folder layout.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import re
import socket
import warnings

import pytest
import torch

from hf_lightning.loggers import HFTensorBoardLogger, LOGGER_REGISTRY, available_report_to, build_loggers
from tests.helpers.models import classification_data, tiny_bert_classifier

TIMED = ("runtime", "_per_second")


def _args(lib, tmp_path, kind, **kw):
    base = dict(output_dir=str(tmp_path / kind), use_cpu=True, seed=42, per_device_train_batch_size=4,
                per_device_eval_batch_size=4, num_train_epochs=1, logging_steps=2, eval_strategy="steps",
                eval_steps=3, save_strategy="no", report_to="tensorboard")
    return lib.TrainingArguments(**{**base, **kw})


def _train_and_evaluate(kind, tmp_path, **kw):
    import transformers

    import hf_lightning

    torch.set_num_threads(1)
    lib = transformers if kind == "hf" else hf_lightning
    trainer = lib.Trainer(model=tiny_bert_classifier(), args=_args(lib, tmp_path, kind, **kw),
                          train_dataset=classification_data(n=24), eval_dataset=classification_data(n=8, seed=5))
    trainer.train()
    trainer.evaluate()
    return trainer


def _read_events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(folder)
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    texts = {tag.split("/")[0]: acc.Tensors(tag)[0].tensor_proto.string_val[0].decode()
             for tag in acc.Tags()["tensors"]}
    return scalars, texts


def _run_folder(output_dir):
    folders = glob.glob(os.path.join(output_dir, "runs", "*"))
    assert len(folders) == 1, folders
    return folders[0]


def _assert_same_tensorboard(hf_dir, our_dir):
    hf_scalars, hf_texts = _read_events(hf_dir)
    our_scalars, our_texts = _read_events(our_dir)
    assert sorted(our_scalars) == sorted(hf_scalars)
    for tag, hf_points in hf_scalars.items():
        ours = our_scalars[tag]
        assert [s for s, _ in ours] == [s for s, _ in hf_points], tag
        if not tag.endswith(TIMED):
            assert [v for _, v in ours] == pytest.approx([v for _, v in hf_points], rel=1e-5), tag
    assert sorted(our_texts) == sorted(hf_texts) == ["args", "model_config"]
    assert our_texts["model_config"] == hf_texts["model_config"]
    hf_args, our_args = json.loads(hf_texts["args"]), json.loads(our_texts["args"])
    assert {k for k in hf_args if hf_args[k] != our_args.get(k)} == {"output_dir"}


def test_tensorboard_matches_hf(tmp_path):
    """Training logs, evaluations during training and a final evaluate(): HF's tags, steps, values and texts."""
    hf = _train_and_evaluate("hf", tmp_path, disable_tqdm=False)
    ours = _train_and_evaluate("ours", tmp_path, disable_tqdm=False)
    hf_dir, our_dir = _run_folder(hf.args.output_dir), _run_folder(ours.args.output_dir)
    assert re.fullmatch(r"[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_" + re.escape(socket.gethostname()),
                        os.path.basename(our_dir))
    _assert_same_tensorboard(hf_dir, our_dir)
    scalars, _ = _read_events(our_dir)
    assert {"train/loss", "train/learning_rate", "train/epoch", "train/grad_norm", "eval/loss",
            "train/train_loss", "train/total_flos"} <= set(scalars)
    assert scalars["eval/loss"][-1][0] == ours.state.global_step  # the evaluate() after training
    assert all(name.startswith("events.out.tfevents.") for name in os.listdir(our_dir))


def test_tensorboard_matches_hf_with_printer_callback(tmp_path):
    hf = _train_and_evaluate("hf", tmp_path, disable_tqdm=True)
    ours = _train_and_evaluate("ours", tmp_path, disable_tqdm=True)
    _assert_same_tensorboard(_run_folder(hf.args.output_dir), _run_folder(ours.args.output_dir))


@pytest.mark.parametrize("source", ["logging_dir", "env"])
def test_tensorboard_folder_from_logging_dir_or_env(tmp_path, monkeypatch, source):
    import hf_lightning

    target = tmp_path / "tb_here"
    kw = {}
    if source == "env":
        monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(target))
    else:
        kw["logging_dir"] = str(target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # logging_dir is a 4.x name (mapped with a warning)
        args = _args(hf_lightning, tmp_path, "ours", **kw)
    (logger,) = build_loggers(args)
    assert isinstance(logger, HFTensorBoardLogger)
    assert os.path.normpath(logger.log_dir) == str(target)


def test_csv_logger_gets_hf_tags_and_the_final_evaluate(tmp_path):
    import hf_lightning

    trainer = hf_lightning.Trainer(model=tiny_bert_classifier(),
                                   args=_args(hf_lightning, tmp_path, "csv", report_to=["csv"], run_name="exp1",
                                              disable_tqdm=True),
                                   train_dataset=classification_data(n=16), eval_dataset=classification_data(n=8))
    trainer.train()
    trainer.evaluate()
    with open(tmp_path / "csv" / "csv_logs" / "exp1" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert {"train/loss", "eval/loss", "train/epoch", "step"} <= set(rows[0])
    evals = [r for r in rows if r["eval/loss"]]
    assert len(evals) == 3 and int(evals[-1]["step"]) == trainer.state.global_step
    losses = [e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e]
    assert [float(r["eval/loss"]) for r in evals] == pytest.approx(losses, rel=1e-6)


# ---------------------------------------------------------------------------------------------- registry
def _pretend_installed(monkeypatch, *modules):
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name, *a, **k):
        if name in modules:
            return object()
        if name in ("wandb", "mlflow", "comet_ml", "dvclive"):
            return None
        return real(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize("name,install", [("wandb", "pip install wandb"), ("mlflow", "pip install mlflow"),
                                          ("comet_ml", "pip install comet-ml"),
                                          ("dvclive", "pip install transformers dvclive")])
def test_missing_logger_package_is_a_clear_error_before_work(tmp_path, monkeypatch, name, install):
    import hf_lightning

    _pretend_installed(monkeypatch)
    args = _args(hf_lightning, tmp_path, "ours", report_to=["tensorboard", name])
    with pytest.raises(ValueError, match=f"report_to contains '{name}'.*Run `{re.escape(install)}`"):
        build_loggers(args)
    # At Trainer(...), before anything is written.
    with pytest.raises(ValueError, match=f"report_to contains '{name}'"):
        hf_lightning.Trainer(model=tiny_bert_classifier(), args=args, train_dataset=classification_data(8),
                             eval_dataset=classification_data(4))
    assert not os.path.exists(tmp_path / "ours")


def test_unknown_logger_name_is_refused(tmp_path):
    import hf_lightning

    with pytest.raises(ValueError, match=r"report_to='clearml2' is not supported by hf_lightning \(nor by HF\)\. "
                                         r"Supported: .*'clearml', .*'neptune', .*'tensorboard', 'trackio'"):
        build_loggers(_args(hf_lightning, tmp_path, "x", report_to=["clearml2"]))


def test_all_means_what_hf_means(tmp_path, monkeypatch):
    import transformers

    import hf_lightning

    # HF's "all" in this environment, in HF's order (the HF-callback integrations among them need transformers).
    assert available_report_to() == transformers.TrainingArguments(str(tmp_path), report_to="all").report_to
    assert hf_lightning.TrainingArguments(str(tmp_path), report_to="all").report_to == available_report_to()
    _pretend_installed(monkeypatch, "wandb", "mlflow")
    assert [n for n in available_report_to() if n in LOGGER_REGISTRY] == ["mlflow", "tensorboard", "wandb"]
    assert "csv" not in available_report_to() and "flyte" not in available_report_to()
    args = type("Args", (), {"report_to": "all", "output_dir": str(tmp_path)})()
    monkeypatch.setitem(LOGGER_REGISTRY, "wandb", LOGGER_REGISTRY["wandb"].__class__(
        lambda a: _FakeLogger(kind="wandb"), ("wandb",), "pip install wandb"))
    monkeypatch.setitem(LOGGER_REGISTRY, "mlflow", LOGGER_REGISTRY["mlflow"].__class__(
        lambda a: _FakeLogger(kind="mlflow"), ("mlflow",), "pip install mlflow"))
    built = build_loggers(args)
    assert [type(b).__name__ for b in built] == ["_FakeLogger", "HFTensorBoardLogger", "_FakeLogger"]


def test_hf_integrations_run_hfs_own_callbacks_in_hfs_place(tmp_path):
    """trackio and clearml (no Lightning logger): transformers' own callbacks, where HF's Trainer puts them."""
    pytest.importorskip("trackio")
    pytest.importorskip("clearml")
    import transformers

    import hf_lightning
    from tests.helpers.recorder import EventRecorder

    lists = {}
    for kind, lib in (("hf", transformers), ("ours", hf_lightning)):
        args = lib.TrainingArguments(str(tmp_path / kind), report_to=["trackio", "clearml"], disable_tqdm=True,
                                     trackio_static_space_id=False, use_cpu=True)
        trainer = lib.Trainer(model=tiny_bert_classifier(), args=args, callbacks=[EventRecorder()])
        lists[kind] = [type(cb) for cb in trainer.callback_handler.callbacks]
    assert [c.__name__ for c in lists["ours"]] == [c.__name__ for c in lists["hf"]] == [
        "DefaultFlowCallback", "TrackioCallback", "ClearMLCallback", "EventRecorder", "PrinterCallback"]
    assert lists["ours"][1:3] == lists["hf"][1:3]  # the very classes of transformers.integrations
    assert build_loggers(args) == []


class _FakeLogger:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


@pytest.mark.parametrize("name,cls,expected", [
    ("wandb", "WandbLogger", {"name": "exp1", "project": "huggingface"}),
    ("mlflow", "MLFlowLogger", {"run_name": "exp1", "experiment_name": "Default"}),
    ("comet_ml", "CometLogger", {"name": "exp1"}),
])
def test_run_name_reaches_the_tracker(tmp_path, monkeypatch, name, cls, expected):
    import lightning.pytorch.loggers as pl_loggers

    import hf_lightning

    _pretend_installed(monkeypatch, name)
    monkeypatch.setattr(pl_loggers, cls, _FakeLogger)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    (logger,) = build_loggers(_args(hf_lightning, tmp_path, "x", report_to=[name], run_name="exp1"))
    assert expected.items() <= logger.kwargs.items()


def test_report_to_none_builds_no_logger(tmp_path):
    import hf_lightning

    assert build_loggers(_args(hf_lightning, tmp_path, "x", report_to="none")) == []


def test_kubeflow_is_added_inside_a_kubeflow_trainjob_as_in_hf(tmp_path, monkeypatch):
    import transformers

    import hf_lightning

    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "https://127.0.0.1:9")
    for report_to in ("none", ["csv"]):
        ours = hf_lightning.TrainingArguments(str(tmp_path), report_to=report_to).report_to
        hf = transformers.TrainingArguments(str(tmp_path), report_to="none" if report_to == "none" else []).report_to
        assert ours == [*([] if report_to == "none" else ["csv"]), *hf] and hf == ["kubeflow"]
    monkeypatch.setenv("DISABLE_KUBEFLOW_INTEGRATION", "true")
    assert hf_lightning.TrainingArguments(str(tmp_path)).report_to == []


def test_dvclive_logs_the_last_model_through_hf_lightning(tmp_path, monkeypatch):
    """``HF_DVCLIVE_LOG_MODEL=true``: at train end HF's callback saves the model to ``output_dir/last`` (through a
    throwaway ``transformers.Trainer`` under HF, here through hf_lightning), logs it as a DVCLive model artifact and
    ends the run. Matching HF's output (with ``output_dir/best``) is ``tests/parity/test_dvclive_parity.py``."""
    pytest.importorskip("dvclive")
    import yaml
    from dvclive import Live
    from safetensors.torch import load_file

    import hf_lightning
    from tests.helpers.dvc import dvc_workspace

    dvc_workspace(tmp_path / "repo", monkeypatch)
    ended = []
    end = Live.end
    monkeypatch.setattr(Live, "end", lambda live: (ended.append(live), end(live))[1])
    torch.set_num_threads(1)
    args = _args(hf_lightning, tmp_path, "ours", report_to=["dvclive"], output_dir="out", eval_strategy="no",
                 disable_tqdm=True)
    # A collator with a tokenizer and no processing_class: HF's throwaway Trainer has its own default collator, so
    # (unlike save_model) no tokenizer is saved with the model.
    from transformers import DataCollatorWithPadding

    from tests.parity.test_data_parity import word_tokenizer

    trainer = hf_lightning.Trainer(model=tiny_bert_classifier(), args=args, train_dataset=classification_data(n=8),
                                   data_collator=DataCollatorWithPadding(word_tokenizer()))
    trainer.train()
    after_train = torch.rand(3)
    # HF's throwaway Trainer reseeds at its construction, as Trainer(...) does.
    torch.manual_seed(42)
    assert torch.equal(after_train, torch.rand(3))

    weights = trainer.model.state_dict()
    for folder in ("out/last", "dvclive/artifacts/last"):
        assert {"config.json", "model.safetensors", "training_args.bin"} <= set(os.listdir(folder))
        assert "tokenizer.json" not in os.listdir(folder)
        saved = load_file(os.path.join(folder, "model.safetensors"))
        assert saved and saved.keys() <= weights.keys() and all(torch.equal(saved[k], weights[k]) for k in saved)
    trainer.save_model("saved")
    assert "tokenizer.json" in os.listdir("saved")
    with open("dvc.yaml") as fh:
        assert yaml.safe_load(fh)["artifacts"] == {"last": {"path": "dvclive/artifacts/last", "type": "model"}}
    with open("dvclive/metrics.json") as fh:
        assert json.load(fh)["train"]["loss"] == pytest.approx(trainer.state.log_history[-1]["train_loss"])
    # Then HF's on_train_end goes on: live.end(), once.
    assert ended == [trainer.callback_handler.callbacks[1].live]
