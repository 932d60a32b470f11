"""Load the example scripts (``examples/*.py``, not a package) as modules, and shared run settings."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str):
    """Import ``examples/<name>.py`` under a private module name (each call gives a fresh module)."""
    if str(EXAMPLES) not in sys.path:
        # The scripts import their shared helpers (offline_utils) by file name, as `python examples/x.py` does.
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"example_{name.replace('/', '_')}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    # Dataclasses look their module up in sys.modules while the class is created.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def quick_args(tmp_path: Path, output: str = "out") -> list[str]:
    """Arguments every quick example run shares: its own output and `datasets` cache, no bars, one thread."""
    return ["--output_dir", str(tmp_path / output), "--cache_dir", str(tmp_path / "cache"), "--disable_tqdm", "true",
            "--use_cpu", "true", "--report_to", "none"]


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _restore_logging(monkeypatch):
    """Undo what the scripts' logging set-up changes process-wide, so later tests see the defaults.

    (``TrainingArguments.get_process_log_level`` reads the ``hf_lightning`` logger's level, and a root handler
    bound to a test's captured stdout would outlive it.)
    """
    import logging

    import datasets
    import transformers

    monkeypatch.setenv("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "1"))
    root = logging.getLogger()
    handlers, root_level = list(root.handlers), root.level
    names = ["hf_lightning", "lightning", "lightning.pytorch", "lightning.fabric", "run_clm", "run_glue", "run_ner",
             "run_translation", "lightning_native"]
    levels = {name: logging.getLogger(name).level for name in names}
    verbosity = (transformers.utils.logging.get_verbosity(), datasets.utils.logging.get_verbosity())
    bars = transformers.utils.logging.is_progress_bar_enabled()
    yield
    root.handlers[:] = handlers
    root.setLevel(root_level)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    transformers.utils.logging.set_verbosity(verbosity[0])
    datasets.utils.logging.set_verbosity(verbosity[1])
    if bars:
        transformers.utils.logging.enable_progress_bar()
