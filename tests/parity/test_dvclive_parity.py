"""``report_to="dvclive"`` with ``HF_DVCLIVE_LOG_MODEL=true`` records and saves what it does under HF's Trainer.

The same run (tiny BERT with dropout, a tokenizer as processing class, evaluation and checkpoints during training,
``load_best_model_at_end``) goes through ``transformers.Trainer`` and ``hf_lightning.Trainer``, each in its own DVC
repository. Compared: DVCLive's folder (``metrics.json``, ``params.yaml``, the ``plots/metrics`` series, the copied
model artifact), ``dvc.yaml`` with its ``artifacts`` entry, the saved ``output_dir/best`` folder (files, config,
tokenizer, weights bit for bit) and the global RNG after ``train()`` (HF's throwaway Trainer reseeds it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.helpers.dvc import dvc_workspace
from tests.helpers.models import classification_data, tiny_bert_classifier
from tests.parity.test_data_parity import word_tokenizer

TIMED = ("runtime", "per_second")
# hf_lightning's save_model writes the arguments as JSON too (docs/migration.md, checkpoints).
OURS_ONLY = {"training_args.json"}


def _run(kind: str, root: Path, monkeypatch: pytest.MonkeyPatch) -> torch.Tensor:
    import transformers

    import hf_lightning

    lib = transformers if kind == "hf" else hf_lightning
    dvc_workspace(root, monkeypatch)
    torch.set_num_threads(1)
    model = tiny_bert_classifier()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.1
    args = lib.TrainingArguments(
        output_dir="out", use_cpu=True, seed=42, report_to="dvclive", per_device_train_batch_size=4,
        per_device_eval_batch_size=4, num_train_epochs=1, logging_steps=2, eval_strategy="steps", eval_steps=3,
        save_strategy="steps", save_steps=3, load_best_model_at_end=True, disable_tqdm=True)
    trainer = lib.Trainer(model=model, args=args, processing_class=word_tokenizer(),
                          train_dataset=classification_data(n=24), eval_dataset=classification_data(n=8, seed=5))
    trainer.train()
    return torch.rand(4)


def _files(folder: Path) -> dict[str, Path]:
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


def _untimed(metrics: dict) -> dict:
    return {k: _untimed(v) if isinstance(v, dict) else v for k, v in metrics.items() if not any(t in k for t in TIMED)}


def _assert_same_weights(a: Path, b: Path) -> None:
    from safetensors.torch import load_file

    a_weights, b_weights = load_file(a), load_file(b)
    assert a_weights.keys() == b_weights.keys()
    assert all(torch.equal(a_weights[k], b_weights[k]) for k in a_weights), (a, b)


def _assert_same_model_folder(hf: Path, ours: Path) -> None:
    hf_files, ours_files = _files(hf), _files(ours)
    assert set(ours_files) == set(hf_files) | OURS_ONLY
    assert {"config.json", "model.safetensors", "tokenizer.json", "training_args.bin"} <= set(hf_files)
    for name, path in hf_files.items():
        if name == "model.safetensors":
            _assert_same_weights(path, ours_files[name])
        elif name.endswith(".json"):
            assert json.loads(ours_files[name].read_text()) == json.loads(path.read_text()), name


def test_dvclive_log_model_matches_hf(tmp_path, monkeypatch):
    pytest.importorskip("dvclive")
    import yaml

    hf_rng = _run("hf", tmp_path / "hf", monkeypatch)
    ours_rng = _run("ours", tmp_path / "ours", monkeypatch)
    hf, ours = tmp_path / "hf", tmp_path / "ours"

    # HF's throwaway Trainer reseeds the global RNG at the end of training; so does hf_lightning.
    assert torch.equal(ours_rng, hf_rng)
    # The best checkpoint (step 3 here, not the last step) is the one saved and logged as "best".
    for side in (hf, ours):
        with open(side / "dvc.yaml") as fh:
            dvc_yaml = yaml.safe_load(fh)
        assert dvc_yaml["artifacts"] == {"best": {"path": "dvclive/artifacts/best", "type": "model"}}
    assert (ours / "dvc.yaml").read_text() == (hf / "dvc.yaml").read_text()
    assert json.loads((hf / "out/checkpoint-6/trainer_state.json").read_text())["best_global_step"] == 3

    _assert_same_model_folder(hf / "out/best", ours / "out/best")
    _assert_same_model_folder(hf / "dvclive/artifacts/best", ours / "dvclive/artifacts/best")
    _assert_same_weights(hf / "out/best/model.safetensors", hf / "out/checkpoint-3/model.safetensors")

    hf_live, ours_live = _files(hf / "dvclive"), _files(ours / "dvclive")
    assert {n for n in ours_live if not n.startswith("artifacts/best/")} == {
        n for n in hf_live if not n.startswith("artifacts/best/")}
    assert (ours / "dvclive/params.yaml").read_text() == (hf / "dvclive/params.yaml").read_text()
    assert _untimed(json.loads((ours / "dvclive/metrics.json").read_text())) == _untimed(
        json.loads((hf / "dvclive/metrics.json").read_text()))
    series = [n for n in hf_live if n.startswith("plots/metrics/")]
    assert len(series) > 8 and "plots/metrics/eval/loss.tsv" in series
    for name in series:
        if not any(t in name for t in TIMED):
            assert ours_live[name].read_text() == hf_live[name].read_text(), name
