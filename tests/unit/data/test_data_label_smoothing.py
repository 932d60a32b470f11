"""LabelSmoother and the causal-LM shift rule against transformers 5.23."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hf_lightning.data.label_smoothing import LabelSmoother, is_causal_lm_class_name, label_smoother_shifts_labels


def _logits_and_labels(shape, num_classes, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, num_classes, generator=generator).to(dtype)
    labels = torch.randint(num_classes, shape, generator=generator)
    labels[torch.rand(shape, generator=generator) < 0.3] = -100
    return logits, labels


CASES = [
    # (shape, shift_labels, num_items_in_batch, epsilon)
    ((4, 7), False, None, 0.1),
    ((4, 7), True, None, 0.1),
    ((4, 7), False, 13, 0.1),
    ((4, 7), True, 11, 0.2),
    ((4, 7), True, "tensor", 0.1),
    ((6,), False, None, 0.1),
    ((6,), False, 10, 0.0),
    ((2, 3, 5), False, None, 0.3),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("output_kind", ["dict", "tuple"])
@pytest.mark.parametrize("shape, shift, num_items, epsilon", CASES)
def test_label_smoother_matches_hf(shape, shift, num_items, epsilon, output_kind, dtype):
    from transformers.trainer_pt_utils import LabelSmoother as HFLabelSmoother

    for seed in range(3):
        logits, labels = _logits_and_labels(shape, 9, seed, dtype)
        if num_items == "tensor":
            num_items = (labels[..., 1:] != -100).sum()
        output = {"logits": logits, "other": None} if output_kind == "dict" else (logits, None)
        theirs = HFLabelSmoother(epsilon=epsilon)(output, labels.clone(), shift_labels=shift,
                                                  num_items_in_batch=num_items)
        ours = LabelSmoother(epsilon=epsilon)(output, labels.clone(), shift_labels=shift, num_items_in_batch=num_items)
        assert ours.dtype == theirs.dtype
        assert torch.equal(ours, theirs)


def test_label_smoother_with_model_output_and_custom_ignore_index():
    from transformers.modeling_outputs import CausalLMOutput
    from transformers.trainer_pt_utils import LabelSmoother as HFLabelSmoother

    logits, labels = _logits_and_labels((3, 5), 6, seed=4)
    labels[labels == -100] = 0
    output = CausalLMOutput(logits=logits)
    theirs = HFLabelSmoother(epsilon=0.15, ignore_index=0)(output, labels)
    ours = LabelSmoother(epsilon=0.15, ignore_index=0)(output, labels)
    assert torch.equal(ours, theirs)


def test_label_smoother_gradients_match_hf():
    from transformers.trainer_pt_utils import LabelSmoother as HFLabelSmoother

    logits, labels = _logits_and_labels((2, 6), 7, seed=5)
    grads = []
    for smoother in (HFLabelSmoother(), LabelSmoother()):
        leaf = logits.clone().requires_grad_(True)
        smoother({"logits": leaf}, labels, shift_labels=True, num_items_in_batch=9).backward()
        grads.append(leaf.grad)
    assert torch.equal(grads[0], grads[1])


def _all_hf_model_class_names() -> set[str]:
    import transformers.models.auto.modeling_auto as auto

    names: set[str] = set()
    for attribute, mapping in vars(auto).items():
        if attribute.endswith("MAPPING_NAMES") and isinstance(mapping, dict):
            for value in mapping.values():
                names.update([value] if isinstance(value, str) else value)
    return names


def test_causal_lm_rule_matches_hf_mapping_for_every_hf_model_class():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    every_name = _all_hf_model_class_names()
    assert causal <= every_name and len(every_name) > 1000
    wrong = sorted(name for name in every_name if is_causal_lm_class_name(name) != (name in causal))
    assert wrong == []


@pytest.mark.parametrize(
    "name, expected",
    [
        ("GPT2LMHeadModel", True),
        ("LlamaForCausalLM", True),
        ("BertGenerationDecoder", True),
        ("Gemma3ForConditionalGeneration", True),
        ("BertForMaskedLM", False),
        ("FlaubertWithLMHeadModel", False),
        ("T5ForConditionalGeneration", False),
        ("BartForConditionalGeneration", False),
        ("BertForSequenceClassification", False),
        ("Linear", False),
    ],
)
def test_label_smoother_shifts_labels_for_model_instances(name, expected):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model = type(name, (nn.Module,), {})()
    assert label_smoother_shifts_labels(model) is expected
    # The rule HF's compute_loss applies to the same model.
    assert (model._get_name() in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()) is expected


def test_label_smoother_shift_rule_looks_through_peft_wrappers():
    inner = type("LlamaForCausalLM", (nn.Module,), {})()
    peft_model_cls = type("PeftModel", (nn.Module,), {"__module__": "peft.peft_model"})
    wrapper = peft_model_cls()
    wrapper.base_model = nn.Module()
    wrapper.base_model.model = inner
    assert label_smoother_shifts_labels(wrapper) is True
    assert label_smoother_shifts_labels(type("PeftModel", (nn.Module,), {})()) is False
