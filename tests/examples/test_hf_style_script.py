"""An HF-style script (``scripts/hf_style_run.py``: train, save_model, log/save metrics, save_state, evaluate,
create_model_card) runs with only its import changed, on ``transformers`` and on hf_lightning, in subprocesses,
and leaves the same files and the same model card."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).parent / "scripts" / "hf_style_run.py"
ROOT = Path(__file__).resolve().parents[2]
# Written on purpose next to training_args.bin (docs/checkpoints.md): the arguments as JSON.
OUR_EXTRA_FILES = {"training_args.json"}


def _run(script: Path, output_dir: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(script), str(output_dir)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _card(path: Path) -> tuple[dict, str]:
    text = path.read_text()
    _, header, body = text.split("---\n", 2)
    return yaml.safe_load(header), body


def _results_table(body: str) -> list[str]:
    section = body.split("### Training results\n\n", 1)[1]
    return [line for line in section.splitlines() if line.startswith("|")]


def test_hf_style_script_runs_on_both_and_writes_the_same_card(tmp_path):
    hf_script = tmp_path / "hf_run.py"
    source = SCRIPT.read_text()
    assert "from hf_lightning import Trainer, TrainingArguments" in source
    hf_script.write_text(source.replace("from hf_lightning import", "from transformers import"))
    _run(hf_script, tmp_path / "out")
    (tmp_path / "out").rename(tmp_path / "hf")
    _run(SCRIPT, tmp_path / "out")

    hf_files = {p.name for p in (tmp_path / "hf").iterdir()}
    our_files = {p.name for p in (tmp_path / "out").iterdir()}
    assert "README.md" in hf_files
    assert our_files == hf_files | OUR_EXTRA_FILES

    hf_meta, hf_body = _card(tmp_path / "hf" / "README.md")
    our_meta, our_body = _card(tmp_path / "out" / "README.md")
    assert list(our_meta) == list(hf_meta)
    assert our_meta == hf_meta  # same output folder name, so the same model-index name too
    assert our_meta["model-index"][0]["results"][0]["metrics"][0]["type"] == "accuracy"
    assert _results_table(our_body) == _results_table(hf_body)
    assert len(_results_table(our_body)) == 4  # header, rule, one row per epoch's evaluation
    hyper = lambda body: body.split("### Training hyperparameters")[1].split("### Training results")[0]  # noqa: E731
    assert hyper(our_body) == hyper(hf_body)
    assert our_body.split("### Framework versions")[0] == hf_body.split("### Framework versions")[0]
    assert "- hf_lightning " in our_body
