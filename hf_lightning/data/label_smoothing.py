"""Label-smoothed cross-entropy on a model's logits, as HF's ``LabelSmoother`` computes it (5.23).

With ``ε = epsilon``, ``K`` classes, ``D`` the divisor (``num_items_in_batch`` when given, else the number of
non-ignored label positions) and ``-log p`` summed over non-ignored positions only::

    loss = (1 - ε) * Σ -log p[label] / D  +  ε * Σ_k -log p[k] / (D * K)

Also decides, without importing transformers, whether HF's Trainer shifts the labels for a model (it does for
causal-LM classes, see :func:`label_smoother_shifts_labels`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hf_lightning.data.columns import is_peft_model

__all__ = ["LabelSmoother", "is_causal_lm_class_name", "label_smoother_for", "label_smoother_shifts_labels"]


@dataclass
class LabelSmoother:
    """Label-smoothed loss over a model output, HF's ``transformers.trainer_pt_utils.LabelSmoother``.

    Args:
        epsilon: The smoothing factor ``ε``.
        ignore_index: Label value that marks positions to skip.

    Example:
        >>> smoother = LabelSmoother(epsilon=0.1)
        >>> logits = torch.zeros(2, 3, 5)
        >>> round(smoother({"logits": logits}, torch.tensor([[1, 2, -100], [0, 4, 3]])).item(), 4)
        1.6094
    """

    epsilon: float = 0.1
    ignore_index: int = -100

    def __call__(
        self,
        model_output: Any,
        labels: torch.Tensor,
        shift_labels: bool = False,
        num_items_in_batch: int | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Compute the loss.

        Args:
            model_output: A mapping with ``"logits"`` (dict / ``ModelOutput``) or a sequence whose first item
                is the logits.
            labels: Class ids, shaped like the logits without their last dimension.
            shift_labels: Drop the last logit and the first label so position ``i`` predicts label ``i + 1``
                (causal LMs).
            num_items_in_batch: Divisor for the whole accumulation window; ``None`` divides by this batch's
                non-ignored positions.

        Returns:
            The scalar loss.
        """
        logits = model_output["logits"] if isinstance(model_output, Mapping) else model_output[0]
        if shift_labels:
            logits = logits[..., :-1, :].contiguous()
            labels = labels[..., 1:].contiguous()

        neg_log_probs = -nn.functional.log_softmax(logits, dim=-1)
        if labels.dim() == neg_log_probs.dim() - 1:
            labels = labels.unsqueeze(-1)
        ignored = labels.eq(self.ignore_index)
        # Ignored positions still need a valid index for `gather`; their terms are zeroed right after.
        nll = neg_log_probs.gather(dim=-1, index=labels.clamp(min=0))
        # Summing in float32 keeps half-precision logits from losing the smoothing term.
        smooth = neg_log_probs.sum(dim=-1, keepdim=True, dtype=torch.float32)
        nll.masked_fill_(ignored, 0.0)
        smooth.masked_fill_(ignored, 0.0)

        if num_items_in_batch is None:
            divisor = ignored.numel() - ignored.long().sum()
        elif torch.is_tensor(num_items_in_batch):
            divisor = num_items_in_batch.to(nll.device)
        else:
            divisor = num_items_in_batch
        num_classes = neg_log_probs.shape[-1]
        return (1 - self.epsilon) * (nll.sum() / divisor) + self.epsilon * (smooth.sum() / (divisor * num_classes))


# HF decides by membership in its causal-LM auto-mapping. Our rule is the class-name suffix, plus the handful
# of 5.23 mapping entries the suffix misses or wrongly catches (checked against the mapping in the tests).
_CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "WithLMHead")
_CAUSAL_LM_EXTRA_NAMES = frozenset(
    {
        "BertGenerationDecoder",
        "Gemma3ForConditionalGeneration",
        "Gemma3nForConditionalGeneration",
        "Gemma4ForConditionalGeneration",
        "Gemma4UnifiedForConditionalGeneration",
        "GotOcr2ForConditionalGeneration",
        "MossTranscribeDiarizeForConditionalGeneration",
    }
)
# A masked-LM head with a causal-looking name, and a class HF 5.23 leaves out of its causal-LM mapping.
_NOT_CAUSAL_LM_NAMES = frozenset({"FlaubertWithLMHeadModel", "Mistral4ForCausalLM"})


def is_causal_lm_class_name(name: str) -> bool:
    """Whether HF's Trainer treats a model class of this name as a causal LM when label smoothing.

    Args:
        name: The model class name, e.g. ``"GPT2LMHeadModel"``.

    Returns:
        True for names HF 5.23 lists among its causal-LM models (and for any other name ending in
        ``ForCausalLM``, ``LMHeadModel`` or ``WithLMHead``, which HF would not list).
    """
    if name in _NOT_CAUSAL_LM_NAMES:
        return False
    return name in _CAUSAL_LM_EXTRA_NAMES or name.endswith(_CAUSAL_LM_SUFFIXES)


def label_smoother_shifts_labels(model: nn.Module) -> bool:
    """Whether HF's Trainer calls the label smoother with ``shift_labels=True`` for this model.

    HF shifts when the (PEFT-unwrapped) model's class name is a causal-LM class name; see
    :func:`is_causal_lm_class_name`.

    Args:
        model: The model being trained (not wrapped by DDP/FSDP).

    Returns:
        True when logits and labels should be shifted before smoothing.
    """
    # HF reads the name of `base_model.model` under a PEFT wrapper (not `get_base_model()`).
    inner = model.base_model.model if is_peft_model(model) else model
    return is_causal_lm_class_name(type(inner).__name__)


def label_smoother_for(args: Any, model: nn.Module) -> LabelSmoother | None:
    """HF's ``Trainer.label_smoother``: a :class:`LabelSmoother` for ``label_smoothing_factor != 0``, else None.

    As HF, a model configured for multi-label classification gets none, with HF's ``UserWarning``.
    """
    if args.label_smoothing_factor == 0:
        return None
    if getattr(getattr(model, "config", None), "problem_type", None) == "multi_label_classification":
        warnings.warn("Label smoothing is not compatible with multi-label classification. "
                      "Disabling label smoothing for this training run.", UserWarning, stacklevel=3)
        return None
    return LabelSmoother(epsilon=args.label_smoothing_factor)
