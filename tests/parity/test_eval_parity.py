"""``evaluate()`` / ``predict()`` parity: the same calls through transformers.Trainer and hf_lightning.Trainer.

Each case compares the returned metrics (same keys in the same order, values within 1e-5), the predictions and
labels, what ``compute_metrics`` received (types, shapes, values — recorded by a compute_metrics that stores its
inputs) and the callback events.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.helpers.models import (
    DictDataset,
    classification_data,
    lm_data,
    pad_collator,
    tiny_bert_classifier,
    tiny_gpt2,
)
from tests.helpers.parity import NON_DETERMINISTIC, assert_log_history_equal, assert_weights_close
from tests.helpers.recorder import EventRecorder

BASE = dict(report_to="none", use_cpu=True, disable_tqdm=True, seed=42)


# ---------------------------------------------------------------------------------------------- models and data
def _bert_config(**kw):
    from transformers import BertConfig

    return BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                      vocab_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, **kw)


def bert_token_classifier():
    from transformers import BertForTokenClassification, set_seed

    set_seed(42)
    return BertForTokenClassification(_bert_config(num_labels=4))


def bert_qa():
    from transformers import BertForQuestionAnswering, set_seed

    set_seed(42)
    return BertForQuestionAnswering(_bert_config())


def token_data(n: int = 10, seed: int = 7):
    """Rows of 3..12 tokens, so padded eval batches have different lengths (joined with -100 across batches)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(3, 13, (1,), generator=g))
        rows.append({"input_ids": torch.randint(1, 64, (length,), generator=g).tolist(),
                     "labels": torch.randint(0, 4, (length,), generator=g).tolist()})
    return DictDataset(rows)


def qa_data(n: int = 10, seq_len: int = 12, seed: int = 11):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 64, (n, seq_len), generator=g)
    starts = torch.randint(0, seq_len // 2, (n,), generator=g)
    return DictDataset([
        {"input_ids": ids[i], "attention_mask": torch.ones(seq_len, dtype=torch.long), "start_positions": starts[i],
         "end_positions": starts[i] + 2}
        for i in range(n)
    ])


MODELS = {
    "classifier": (tiny_bert_classifier, lambda: classification_data(n=20), lambda: classification_data(n=11, seed=4),
                   None),
    "token_classifier": (bert_token_classifier, lambda: token_data(10), lambda: token_data(7, seed=8), pad_collator),
    "qa": (bert_qa, lambda: qa_data(10), lambda: qa_data(6, seed=12), None),
}


# ---------------------------------------------------------------------------------------------- recording
def _first(x):
    while isinstance(x, (tuple, list)):
        x = x[0]
    return x


def _snapshot(value):
    """A detached copy of what compute_metrics received, keeping its container and array types."""
    if isinstance(value, (tuple, list)):
        return type(value)(_snapshot(v) for v in value)
    if isinstance(value, dict) or hasattr(value, "keys"):
        return {k: _snapshot(value[k]) for k in value.keys()}
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    return value


def make_compute_metrics(calls: list, batched: bool = False):
    def summary(p):
        preds, labels = np.asarray(_first(p.predictions), dtype=np.float64), np.asarray(_first(p.label_ids))
        return {"pred_mean": float(preds.mean()), "labelled": int((labels != -100).sum())}

    def compute_metrics(p):
        calls.append({k: _snapshot(getattr(p, k)) for k in ("predictions", "label_ids", "inputs", "losses")})
        return summary(p)

    def compute_metrics_batched(p, compute_result):
        calls.append({k: _snapshot(getattr(p, k)) for k in ("predictions", "label_ids", "inputs", "losses")}
                     | {"compute_result": compute_result})
        return summary(type(p)(_to_numpy(p.predictions), _to_numpy(p.label_ids)))

    return compute_metrics_batched if batched else compute_metrics


def _to_numpy(x):
    if isinstance(x, (tuple, list)):
        return type(x)(_to_numpy(v) for v in x)
    return x.detach().cpu().float().numpy() if isinstance(x, torch.Tensor) else x


def assert_same(hf, ours, where="value"):
    """Same container types, array kinds, shapes, dtypes and values (within 1e-5)."""
    if hf is None or ours is None:
        assert hf is None and ours is None, f"{where}: HF {type(hf)} vs ours {type(ours)}"
    elif isinstance(hf, (tuple, list)):
        assert type(hf) is type(ours) and len(hf) == len(ours), f"{where}: {type(hf)}[{len(hf)}] vs {type(ours)}"
        for i, (a, b) in enumerate(zip(hf, ours)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(hf, dict):
        assert list(hf) == list(ours), f"{where}: keys {list(hf)} vs {list(ours)}"
        for k in hf:
            assert_same(hf[k], ours[k], f"{where}[{k!r}]")
    elif isinstance(hf, torch.Tensor):
        assert isinstance(ours, torch.Tensor), f"{where}: HF tensor vs ours {type(ours)}"
        assert hf.shape == ours.shape and hf.dtype == ours.dtype, f"{where}: {hf.shape}/{hf.dtype} vs {ours.shape}"
        torch.testing.assert_close(ours, hf, rtol=1e-5, atol=1e-6, msg=where)
    elif isinstance(hf, np.ndarray):
        assert isinstance(ours, np.ndarray), f"{where}: HF ndarray vs ours {type(ours)}"
        assert hf.shape == ours.shape and hf.dtype == ours.dtype, \
            f"{where}: {hf.shape}/{hf.dtype} vs {ours.shape}/{ours.dtype}"
        np.testing.assert_allclose(ours, hf, rtol=1e-5, atol=1e-6, err_msg=where)
    else:
        assert hf == ours, f"{where}: {hf!r} vs {ours!r}"


def assert_metrics_equal(hf: dict, ours: dict) -> None:
    assert list(ours) == list(hf), f"key order: HF {list(hf)} vs ours {list(ours)}"
    for key, value in hf.items():
        if any(key.endswith(s) for s in NON_DETERMINISTIC):
            continue
        if isinstance(value, float):
            assert math.isclose(ours[key], value, rel_tol=1e-5, abs_tol=1e-9), f"{key}: HF {value} vs ours {ours[key]}"
        else:
            assert ours[key] == value, f"{key}: HF {value!r} vs ours {ours[key]!r}"


# ---------------------------------------------------------------------------------------------- running
def _trainer(kind, tmp_path, make_model, args, *, eval_dataset=None, train_dataset=None, collator=None,
             compute_metrics=None, preprocess=None, extra=None):
    torch.set_num_threads(1)
    if kind == "hf":
        import transformers as lib
    else:
        import hf_lightning as lib
    targs = lib.TrainingArguments(output_dir=str(tmp_path / kind), **{**BASE, **args})
    recorder = EventRecorder()
    kwargs = dict(model=make_model(), args=targs, train_dataset=train_dataset, eval_dataset=eval_dataset,
                  compute_metrics=compute_metrics, preprocess_logits_for_metrics=preprocess, callbacks=[recorder],
                  **(extra or {}))
    if collator is not None:
        kwargs["data_collator"] = collator
    return lib.Trainer(**kwargs), recorder


def _evaluate_and_predict(kind, tmp_path, model_name, args, *, metrics=True, preprocess=None, batched=False):
    make_model, make_eval, make_test, collator = MODELS[model_name]
    calls: list = []
    cm = make_compute_metrics(calls, batched=batched) if metrics else None
    trainer, recorder = _trainer(kind, tmp_path, make_model, args, eval_dataset=make_eval(), collator=collator,
                                 compute_metrics=cm, preprocess=preprocess)
    evaluated = trainer.evaluate()
    predicted = trainer.predict(make_test())
    return dict(evaluated=evaluated, predicted=predicted, calls=calls, events=recorder.events)


def _assert_eval_pair(hf, ours):
    assert_metrics_equal(hf["evaluated"], ours["evaluated"])
    assert_metrics_equal(hf["predicted"].metrics, ours["predicted"].metrics)
    assert_same(hf["predicted"].predictions, ours["predicted"].predictions, "predictions")
    assert_same(hf["predicted"].label_ids, ours["predicted"].label_ids, "label_ids")
    assert len(ours["calls"]) == len(hf["calls"])
    for i, (a, b) in enumerate(zip(hf["calls"], ours["calls"])):
        assert_same(a, b, f"compute_metrics call {i}")
    assert ours["events"] == hf["events"]


def _argmax(logits, labels):
    return logits.argmax(dim=-1)


# name: (model, extra args, compute_metrics given, preprocess_logits_for_metrics, batch-wise compute_metrics)
CASES = {
    "classifier_inputs_and_loss": ("classifier", dict(per_device_eval_batch_size=8,
                                                      include_for_metrics=["inputs", "loss"]), True, None, False),
    "classifier_no_compute_metrics": ("classifier", dict(per_device_eval_batch_size=8), False, None, False),
    "classifier_prediction_loss_only": ("classifier", dict(per_device_eval_batch_size=8, prediction_loss_only=True),
                                        True, None, False),
    "classifier_preprocess_logits": ("classifier", dict(per_device_eval_batch_size=6), True, _argmax, False),
    "classifier_bf16_full_eval": ("classifier", dict(per_device_eval_batch_size=8, bf16_full_eval=True), True,
                                  None, False),
    "token_padded_batches": ("token_classifier", dict(per_device_eval_batch_size=4,
                                                      include_for_metrics=["inputs", "loss"]), True, None, False),
    "token_eval_accumulation_steps": ("token_classifier", dict(per_device_eval_batch_size=3,
                                                               eval_accumulation_steps=2), True, None, False),
    "token_no_concat": ("token_classifier", dict(per_device_eval_batch_size=4, eval_do_concat_batches=False),
                        True, None, False),
    "token_batch_eval_metrics": ("token_classifier", dict(per_device_eval_batch_size=4, batch_eval_metrics=True,
                                                          include_for_metrics=["inputs", "loss"]), True, None, True),
    "token_preprocess_and_accumulate": ("token_classifier", dict(per_device_eval_batch_size=3,
                                                                 eval_accumulation_steps=1), True, _argmax, False),
    "qa_start_end_positions": ("qa", dict(per_device_eval_batch_size=4), True, None, False),
    "qa_custom_label_names": ("qa", dict(per_device_eval_batch_size=4, label_names=["end_positions",
                                                                                   "start_positions"]),
                              True, None, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_standalone_evaluate_and_predict(tmp_path, case):
    model_name, args, metrics, preprocess, batched = CASES[case]
    hf = _evaluate_and_predict("hf", tmp_path, model_name, args, metrics=metrics, preprocess=preprocess,
                               batched=batched)
    ours = _evaluate_and_predict("ours", tmp_path, model_name, args, metrics=metrics, preprocess=preprocess,
                                 batched=batched)
    _assert_eval_pair(hf, ours)
    assert "eval_model_preparation_time" in ours["evaluated"] and "epoch" in ours["evaluated"]


def test_token_predictions_are_padded_with_minus_100_across_batches(tmp_path):
    """Batches of different lengths are joined on dim 1 with -100, for logits and labels alike."""
    out = _evaluate_and_predict("ours", tmp_path, "token_classifier", dict(per_device_eval_batch_size=3))
    predictions, labels = out["predicted"].predictions, out["predicted"].label_ids
    lengths = [len(r["input_ids"]) for r in token_data(7, seed=8).rows]
    assert predictions.shape == (7, max(lengths), 4) and labels.shape == (7, max(lengths))
    first_batch_len = max(lengths[:3])
    if first_batch_len < max(lengths):
        assert (predictions[:3, first_batch_len:] == -100).all() and (labels[:3, first_batch_len:] == -100).all()


def test_evaluate_dict_standalone(tmp_path):
    """A dict of eval sets: each evaluated, logged and announced in turn, keys ``eval_<name>_*``."""
    def run_kind(kind):
        calls: list = []
        trainer, recorder = _trainer(kind, tmp_path, tiny_bert_classifier, dict(per_device_eval_batch_size=8),
                                     eval_dataset={"a": classification_data(n=12), "b": classification_data(9, seed=5)},
                                     compute_metrics=make_compute_metrics(calls))
        return dict(evaluated=trainer.evaluate(), calls=calls, events=recorder.events,
                    history=trainer.state.log_history)

    hf, ours = run_kind("hf"), run_kind("ours")
    assert_metrics_equal(hf["evaluated"], ours["evaluated"])
    assert_same(hf["calls"], ours["calls"], "compute_metrics calls")
    assert ours["events"] == hf["events"]
    assert_log_history_equal(hf["history"], ours["history"])
    assert [k for k in ours["evaluated"] if k.endswith("_loss")] == ["eval_a_loss", "eval_b_loss"]


def _train_then_evaluate(kind, tmp_path, *, evaluate_first: bool, eval_dataset, args, calls):
    train = classification_data(n=24, seed=6)
    trainer, recorder = _trainer(kind, tmp_path, tiny_bert_classifier,
                                 dict(per_device_train_batch_size=4, per_device_eval_batch_size=8, logging_steps=2,
                                      learning_rate=1e-3, save_strategy="no", **args),
                                 train_dataset=train, eval_dataset=eval_dataset,
                                 compute_metrics=make_compute_metrics(calls))
    before = trainer.evaluate() if evaluate_first else None
    trainer.train()
    after = trainer.evaluate()
    predicted = trainer.predict(classification_data(n=7, seed=9))
    weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    return dict(before=before, after=after, predicted=predicted, history=trainer.state.log_history,
                events=recorder.events, weights=weights)


@pytest.mark.parametrize("evaluate_first", [False, True], ids=["train_first", "evaluate_first"])
@pytest.mark.parametrize("eval_sets", ["single", "dict"])
def test_evaluate_during_and_after_training(tmp_path, evaluate_first, eval_sets):
    """Evaluations inside train() (a dict: each set logged right after it is evaluated, as HF), a standalone
    evaluate() before train() (``eval_model_preparation_time`` then appears in every later evaluation, an HF quirk)
    that does not change the run, and evaluate()/predict() after it."""
    evald = classification_data(n=10, seed=8)
    eval_dataset = evald if eval_sets == "single" else {"a": evald, "b": classification_data(n=6, seed=10)}
    args = dict(eval_strategy="steps", eval_steps=3, num_train_epochs=1)
    hf_calls, our_calls = [], []
    hf = _train_then_evaluate("hf", tmp_path, evaluate_first=evaluate_first, eval_dataset=eval_dataset, args=args,
                              calls=hf_calls)
    ours = _train_then_evaluate("ours", tmp_path, evaluate_first=evaluate_first, eval_dataset=eval_dataset,
                                args=args, calls=our_calls)
    if evaluate_first:
        assert_metrics_equal(hf["before"], ours["before"])
    assert_log_history_equal(hf["history"], ours["history"])
    assert_metrics_equal(hf["after"], ours["after"])
    assert_metrics_equal(hf["predicted"].metrics, ours["predicted"].metrics)
    assert_same(hf["predicted"].predictions, ours["predicted"].predictions, "predictions")
    assert_same(hf_calls, our_calls, "compute_metrics calls")
    assert_weights_close(hf["weights"], ours["weights"])
    assert ours["events"] == hf["events"]
    in_training = [e for e in ours["history"] if any(k.endswith("_loss") and k != "loss" for k in e)]
    assert any("model_preparation_time" in k for k in in_training[0]) == evaluate_first


def test_fp16_full_eval_on_cpu_is_refused_before_work(tmp_path):
    calls: list = []
    trainer, recorder = _trainer("ours", tmp_path, tiny_bert_classifier, dict(fp16_full_eval=True),
                                 eval_dataset=classification_data(n=4), compute_metrics=make_compute_metrics(calls))
    with pytest.raises(ValueError, match="fp16_full_eval=True .* needs a CUDA GPU.*bf16_full_eval"):
        trainer.evaluate()
    with pytest.raises(ValueError, match="fp16_full_eval"):
        trainer.predict(classification_data(n=4))
    assert calls == [] and not any("prediction_step" in e for e in recorder.events)
    assert next(trainer.model.parameters()).dtype == torch.float32


def test_bf16_full_eval_casts_the_model_like_hf(tmp_path):
    dtypes = {}
    for kind in ("hf", "ours"):
        trainer, _ = _trainer(kind, tmp_path, tiny_bert_classifier, dict(bf16_full_eval=True),
                              eval_dataset=classification_data(n=4))
        trainer.evaluate()
        dtypes[kind] = next(trainer.model.parameters()).dtype
    assert dtypes["ours"] == dtypes["hf"] == torch.bfloat16


def test_custom_prediction_step_override_is_used(tmp_path):
    """A subclass's prediction_step (HF's override point) feeds evaluate() and predict()."""
    import transformers

    import hf_lightning

    def subclass(base):
        class Doubling(base):
            def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
                loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
                return loss * 2, (None if logits is None else logits * 2), labels
        return Doubling

    results = {}
    for kind, lib in (("hf", transformers), ("ours", hf_lightning)):
        targs = lib.TrainingArguments(output_dir=str(tmp_path / kind), **BASE)
        trainer = subclass(lib.Trainer)(model=tiny_bert_classifier(), args=targs,
                                        compute_metrics=make_compute_metrics([]))
        results[kind] = (trainer.evaluate(classification_data(n=6)), trainer.predict(classification_data(n=5)))
    assert_metrics_equal(results["hf"][0], results["ours"][0])
    assert_same(results["hf"][1].predictions, results["ours"][1].predictions)


def test_lm_evaluate_ignores_past_key_values(tmp_path):
    """GPT-2's outputs hold past_key_values, left out by the config's keys_to_ignore_at_inference."""
    _, evald = lm_data(n_train=0, n_eval=6)
    results = {}
    for kind in ("hf", "ours"):
        calls: list = []
        trainer, _ = _trainer(kind, tmp_path, tiny_gpt2, dict(per_device_eval_batch_size=4), eval_dataset=evald,
                              compute_metrics=make_compute_metrics(calls))
        results[kind] = (trainer.evaluate(), calls)
    assert_metrics_equal(results["hf"][0], results["ours"][0])
    assert_same(results["hf"][1], results["ours"][1])


class _Stream(torch.utils.data.IterableDataset):
    def __init__(self, rows):
        self.rows = rows

    def __iter__(self):
        return iter(self.rows)


def test_iterable_eval_sets_with_batch_eval_metrics(tmp_path):
    """Eval sets without a length (alone and inside a dict): compute_result on each set's last batch, samples
    counted as observed."""
    results = {}
    for kind in ("hf", "ours"):
        calls: list = []
        trainer, recorder = _trainer(kind, tmp_path, tiny_bert_classifier,
                                     dict(per_device_eval_batch_size=4, batch_eval_metrics=True),
                                     compute_metrics=make_compute_metrics(calls, batched=True))
        single = trainer.evaluate(_Stream(classification_data(n=10).rows))
        both = trainer.evaluate({"x": _Stream(classification_data(n=6).rows), "y": classification_data(n=5)})
        results[kind] = (single, both, calls, recorder.events)
    hf, ours = results["hf"], results["ours"]
    assert_metrics_equal(hf[0], ours[0])
    assert_metrics_equal(hf[1], ours[1])
    assert_same(hf[2], ours[2], "compute_metrics calls")
    assert [c["compute_result"] for c in ours[2]] == [False, False, True, False, True, False, True]
    assert ours[3] == hf[3]


def test_predict_without_labels_and_nested_outputs(tmp_path):
    """No labels: no loss, label_ids None, no compute_metrics call. Outputs holding a tuple of hidden states are
    joined per element; ignore_keys drops them."""
    from transformers import BertForSequenceClassification

    def model():
        torch.manual_seed(0)
        return BertForSequenceClassification(_bert_config(num_labels=3, output_hidden_states=True))

    unlabeled = DictDataset([{k: v for k, v in row.items() if k != "labels"}
                             for row in classification_data(n=7, seed=2).rows])
    results = {}
    for kind in ("hf", "ours"):
        calls: list = []
        trainer, recorder = _trainer(kind, tmp_path, model, dict(per_device_eval_batch_size=3),
                                     compute_metrics=make_compute_metrics(calls))
        results[kind] = (trainer.predict(unlabeled), trainer.predict(unlabeled, ignore_keys=["hidden_states"]),
                         trainer.predict(classification_data(n=5), ignore_keys=["hidden_states"]), calls,
                         recorder.events)
    hf, ours = results["hf"], results["ours"]
    for i in range(3):
        assert_metrics_equal(hf[i].metrics, ours[i].metrics)
        assert_same(hf[i].predictions, ours[i].predictions, f"predictions {i}")
        assert_same(hf[i].label_ids, ours[i].label_ids, f"label_ids {i}")
    assert isinstance(ours[0].predictions, tuple) and isinstance(ours[0].predictions[1], tuple)
    assert ours[0].label_ids is None and "test_loss" not in ours[0].metrics
    assert_same(hf[3], ours[3], "compute_metrics calls")
    assert ours[4] == hf[4]


def test_train_ignore_keys_for_eval_reach_every_evaluation(tmp_path):
    from transformers import BertForSequenceClassification

    def model():
        torch.manual_seed(0)
        return BertForSequenceClassification(_bert_config(num_labels=3, output_hidden_states=True))

    calls = {}
    for kind in ("hf", "ours"):
        calls[kind] = []
        trainer, _ = _trainer(kind, tmp_path, model, dict(per_device_train_batch_size=4, max_steps=4,
                                                          eval_strategy="steps", eval_steps=2, save_strategy="no"),
                              train_dataset=classification_data(n=16), eval_dataset=classification_data(n=6, seed=3),
                              compute_metrics=make_compute_metrics(calls[kind]))
        trainer.train(ignore_keys_for_eval=["hidden_states"])
    assert len(calls["ours"]) == 2
    assert_same(calls["hf"], calls["ours"], "compute_metrics calls")
    assert all(isinstance(c["predictions"], np.ndarray) for c in calls["ours"])


@pytest.mark.parametrize("chunk", [3, 32])
@pytest.mark.parametrize("accumulation_steps", [None, 1, 4])
@pytest.mark.parametrize("do_concat", [True, False])
def test_gathering_container_matches_hf(monkeypatch, do_concat, accumulation_steps, chunk):
    """Our container against HF's EvalLoopContainer: nested outputs, lengths padded with -100, a 0-dim output per
    batch, moves to numpy every k batches, batches joined in chunks."""
    from transformers.trainer_pt_utils import EvalLoopContainer

    from hf_lightning import evaluation

    monkeypatch.setattr(evaluation, "_CHUNK_BATCHES", chunk)
    g = torch.Generator().manual_seed(0)
    hf, ours = EvalLoopContainer(do_concat, padding_index=-100), evaluation._Container(do_concat)
    for i in range(11):
        length = int(torch.randint(2, 9, (1,), generator=g))
        batch = (torch.randn(3, length, 4, generator=g),
                 {"ids": torch.randint(0, 5, (3, length), generator=g), "scalar": torch.tensor(float(i))})
        hf.add(batch)
        ours.add(batch)
        if accumulation_steps and (i + 1) % accumulation_steps == 0:
            hf.to_cpu_and_numpy()
            ours.to_numpy()
    assert_same(hf.get_arrays(), ours.get())


def test_full_batch_loss_weight_matches_hf_seq2seq_gathering(tmp_path):
    """``eval_loss_full_batch_weight`` (set by our Seq2SeqTrainer): every batch loss repeated eval_batch_size times,
    the last partial batch's too, as HF's Seq2SeqTrainer gathers them."""
    import transformers

    import hf_lightning

    class FullBatchWeight(hf_lightning.Trainer):
        eval_loss_full_batch_weight = True

    args = dict(per_device_eval_batch_size=4, include_for_metrics=["loss"])
    results = {}
    for kind, cls, lib in (("hf", transformers.Seq2SeqTrainer, transformers),
                           ("ours", FullBatchWeight, hf_lightning)):
        calls: list = []
        targs = lib.Seq2SeqTrainingArguments(output_dir=str(tmp_path / kind), **{**BASE, **args})
        trainer = cls(model=tiny_bert_classifier(), args=targs, compute_metrics=make_compute_metrics(calls))
        results[kind] = (trainer.evaluate(classification_data(n=11)), calls)
    assert_metrics_equal(results["hf"][0], results["ours"][0])
    assert_same(results["hf"][1], results["ours"][1], "compute_metrics calls")
    assert results["ours"][1][0]["losses"].shape == (12,)


def test_lightning_native_validate_returns_hf_metrics(tmp_path):
    """A plain lightning.Trainer.validate() gives HF's eval metrics (as HF's evaluate() would compute them)."""
    import numpy as np
    import transformers

    from hf_lightning import HFDataModule, HFLightningModule, TrainingArguments, build_lightning_trainer
    from tests.helpers.models import classification_data, tiny_bert_classifier

    def accuracy(pred):
        return {"accuracy": float((np.argmax(pred.predictions, -1) == pred.label_ids).mean())}

    evald = classification_data(n=14, seed=11)
    args = TrainingArguments(output_dir=str(tmp_path / "native"), report_to="none", use_cpu=True,
                             per_device_eval_batch_size=4)
    module = HFLightningModule(tiny_bert_classifier(), args, compute_metrics=accuracy)
    trainer = build_lightning_trainer(args, enable_progress_bar=False)
    (result,) = trainer.validate(module, datamodule=HFDataModule(args, eval_dataset=evald), verbose=False)
    hf_args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), report_to="none", use_cpu=True,
                                             per_device_eval_batch_size=4)
    hf = transformers.Trainer(model=tiny_bert_classifier(), args=hf_args, eval_dataset=evald,
                              compute_metrics=accuracy).evaluate()
    assert result["eval_loss"] == pytest.approx(hf["eval_loss"], rel=1e-5)
    assert result["eval_accuracy"] == pytest.approx(hf["eval_accuracy"])
    assert module.trainer_state.log_history[-1]["eval_loss"] == pytest.approx(hf["eval_loss"], rel=1e-5)
