"""``examples/lightning_cli.py fit --config examples/configs/gpt2_clm.yaml``: LightningCLI end to end, offline.

The config is run as written (``output_dir`` moved into ``tmp_path``, a shorter run given on the command line) in a subprocess, as a user launches it,
and the same run through the HF-style facade (built from the same YAML values) must leave the same ``checkpoint-N``
folders, the same ``log_history`` and the same weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.examples.conftest import EXAMPLES
from tests.helpers.parity import assert_log_history_equal

yaml = pytest.importorskip("yaml")
pytest.importorskip("jsonargparse")

ROOT = EXAMPLES.parent
CONFIG = EXAMPLES / "configs" / "gpt2_clm.yaml"
# Half the config's 40 steps keeps the test short; save_total_limit=1 still shows rotation (checkpoint-10 goes).
OVERRIDES = {"max_steps": 20, "save_total_limit": 1}


def _facade_run(config: dict, output_dir) -> None:
    """The same training through ``hf_lightning.Trainer``: HF's example-script order (seed, build the model, train)."""
    from hf_lightning import Trainer, TrainingArguments, set_seed
    from hf_lightning.cli import TextFileDataset, model_from_config

    args = TrainingArguments(**{**config["training_args"], **OVERRIDES, "output_dir": str(output_dir),
                                "disable_tqdm": True})
    set_seed(args.seed)
    model = model_from_config(**config["model"]["model"]["init_args"])
    datasets = {key: TextFileDataset(**{**spec["init_args"], "path": str(ROOT / spec["init_args"]["path"])})
                for key, spec in config["data"].items()}
    Trainer(model=model, args=args, **datasets).train()


def test_the_cli_config_trains_like_the_facade(tmp_path):
    config = yaml.safe_load(CONFIG.read_text())
    out = tmp_path / "cli"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "examples/lightning_cli.py", "fit", "--config", str(CONFIG.relative_to(ROOT)),
         "--training_args.output_dir", str(out),
         *[word for key, value in OVERRIDES.items() for word in (f"--training_args.{key}", str(value))]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    # save_steps=10 and save_total_limit=1: checkpoint-10 was rotated away.
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-20"]
    state = json.loads((out / "checkpoint-20" / "trainer_state.json").read_text())
    assert state["global_step"] == 20
    assert [e["step"] for e in state["log_history"] if "loss" in e] == [5, 10, 15, 20]
    assert [e["step"] for e in state["log_history"] if "eval_loss" in e] == [10, 20]
    assert (out / "config.yaml").is_file(), "LightningCLI saves the resolved config next to the run"

    torch.set_num_threads(1)
    _facade_run(config, tmp_path / "facade")
    facade = tmp_path / "facade"
    assert sorted(p.name for p in facade.glob("checkpoint-*")) == ["checkpoint-20"]
    facade_state = json.loads((facade / "checkpoint-20" / "trainer_state.json").read_text())
    assert_log_history_equal(facade_state["log_history"], state["log_history"], rtol=0.0)
    from safetensors.torch import load_file

    ours, theirs = (load_file(d / "checkpoint-20" / "model.safetensors") for d in (out, facade))
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
