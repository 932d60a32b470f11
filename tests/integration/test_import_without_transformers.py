"""hf_lightning imports and trains with ``transformers``, ``accelerate`` and ``datasets`` absent.

They are installed in the test environment, so the checks run in a fresh interpreter that hides them before
anything else is imported: every finder on ``sys.meta_path`` is wrapped so that the three packages can neither be
imported (``ModuleNotFoundError``) nor be seen as installed distributions (``importlib.metadata`` raises
``PackageNotFoundError``). Hiding the metadata matters: torchmetrics (imported by Lightning) decides whether to
import ``transformers`` from the installed *distribution* list, so blocking the import alone would make
``import lightning`` fail in a way no machine without transformers ever sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Installed before any other import in the child interpreter.
HIDE_PACKAGES = textwrap.dedent(
    """
    import sys

    # The wrapped finders answer "not found" for these, so they look uninstalled.
    HIDDEN = frozenset({"transformers", "accelerate", "datasets"})


    def is_hidden(name):
        return name.partition(".")[0].lower().replace("-", "_") in HIDDEN


    class HidingFinder:
        def __init__(self, inner):
            self.inner = inner

        def find_spec(self, name, path=None, target=None):
            if is_hidden(name):
                return None
            find_spec = getattr(self.inner, "find_spec", None)
            return None if find_spec is None else find_spec(name, path, target)

        def find_distributions(self, *args, **kwargs):
            find = getattr(self.inner, "find_distributions", None)
            found = () if find is None else find(*args, **kwargs)
            return (dist for dist in found if not is_hidden(dist.name or ""))

        def invalidate_caches(self):
            invalidate = getattr(self.inner, "invalidate_caches", None)
            if invalidate is not None:
                invalidate()


    sys.meta_path[:] = [HidingFinder(finder) for finder in sys.meta_path]

    import importlib.metadata
    import json

    for name in sorted(HIDDEN):
        try:
            __import__(name)
        except ModuleNotFoundError:
            pass
        else:
            raise SystemExit(f"the test failed to hide {name}: it is still importable")
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
        else:
            raise SystemExit(f"the test failed to hide {name}: its distribution is still listed")


    def report(**values):
        leaked = sorted(m for m in sys.modules if is_hidden(m))
        print("RESULT " + json.dumps(dict(values, leaked=leaked)))
    """
)


def _run_hidden(body: str, cwd: Path) -> dict:
    env = dict(os.environ)
    # The project root first: the package under test is this checkout, however the venv installed it.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    completed = subprocess.run(
        [sys.executable, "-c", HIDE_PACKAGES + textwrap.dedent(body)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, f"stdout:\n{completed.stdout[-3000:]}\nstderr:\n{completed.stderr[-6000:]}"
    results = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert results, completed.stdout[-3000:]
    return {**json.loads(results[-1][len("RESULT "):]), "stdout": completed.stdout}


# One child interpreter does both checks (starting torch + Lightning costs seconds): every public name and
# submodule, then ``python -m hf_lightning.demo`` exactly, for 2 steps.
CHILD = """
import importlib
import os
import pkgutil
import runpy

import hf_lightning

names = {name: type(getattr(hf_lightning, name)).__name__ for name in hf_lightning.__all__}
modules = [info.name for info in pkgutil.walk_packages(hf_lightning.__path__, "hf_lightning.")]
for module in modules:
    importlib.import_module(module)
leaked_after_import = sorted(m for m in sys.modules if is_hidden(m))

sys.argv = ["hf_lightning.demo", "--output_dir", "demo_output", "--max_steps", "2"]
runpy.run_module("hf_lightning.demo", run_name="__main__", alter_sys=True)

# report_to names served by transformers' own integration callbacks: a clear error at Trainer(...).
import torch

report_to_error = None
try:
    hf_lightning.Trainer(model=torch.nn.Linear(2, 1), args=hf_lightning.TrainingArguments(
        output_dir="trackio_output", report_to=["tensorboard", "trackio"], use_cpu=True))
except ValueError as error:
    report_to_error = str(error)
report(
    report_to_error=report_to_error,
    report_to_wrote=os.path.exists("trackio_output"),
    report_to_all=hf_lightning.TrainingArguments(output_dir="x", report_to="all").report_to,
    names=sorted(names),
    modules=modules,
    trainer=hf_lightning.Trainer.__module__,
    leaked_after_import=leaked_after_import,
    checkpoints=sorted(d for d in os.listdir("demo_output") if d.startswith("checkpoint-")),
)
"""


@pytest.fixture(scope="module")
def hidden_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("no_transformers")
    return run_dir, _run_hidden(CHILD, run_dir)


def test_every_public_name_and_submodule_imports_without_transformers(hidden_run):
    _, result = hidden_run
    assert result["leaked_after_import"] == []
    assert {"Trainer", "TrainingArguments", "HFLightningModule", "HFDataModule", "build_lightning_trainer"} <= set(
        result["names"]
    )
    assert result["trainer"] == "hf_lightning.trainer.facade"
    assert "hf_lightning.demo" in result["modules"]


def test_demo_trains_without_transformers(hidden_run):
    run_dir, result = hidden_run
    assert result["leaked"] == []
    assert "***** demo summary *****" in result["stdout"]
    assert "eval_loss" in result["stdout"]
    assert result["checkpoints"] == ["checkpoint-1", "checkpoint-2"]
    assert (run_dir / "demo_output" / "model.safetensors").is_file()


def test_hf_integration_callbacks_need_transformers_said_at_trainer_init(hidden_run):
    _, result = hidden_run
    assert result["report_to_error"] == (
        "report_to contains 'trackio': hf_lightning runs transformers' own TrackioCallback for it, and transformers "
        "is not installed. Run `pip install transformers trackio`, or remove 'trackio' from report_to."
    )
    assert result["report_to_wrote"] is False
    # "all": the Lightning loggers only, even where an integration's own package is installed.
    assert result["report_to_all"] == ["tensorboard"]


CARD_CHILD = """
import torch

import hf_lightning

args = hf_lightning.TrainingArguments(output_dir="card_output", report_to="none", use_cpu=True)
trainer = hf_lightning.Trainer(model=torch.nn.Linear(2, 1), args=args)
trainer.state.log_history = [{"loss": 0.5, "epoch": 1.0, "step": 2},
                             {"eval_loss": 0.4, "eval_accuracy": 0.75, "epoch": 1.0, "step": 2},
                             {"train_runtime": 1.0, "epoch": 1.0, "step": 2}]
trainer.create_model_card(tasks="text-classification", dataset_tags="glue", dataset="GLUE")
report(card=open("card_output/README.md").read())
"""


def test_model_card_without_transformers(tmp_path):
    result = _run_hidden(CARD_CHILD, tmp_path)
    assert result["leaked"] == []
    card = result["card"]
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert "- hf_lightning " in card and "- Transformers" not in card
    assert "| 0.5           | 1.0   | 2    | 0.4             | 0.75     |" in card
