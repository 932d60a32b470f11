"""``skip_memory_metrics=False``: HF's memory metrics, under HF's names, in HF's places (the end-of-training log,
``evaluate()``'s and ``predict()``'s returned metrics), against the real ``transformers.Trainer``."""

from __future__ import annotations

from tests.helpers.models import lm_data, tiny_gpt2
from tests.helpers.parity import run_pair

MEMORY_KEYS = ("_mem_", "before_init_mem")


def _memory_keys(metrics: dict) -> list[str]:
    return [k for k in metrics if any(part in k for part in MEMORY_KEYS)]


def test_memory_metrics_as_hf_reports_them(tmp_path):
    train, evald = lm_data(n_train=16, n_eval=8)
    args = dict(per_device_train_batch_size=4, max_steps=3, logging_steps=1, save_strategy="no",
                eval_strategy="steps", eval_steps=2, skip_memory_metrics=False)
    hf, ours = run_pair(tiny_gpt2, tmp_path, train_dataset=train, eval_dataset=evald, args=args)
    # The train-end log carries the init and train figures; the evaluation during training carries none.
    assert [_memory_keys(e) for e in ours.log_history] == [_memory_keys(e) for e in hf.log_history]
    assert _memory_keys(hf.log_history[-1]) == [
        "init_mem_cpu_alloc_delta", "init_mem_cpu_peaked_delta", "train_mem_cpu_alloc_delta",
        "train_mem_cpu_peaked_delta", "before_init_mem_cpu"]
    assert ours.log_history[-1]["before_init_mem_cpu"] > 0
    assert all(isinstance(ours.log_history[-1][k], int) for k in _memory_keys(ours.log_history[-1]))
    # evaluate(): the returned metrics have them, the logged entry does not (HF measures after logging).
    hf_eval, ours_eval = hf.trainer.evaluate(), ours.trainer.evaluate()
    assert _memory_keys(ours_eval) == _memory_keys(hf_eval) == ["eval_mem_cpu_alloc_delta", "eval_mem_cpu_peaked_delta"]
    assert _memory_keys(ours.trainer.state.log_history[-1]) == []
    assert list(ours_eval) == list(hf_eval)
    hf_pred, ours_pred = hf.trainer.predict(evald), ours.trainer.predict(evald)
    assert _memory_keys(ours_pred.metrics) == _memory_keys(hf_pred.metrics) == [
        "test_mem_cpu_alloc_delta", "test_mem_cpu_peaked_delta"]


def test_memory_metrics_are_skipped_by_default(tmp_path):
    train, _ = lm_data(n_train=8, n_eval=0)
    hf, ours = run_pair(tiny_gpt2, tmp_path, train_dataset=train,
                        args=dict(per_device_train_batch_size=4, max_steps=1, save_strategy="no"))
    assert _memory_keys(ours.log_history[-1]) == _memory_keys(hf.log_history[-1]) == []
