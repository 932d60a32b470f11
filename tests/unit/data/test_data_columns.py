"""Signature columns, column removal, label names and loss-kwargs rules against HF's Trainer (5.23)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import transformers
from hf_lightning.data.columns import (
    RemoveColumnsCollator,
    can_return_loss,
    find_labels,
    model_accepts_loss_kwargs,
    remove_unused_columns,
    signature_columns,
    unwrap_peft_model,
)


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x, labels=None):
        out = self.linear(x).squeeze(-1)
        return {"loss": ((out - labels) ** 2).mean(), "logits": out}


class KwargsRegressor(Regressor):
    def forward(self, x, labels=None, **kwargs):
        return super().forward(x, labels)


class OptedOutRegressor(KwargsRegressor):
    accepts_loss_kwargs = False


class XYModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x, y=None, return_loss=True):
        return {"loss": self.linear(x).sum()}


class TinyForQuestionAnswering(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, input_ids, start_positions=None, end_positions=None, label_weights=None, *args, **kwargs):
        return {"loss": self.linear.weight.sum()}


def _tiny_hf_model(name: str) -> nn.Module:
    if name == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=1, vocab_size=17,
                                                                    n_positions=16, bos_token_id=0, eos_token_id=0))
    bert = transformers.BertConfig(vocab_size=17, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                                   intermediate_size=8, max_position_embeddings=16)
    cls = {"bert-cls": transformers.BertForSequenceClassification, "bert-qa": transformers.BertForQuestionAnswering,
           "bert-pretraining": transformers.BertForPreTraining}[name]
    return cls(bert)


MODELS = {
    "regressor": Regressor,
    "kwargs-regressor": KwargsRegressor,
    "opted-out": OptedOutRegressor,
    "xy": XYModel,
    "tiny-qa": TinyForQuestionAnswering,
    "gpt2": lambda: _tiny_hf_model("gpt2"),
    "bert-cls": lambda: _tiny_hf_model("bert-cls"),
    "bert-qa": lambda: _tiny_hf_model("bert-qa"),
    "bert-pretraining": lambda: _tiny_hf_model("bert-pretraining"),
}


def _hf_trainer(model, tmp_path, label_names=None):
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], label_names=label_names)
    return transformers.Trainer(model=model, args=args)


@pytest.mark.parametrize("label_names", [None, ["y"], ["labels", "extra_label"]])
@pytest.mark.parametrize("name", list(MODELS))
def test_model_introspection_matches_hf_trainer(name, label_names, tmp_path):
    model = MODELS[name]()
    trainer = _hf_trainer(model, tmp_path, label_names)
    trainer._set_signature_columns_if_needed()

    ours_labels = find_labels(model) if label_names is None else label_names
    assert ours_labels == trainer.label_names
    columns = signature_columns(model, ours_labels)
    # HF appends the label extras through a `set`, so only their membership (not order) is defined.
    assert set(columns) == set(trainer._signature_columns)
    forward_params = len([p for p in columns if p not in ("label", "label_ids", *ours_labels)])
    assert columns[:forward_params] == trainer._signature_columns[:forward_params]
    assert model_accepts_loss_kwargs(model) == trainer.model_accepts_loss_kwargs
    assert can_return_loss(model) == trainer.can_return_loss


@pytest.mark.parametrize(
    "cls",
    [Regressor, XYModel, TinyForQuestionAnswering, transformers.BertForQuestionAnswering,
     transformers.BertForPreTraining, transformers.GPT2LMHeadModel, transformers.CLIPModel],
)
def test_find_labels_and_can_return_loss_match_hf_utils(cls):
    from transformers.utils import can_return_loss as hf_can_return_loss
    from transformers.utils import find_labels as hf_find_labels

    assert find_labels(cls) == hf_find_labels(cls)
    assert can_return_loss(cls) == hf_can_return_loss(cls)


def test_known_rules():
    assert find_labels(TinyForQuestionAnswering) == ["start_positions", "end_positions", "label_weights"]
    assert find_labels(XYModel()) == []
    assert can_return_loss(XYModel) is True
    assert model_accepts_loss_kwargs(OptedOutRegressor()) is False
    assert signature_columns(Regressor(), ["labels", "labels"]) == ["x", "labels", "label", "label_ids", "labels"]


def _dataset(columns):
    import datasets

    return datasets.Dataset.from_dict({name: [[1.0, 2.0], [3.0, 4.0]] for name in columns})


@pytest.mark.parametrize(
    "columns",
    [["x", "labels", "text", "junk"], ["x", "labels"], ["x", "label"], ["x", "label_ids", "idx"], ["y", "x", "z"]],
)
def test_remove_unused_columns_matches_hf(columns, tmp_path):
    model = Regressor()
    trainer = _hf_trainer(model, tmp_path)
    theirs = trainer._remove_unused_columns(_dataset(columns), description="training")
    ours = remove_unused_columns(_dataset(columns), signature_columns(model, find_labels(model)), "training")
    assert ours.column_names == theirs.column_names
    assert ours[:] == theirs[:]


def test_remove_unused_columns_raises_hf_error(tmp_path, caplog):
    model = Regressor()
    trainer = _hf_trainer(model, tmp_path)
    trainer._set_signature_columns_if_needed()
    with pytest.raises(ValueError) as hf_error:
        trainer._remove_unused_columns(_dataset(["text"]))
    with pytest.raises(ValueError, match=r"No columns in the dataset match the model's forward method signature: "
                                         r"\(x, labels, .*\)\. The following columns have been ignored: \[text\]"):
        remove_unused_columns(_dataset(["text"]), trainer._signature_columns)
    with pytest.raises(ValueError) as ours_error:
        remove_unused_columns(_dataset(["text"]), trainer._signature_columns)
    assert str(ours_error.value) == str(hf_error.value)


def test_remove_unused_columns_logs_and_rejects_non_datasets(caplog):
    with caplog.at_level(logging.INFO, logger="hf_lightning.data.columns"):
        remove_unused_columns(_dataset(["x", "junk"]), ["x"], description="evaluation", model_name="Regressor")
    assert "in the evaluation set have no matching argument in `Regressor.forward`" in caplog.text
    assert "junk" in caplog.text
    with pytest.raises(TypeError, match="needs a dataset with `column_names` and `remove_columns`.*"
                                        "RemoveColumnsCollator"):
        remove_unused_columns([{"x": 1}], ["x"])


def test_remove_columns_collator_matches_hf():
    from transformers.trainer_utils import RemoveColumnsCollator as HFRemoveColumnsCollator

    features = [
        {"x": torch.ones(2), "labels": torch.tensor(1.0), "junk": "a"},
        {"x": torch.zeros(2), "labels": torch.tensor(0.0), "junk": "b"},
    ]
    columns = signature_columns(Regressor(), ["labels"])
    theirs = HFRemoveColumnsCollator(transformers.default_data_collator, columns)(features)
    ours = RemoveColumnsCollator(transformers.default_data_collator, columns)(features)
    assert list(ours) == list(theirs) == ["x", "labels"]
    for key in theirs:
        assert torch.equal(ours[key], theirs[key])

    passthrough = [("not", "a dict"), {"x": 1, "junk": 2}]
    assert RemoveColumnsCollator(list, ["x"])(passthrough) == HFRemoveColumnsCollator(list, ["x"])(passthrough)


def test_remove_columns_collator_logs_once(caplog):
    logger = logging.getLogger("test_remove_columns")
    collator = RemoveColumnsCollator(list, ["x"], logger=logger, model_name="Regressor", description="training")
    with caplog.at_level(logging.INFO, logger="test_remove_columns"):
        collator([{"x": 1, "junk": 2}])
        collator([{"x": 1, "junk": 2}])
    assert caplog.text.count("junk") == 1
    assert collator.message_logged


def test_peft_wrappers_are_looked_through():
    inner = KwargsRegressor()
    peft_cls = type("PeftModel", (nn.Module,), {"__module__": "peft.peft_model", "get_base_model": lambda self: inner,
                                                "forward": lambda self, *args, **kwargs: None})
    wrapper = peft_cls()
    assert unwrap_peft_model(wrapper) is inner
    assert signature_columns(wrapper) == ["x", "labels", "kwargs", "label", "label_ids"]
    assert find_labels(wrapper) == ["labels"]
    assert model_accepts_loss_kwargs(wrapper) is True
    assert unwrap_peft_model(inner) is inner
