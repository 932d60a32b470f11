"""Seq2SeqTrainer parity: generate-based evaluation through transformers.Seq2SeqTrainer and ours (CPU, dropout 0)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.models import DictDataset
from tests.helpers.parity import NON_DETERMINISTIC, assert_log_history_equal, assert_weights_close
from tests.helpers.recorder import EventRecorder

VOCAB = 64
PAD, EOS, UNK = 0, 1, 2


def _tokenizer():
    """A word-level fast tokenizer built in memory (nothing downloaded): tokens ``<pad> </s> <unk> t3 .. t63``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "</s>": EOS, "<unk>": UNK, **{f"t{i}": i for i in range(3, VOCAB)}}
    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>")


def _tiny_t5(seed: int = 42):
    from transformers import T5Config, T5ForConditionalGeneration, set_seed

    set_seed(seed)
    config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                      num_heads=4, dropout_rate=0.0, pad_token_id=PAD, eos_token_id=EOS,
                      decoder_start_token_id=PAD)
    return T5ForConditionalGeneration(config)


def _copy_task(n: int, seed: int) -> DictDataset:
    """Variable-length rows: the target is the source reversed, both ending with </s> (token-id lists)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(2, 7, (1,), generator=g))
        ids = torch.randint(3, VOCAB, (length,), generator=g).tolist()
        rows.append({"input_ids": ids + [EOS], "labels": ids[::-1] + [EOS]})
    return DictDataset(rows)


def _exact_match(eval_pred):
    """Rows whose generated ids equal the label ids once both drop padding (pad token and -100)."""
    preds, labels = eval_pred.predictions, eval_pred.label_ids
    if isinstance(preds, tuple):  # logits (and encoder states) when not generating
        preds = preds[0].argmax(-1)
    hits = 0
    for p, lab in zip(preds, labels):
        p = [t for t in p.tolist() if t not in (PAD, -100)]
        lab = [t for t in lab.tolist() if t not in (PAD, -100)]
        hits += int(p == lab)
    return {"exact_match": hits / len(preds), "pred_token_sum": float(np.where(preds > 0, preds, 0).sum()),
            "pred_width": float(preds.shape[1]), "label_width": float(labels.shape[1])}


def _run(kind: str, tmp_path, args: dict, *, evaluate_kwargs: dict | None = None,
         predict_kwargs: dict | None = None, train: bool = True, with_tokenizer: bool = True, n_eval: int = 6):
    torch.set_num_threads(1)
    base = dict(output_dir=str(tmp_path / kind), report_to="none", use_cpu=True, disable_tqdm=True, seed=42,
                per_device_train_batch_size=4, per_device_eval_batch_size=3, learning_rate=5e-3,
                predict_with_generate=True, generation_max_length=8, save_strategy="no")
    base.update(args)
    if kind == "hf":
        import transformers as lib
    else:
        import hf_lightning as lib
    model = _tiny_t5()
    tokenizer = _tokenizer() if with_tokenizer else None
    collator_tokenizer = tokenizer or _tokenizer()
    recorder = EventRecorder()
    trainer = lib.Seq2SeqTrainer(
        model=model, args=lib.Seq2SeqTrainingArguments(**base),
        data_collator=lib.DataCollatorForSeq2Seq(collator_tokenizer, model=model),
        train_dataset=_copy_task(24, seed=1), eval_dataset=_copy_task(n_eval, seed=2),
        processing_class=tokenizer, compute_metrics=_exact_match, callbacks=[recorder],
    )
    if train:
        trainer.train()
    metrics = trainer.evaluate(**(evaluate_kwargs or {}))
    prediction = trainer.predict(_copy_task(6, seed=3), **(predict_kwargs or {}))
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return trainer, metrics, prediction, recorder.events, weights


def _assert_metrics_equal(hf: dict, ours: dict) -> None:
    assert list(hf.keys()) == list(ours.keys()), (hf, ours)
    for key, value in hf.items():
        if any(key.endswith(s) for s in NON_DETERMINISTIC):
            continue
        assert ours[key] == pytest.approx(value, rel=1e-5), key


def _assert_run_equal(hf, ours) -> None:
    hf_trainer, hf_metrics, hf_pred, hf_events, hf_weights = hf
    trainer, metrics, pred, events, weights = ours
    assert_log_history_equal(hf_trainer.state.log_history, trainer.state.log_history)
    assert_weights_close(hf_weights, weights)
    _assert_metrics_equal(hf_metrics, metrics)
    _assert_metrics_equal(hf_pred.metrics, pred.metrics)
    np.testing.assert_array_equal(pred.predictions, hf_pred.predictions)
    np.testing.assert_array_equal(pred.label_ids, hf_pred.label_ids)
    assert events == hf_events


GENERATION_CASES = {
    # name: (extra args, evaluate() keywords, predict() keywords)
    "greedy": ({}, {}, {}),
    "beams_from_args": ({"generation_num_beams": 2}, {}, {}),
    # Keywords beat the arguments; max_new_tokens suppresses generation_max_length.
    "call_keywords": ({"generation_num_beams": 2}, {"num_beams": 1, "max_new_tokens": 3}, {"max_new_tokens": 25}),
    # The generate step's loss comes from the label smoother, without num_items_in_batch.
    "label_smoothing": ({"label_smoothing_factor": 0.1}, {}, {}),
}


@pytest.mark.parametrize("case", list(GENERATION_CASES))
def test_training_with_generate_eval_matches_hf(tmp_path, case):
    """GA 2, eval every 2 steps with generate; then evaluate() and predict() with keyword overrides."""
    extra, evaluate_kwargs, predict_kwargs = GENERATION_CASES[case]
    args = dict(max_steps=6, gradient_accumulation_steps=2, logging_steps=1, eval_strategy="steps", eval_steps=2,
                **extra)
    hf = _run("hf", tmp_path, args, evaluate_kwargs=evaluate_kwargs, predict_kwargs=predict_kwargs)
    ours = _run("ours", tmp_path, args, evaluate_kwargs=evaluate_kwargs, predict_kwargs=predict_kwargs)
    _assert_run_equal(hf, ours)
    assert any("eval_exact_match" in e for e in ours[0].state.log_history)


def test_generated_ids_padded_to_model_max_length(tmp_path):
    """HF pads to the model's generation_config.max_length (20 by default), not generation_max_length."""
    hf = _run("hf", tmp_path, {}, train=False)
    ours = _run("ours", tmp_path, {}, train=False)
    _assert_run_equal(hf, ours)
    assert ours[2].predictions.shape[1] == 20
    assert ours[1]["eval_pred_width"] == 20.0
    # The model's generation config got generate's defaults filled in, as HF's step leaves it.
    assert ours[0].model.generation_config.to_dict() == hf[0].model.generation_config.to_dict()


def test_pad_id_from_model_config_without_tokenizer(tmp_path):
    hf = _run("hf", tmp_path, {}, train=False, with_tokenizer=False)
    ours = _run("ours", tmp_path, {}, train=False, with_tokenizer=False)
    _assert_run_equal(hf, ours)


@pytest.mark.parametrize("args", [{"predict_with_generate": False}, {"prediction_loss_only": True}],
                         ids=["logits", "loss_only"])
def test_without_generation_matches_hf(tmp_path, args):
    hf = _run("hf", tmp_path, args, train=False)
    ours = _run("ours", tmp_path, args, train=False)
    _assert_metrics_equal(hf[1], ours[1])
    _assert_metrics_equal(hf[2].metrics, ours[2].metrics)
    if args.get("predict_with_generate") is False:
        np.testing.assert_allclose(ours[2].predictions[0], hf[2].predictions[0], rtol=1e-5, atol=1e-6)
    else:
        assert ours[2].predictions is None and hf[2].predictions is None




def test_partial_last_eval_batch_loss_weight(tmp_path):
    """7 eval rows in batches of 3: HF's Seq2SeqTrainer weighs the partial last batch like a full one."""
    hf = _run("hf", tmp_path, {}, train=False, n_eval=7)
    ours = _run("ours", tmp_path, {}, train=False, n_eval=7)
    assert ours[1]["eval_loss"] == pytest.approx(hf[1]["eval_loss"], rel=1e-5)


def test_predict_without_labels(tmp_path):
    """``DataCollatorForSeq2Seq`` gives ``labels=None`` for unlabelled rows: generate only, no loss, no labels.
    (HF fails on such a batch, so this checks ours alone.)"""
    import hf_lightning

    model, tokenizer = _tiny_t5(), _tokenizer()
    args = hf_lightning.Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True,
                                                 predict_with_generate=True, generation_max_length=6,
                                                 per_device_eval_batch_size=2)
    trainer = hf_lightning.Seq2SeqTrainer(model=model, args=args, processing_class=tokenizer,
                                          data_collator=hf_lightning.DataCollatorForSeq2Seq(tokenizer, model=model))
    rows = DictDataset([{"input_ids": row["input_ids"]} for row in _copy_task(4, seed=3).rows])
    output = trainer.predict(rows)
    assert output.predictions.shape == (4, 20) and output.label_ids is None
    assert "test_loss" not in output.metrics


def test_generation_config_argument_replaces_the_models(tmp_path):
    """A GenerationConfig object, its dict, a JSON file and a folder all become model.generation_config."""
    from transformers import GenerationConfig

    import hf_lightning

    config = GenerationConfig(max_length=6, num_beams=2, decoder_start_token_id=PAD, eos_token_id=EOS,
                              pad_token_id=PAD)
    config.save_pretrained(tmp_path / "gen")
    for value in (config, config.to_dict(), str(tmp_path / "gen" / "generation_config.json"),
                  tmp_path / "gen"):
        model = _tiny_t5()
        args = hf_lightning.Seq2SeqTrainingArguments(output_dir=str(tmp_path / "o"), report_to="none",
                                                     use_cpu=True, generation_config=value)
        trainer = hf_lightning.Seq2SeqTrainer(model=model, args=args)
        assert isinstance(model.generation_config, GenerationConfig)
        assert model.generation_config.max_length == 6 and model.generation_config.num_beams == 2
        assert trainer.model.generation_config is not config


def test_generation_config_errors(tmp_path):
    import hf_lightning

    def make(value):
        args = hf_lightning.Seq2SeqTrainingArguments(output_dir=str(tmp_path / "o"), report_to="none",
                                                     use_cpu=True, generation_config=value)
        return hf_lightning.Seq2SeqTrainer(model=_tiny_t5(), args=args)

    with pytest.raises(ValueError, match="no generation config file at .*does not download"):
        make(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="Fix these issues to train your model"):
        make({"num_beams": 1, "early_stopping": True, "length_penalty": 2.0})


def test_predict_with_generate_needs_generate(tmp_path):
    import hf_lightning
    from tests.helpers.models import RegressionModel, regression_data

    args = hf_lightning.Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True,
                                                 predict_with_generate=True)
    trainer = hf_lightning.Seq2SeqTrainer(model=RegressionModel(), args=args, compute_metrics=lambda p: {})
    with pytest.raises(ValueError, match="needs a model with a `generate` method.*predict_with_generate=False"):
        trainer.evaluate(regression_data(6))
