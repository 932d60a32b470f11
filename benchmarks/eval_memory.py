"""Evaluation: wall time and peak RSS of one ``evaluate()`` on the tiny GPT-2, with a metric on the predictions.

Contenders:

- ``hf``: ``transformers.Trainer(compute_metrics=token_accuracy)`` — HF gathers every batch's logits, then calls
  ``compute_metrics`` once on the whole set, so memory grows with the eval set.
- ``hf_lightning``: ``hf_lightning.Trainer`` with the same ``compute_metrics`` (same gathering, by design).
- ``hf_lightning_streaming``: ``hf_lightning.Trainer(metrics=MetricCollection({"accuracy": TokenAccuracy()}))``:
  a torchmetrics metric updated per batch, nothing gathered. Run only when ``hf_lightning.Trainer`` has a
  ``metrics`` keyword.

Each measurement runs in a fresh process (the driver's job), so the process's peak RSS belongs to this one
evaluation. The peak is the kernel's high-water mark (``VmHWM``), reset right before ``evaluate()`` through
``/proc/self/clear_refs`` so model construction and imports do not count; where that reset is refused the
process-lifetime ``ru_maxrss`` is reported instead (``peak_is_process_lifetime``).
"""

from __future__ import annotations

import inspect
import resource
import time
from typing import Any

import numpy as np
import torch

from workloads import SEED, Workload, build_model, eval_data

CONTENDERS = ("hf", "hf_lightning", "hf_lightning_streaming")


def token_accuracy(eval_pred) -> dict[str, float]:
    """Next-token accuracy from the gathered logits (the ``compute_metrics`` of HF's causal-LM example)."""
    logits = eval_pred.predictions
    if isinstance(logits, tuple):
        logits = logits[0]
    predictions = logits.argmax(-1)[:, :-1]
    labels = eval_pred.label_ids[:, 1:]
    mask = labels != -100
    return {"accuracy": float(np.mean(predictions[mask] == labels[mask]))}


def token_accuracy_metric():
    """The same accuracy as a streaming ``torchmetrics.Metric`` (two counters, updated per batch)."""
    import torchmetrics

    class TokenAccuracy(torchmetrics.Metric):
        def __init__(self) -> None:
            super().__init__()
            self.add_state("correct", default=torch.tensor(0), dist_reduce_fx="sum")
            self.add_state("total", default=torch.tensor(0), dist_reduce_fx="sum")

        def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
            # hf_lightning hands over class ids (argmax of the logits); take logits too.
            if preds.dim() == target.dim() + 1:
                preds = preds.argmax(-1)
            predicted = preds[:, :-1]
            labels = target[:, 1:]
            mask = labels != -100
            self.correct += (predicted[mask] == labels[mask]).sum()
            self.total += mask.sum()

        def compute(self) -> torch.Tensor:
            return self.correct.float() / self.total.clamp(min=1)

    return torchmetrics.MetricCollection({"accuracy": TokenAccuracy()})


def streaming_metrics_supported() -> bool:
    """Whether ``hf_lightning.Trainer`` takes ``metrics=`` (streaming torchmetrics, being added separately)."""
    import hf_lightning

    return "metrics" in inspect.signature(hf_lightning.Trainer.__init__).parameters


def _rss_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def run_evaluation(contender: str, workload: Workload, rows: int, output_dir: str) -> dict[str, Any]:
    """One ``evaluate()`` over ``rows`` eval rows; returns seconds, peak RSS and the accuracy it computed."""
    torch.set_num_threads(1)
    dataset = eval_data(workload, rows)
    common = dict(output_dir=output_dir, per_device_eval_batch_size=workload.batch_size, report_to="none",
                  use_cpu=True, disable_tqdm=True, seed=SEED)
    if contender == "hf":
        import transformers

        trainer = transformers.Trainer(model=build_model(workload), args=transformers.TrainingArguments(**common),
                                       eval_dataset=dataset, compute_metrics=token_accuracy)
    else:
        import hf_lightning

        kwargs: dict[str, Any] = {"compute_metrics": token_accuracy}
        if contender == "hf_lightning_streaming":
            if not streaming_metrics_supported():
                return {"skipped": "hf_lightning.Trainer has no `metrics` keyword yet"}
            kwargs = {"metrics": token_accuracy_metric()}
        trainer = hf_lightning.Trainer(model=build_model(workload), args=hf_lightning.TrainingArguments(**common),
                                       eval_dataset=dataset, **kwargs)
    rss_before = _rss_kb("VmRSS")
    exact_peak = _reset_peak()
    start = time.perf_counter()
    metrics = trainer.evaluate()
    seconds = time.perf_counter() - start
    peak_kb = _rss_kb("VmHWM") if exact_peak else None
    if peak_kb is None:
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = {
        "seconds": seconds,
        "peak_rss_mb": peak_kb / 1024,
        "rss_before_mb": (rss_before or 0) / 1024,
        "growth_mb": (peak_kb - (rss_before or 0)) / 1024,
        "accuracy": metrics.get("eval_accuracy"),
        "rows": rows,
    }
    if not exact_peak:
        result["peak_is_process_lifetime"] = True
    return result
