"""Streaming ``torchmetrics`` metrics (beyond HF): ``metrics=`` on ``HFLightningModule`` and ``Trainer``.

Accuracy from a streaming metric must equal HF's accuracy from a ``compute_metrics`` over the gathered arrays, and
nothing is gathered when only streaming metrics are asked for.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from hf_lightning import TrainerCallback
from hf_lightning.evaluation import EvalAccumulator, as_metric_collection, streaming_update_args
from tests.helpers.models import DictDataset, classification_data, pad_collator, tiny_bert_classifier

BASE = dict(report_to="none", use_cpu=True, disable_tqdm=True, seed=42)


def accuracy(p):
    """HF-style compute_metrics: accuracy over positions whose label is not -100."""
    preds, labels = p.predictions.argmax(-1), p.label_ids
    mask = labels != -100
    return {"accuracy": float((preds[mask] == labels[mask]).mean())}


def accuracy_metric(num_classes: int = 3):
    return MetricCollection({"accuracy": MulticlassAccuracy(num_classes=num_classes, average="micro",
                                                            ignore_index=-100)})


def _args(lib, tmp_path, name, **kw):
    return lib.TrainingArguments(output_dir=str(tmp_path / name), **{**BASE, **kw})


# ---------------------------------------------------------------------------------------------- the accumulator
def _eval_args(**kw):
    return SimpleNamespace(**{"eval_do_concat_batches": True, "eval_accumulation_steps": None,
                              "include_for_metrics": [], "batch_eval_metrics": False,
                              "logging_nan_inf_filter": True, **kw})


def _batches(n_batches: int = 4, batch: int = 5, classes: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand((), generator=g), torch.randn(batch, classes, generator=g),
             torch.randint(0, classes, (batch,), generator=g)) for _ in range(n_batches)]


def test_streaming_only_keeps_no_predictions_and_matches_gathered_accuracy():
    batches = _batches()
    streaming = EvalAccumulator(_eval_args(), metrics=accuracy_metric())
    gathering = EvalAccumulator(_eval_args(), compute_metrics=accuracy)
    for loss, logits, labels in batches:
        streaming.add(loss, logits, labels, batch_size=len(labels))
        gathering.add(loss, logits, labels, batch_size=len(labels))
        assert streaming.preds.tensors is None and streaming.labels.tensors is None
        assert streaming.inputs.tensors is None
    preds, labels, metrics, n = streaming.finalize("eval")
    assert preds is None and labels is None and n == 20
    _, _, expected, _ = gathering.finalize("eval")
    assert list(metrics) == ["eval_loss", "eval_accuracy"]
    assert metrics["eval_accuracy"] == pytest.approx(expected["eval_accuracy"], rel=1e-6)
    assert metrics["eval_loss"] == pytest.approx(expected["eval_loss"], rel=1e-6)


def test_streaming_next_to_compute_metrics_comes_after_its_keys():
    acc = EvalAccumulator(_eval_args(), compute_metrics=lambda p: {"n": len(p.label_ids)},
                          metrics={"acc": MulticlassAccuracy(num_classes=3, average="micro")})
    for loss, logits, labels in _batches(2):
        acc.add(loss, logits, labels, batch_size=len(labels))
    preds, _, metrics, _ = acc.finalize("eval", model_preparation_time=0.5)
    assert preds.shape == (10, 3)
    assert list(metrics) == ["eval_loss", "eval_model_preparation_time", "eval_n", "eval_acc"]


@pytest.mark.parametrize("logits,preprocessed,expected_shape", [
    (torch.randn(4, 3), False, (4,)),            # class logits -> argmax over the last dim
    (torch.randn(4, 7, 3), False, (4, 7)),       # token logits -> argmax per position
    (torch.randn(4), False, (4,)),               # one value per sample (regression): unchanged
    (torch.randn(4, 3), True, (4, 3)),           # preprocess_logits_for_metrics already decided
    (torch.randint(0, 3, (4,)), False, (4,)),    # integer predictions: unchanged
])
def test_streaming_update_args(logits, preprocessed, expected_shape):
    preds, target = streaming_update_args(logits, torch.zeros(4), preprocessed)
    assert preds.shape == expected_shape
    if not preprocessed and logits.is_floating_point() and logits.dim() >= 2:
        assert torch.equal(preds, logits.argmax(-1))


@pytest.mark.parametrize("logits,labels", [
    ((torch.randn(2, 5), torch.randn(2, 5)), (torch.zeros(2), torch.zeros(2))),   # question answering
    (torch.randn(2, 3), (torch.zeros(2), torch.zeros(2))),
])
def test_streaming_metrics_refuse_several_outputs(logits, labels):
    with pytest.raises(ValueError, match="one prediction tensor and one label tensor.*preprocess_logits_for_metrics"):
        streaming_update_args(logits, labels, preprocessed=False)


@pytest.mark.parametrize("value,names", [
    (MulticlassAccuracy(num_classes=3), ["MulticlassAccuracy"]),
    ({"acc": MulticlassAccuracy(num_classes=3), "mean": MeanMetric()}, ["acc", "mean"]),
    (None, None),
])
def test_as_metric_collection(value, names):
    collection = as_metric_collection(value)
    assert (collection is None) if names is None else sorted(collection.keys()) == sorted(names)


@pytest.mark.parametrize("value", [lambda p: {}, {"acc": lambda p: 1.0}, "accuracy"])
def test_metrics_argument_must_be_torchmetrics(tmp_path, value):
    import hf_lightning

    with pytest.raises(TypeError, match="`metrics` must be a torchmetrics Metric.*compute_metrics"):
        hf_lightning.Trainer(model=tiny_bert_classifier(), args=_args(hf_lightning, tmp_path, "x"), metrics=value)


# ---------------------------------------------------------------------------------------------- through the Trainer
class _PredictionsHeld(TrainerCallback):
    """Checks, at every prediction step, that the evaluation holds no logits or labels."""

    def __init__(self):
        self.checked = 0
        self.trainer = None

    def on_prediction_step(self, args, state, control, **kwargs):
        for acc in self.trainer.lightning_module.eval_accumulators.values():
            assert acc.preds.tensors is None and acc.labels.tensors is None and acc.preds.arrays is None
            self.checked += 1


def test_trainer_streaming_accuracy_equals_hf_compute_metrics(tmp_path):
    """Standalone evaluate(): ours with only a streaming metric, HF with compute_metrics; nothing gathered."""
    import transformers

    import hf_lightning

    evald = classification_data(n=21, seed=3)
    hf = transformers.Trainer(model=tiny_bert_classifier(), args=_args(transformers, tmp_path, "hf",
                                                                       per_device_eval_batch_size=4),
                              compute_metrics=accuracy)
    expected = hf.evaluate(evald)
    watcher = _PredictionsHeld()
    ours = hf_lightning.Trainer(model=tiny_bert_classifier(), args=_args(hf_lightning, tmp_path, "ours",
                                                                         per_device_eval_batch_size=4),
                                metrics=accuracy_metric(), callbacks=[watcher])
    watcher.trainer = ours
    got = ours.evaluate(evald)
    assert got["eval_accuracy"] == pytest.approx(expected["eval_accuracy"], rel=1e-6)
    assert got["eval_loss"] == pytest.approx(expected["eval_loss"], rel=1e-5)
    assert [k for k in got if not k.endswith(("_runtime", "_per_second"))] == \
        [k for k in expected if not k.endswith(("_runtime", "_per_second"))]
    assert watcher.checked == 6  # 21 rows in batches of 4


def test_token_accuracy_with_padding_and_preprocess_logits(tmp_path):
    """Variable-length token batches (labels padded with -100) and a preprocess_logits_for_metrics."""
    import transformers
    from transformers import BertConfig, BertForTokenClassification, set_seed

    import hf_lightning

    def model():
        set_seed(42)
        return BertForTokenClassification(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                     intermediate_size=64, vocab_size=64, num_labels=4,
                                                     max_position_embeddings=32))

    g = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(11):
        n = int(torch.randint(3, 12, (1,), generator=g))
        rows.append({"input_ids": torch.randint(1, 64, (n,), generator=g).tolist(),
                     "labels": torch.randint(0, 4, (n,), generator=g).tolist()})
    evald = DictDataset(rows)
    hf = transformers.Trainer(model=model(), args=_args(transformers, tmp_path, "hf", per_device_eval_batch_size=3),
                              data_collator=pad_collator, compute_metrics=accuracy)
    expected = hf.evaluate(evald)
    ours = hf_lightning.Trainer(model=model(), args=_args(hf_lightning, tmp_path, "ours",
                                                          per_device_eval_batch_size=3),
                                data_collator=pad_collator, metrics=accuracy_metric(4),
                                preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1))
    got = ours.evaluate(evald)
    assert got["eval_accuracy"] == pytest.approx(expected["eval_accuracy"], rel=1e-6)


def test_streaming_metric_selects_the_best_model_during_training(tmp_path):
    """eval_accuracy during training: same log_history values and best checkpoint as HF's compute_metrics."""
    import transformers

    import hf_lightning
    from tests.helpers.parity import assert_log_history_equal

    train, evald = classification_data(n=24, seed=6), classification_data(n=10, seed=8)
    common = dict(per_device_train_batch_size=4, per_device_eval_batch_size=4, learning_rate=5e-3,
                  num_train_epochs=2, logging_steps=3, eval_strategy="steps", eval_steps=3, save_steps=3,
                  save_total_limit=1, metric_for_best_model="accuracy", load_best_model_at_end=True)
    hf = transformers.Trainer(model=tiny_bert_classifier(), args=_args(transformers, tmp_path, "hf", **common),
                              train_dataset=train, eval_dataset=evald, compute_metrics=accuracy)
    hf.train()
    ours = hf_lightning.Trainer(model=tiny_bert_classifier(), args=_args(hf_lightning, tmp_path, "ours", **common),
                                train_dataset=train, eval_dataset=evald, metrics=accuracy_metric())
    ours.train()
    assert_log_history_equal(hf.state.log_history, ours.state.log_history)
    assert ours.state.best_metric == pytest.approx(hf.state.best_metric, rel=1e-6)
    assert ours.state.best_global_step == hf.state.best_global_step
    assert ours.state.best_model_checkpoint.rsplit("/", 1)[1] == hf.state.best_model_checkpoint.rsplit("/", 1)[1]


def test_predict_reports_streaming_metrics_and_keeps_predictions(tmp_path):
    import hf_lightning

    ours = hf_lightning.Trainer(model=tiny_bert_classifier(), args=_args(hf_lightning, tmp_path, "ours"),
                                metrics=MulticlassAccuracy(num_classes=3, average="micro"))
    test = classification_data(n=9, seed=2)
    out = ours.predict(test)
    labels = np.array([int(r["labels"]) for r in test.rows])
    assert out.predictions.shape == (9, 3)
    np.testing.assert_array_equal(out.label_ids, labels)
    assert out.metrics["test_MulticlassAccuracy"] == pytest.approx(float((out.predictions.argmax(-1) == labels).mean()),
                                                                 rel=1e-6)


def test_native_lightning_path(tmp_path):
    """HFLightningModule(metrics=...) inside a plain lightning fit, with a dict of eval sets."""
    import hf_lightning
    from hf_lightning import HFDataModule, HFLightningModule, build_lightning_trainer

    args = _args(hf_lightning, tmp_path, "native", per_device_train_batch_size=4, per_device_eval_batch_size=4,
                 max_steps=2, eval_strategy="steps", eval_steps=2, save_strategy="no")
    pl_trainer = build_lightning_trainer(args, enable_progress_bar=False)
    module = HFLightningModule(tiny_bert_classifier(), args, metrics=accuracy_metric())
    evals = {"a": classification_data(n=6, seed=1), "b": classification_data(n=5, seed=2)}
    pl_trainer.fit(module, datamodule=HFDataModule(args, train_dataset=classification_data(n=8), eval_dataset=evals))
    flow = next(cb for cb in pl_trainer.callbacks if type(cb).__name__ == "HFFlowCallback")
    logged = [e for e in flow.state.log_history if "eval_a_loss" in e or "eval_b_loss" in e]
    assert [sorted(k for k in e if k.endswith("accuracy")) for e in logged] == [["eval_a_accuracy"],
                                                                               ["eval_b_accuracy"]]
    for entry in logged:
        assert all(0.0 <= v <= 1.0 for k, v in entry.items() if k.endswith("accuracy"))
