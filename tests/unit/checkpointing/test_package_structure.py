"""The shape of ``hf_lightning.checkpointing``: no import cycle, pure modules, one folder-name pattern, and the
model-state seam (a new kind of model state is used by the writer and the reader without changing them)."""

import ast
import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

import hf_lightning.checkpointing as checkpointing
from hf_lightning.checkpointing.io import HFCheckpointIO
from hf_lightning.checkpointing.layout import checkpoint_folder_name, checkpoint_step
from hf_lightning.checkpointing.model_state import WeightsLoadResult
from hf_lightning.checkpointing.reader import load_model_weights
from hf_lightning.checkpointing.writer import CheckpointContents, save_model_files, write_checkpoint
from hf_lightning.state import TrainerState

PACKAGE = Path(checkpointing.__file__).parent
PREFIX = "hf_lightning.checkpointing"
MODULES = sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem != "__init__")
PURE_MODULES = ["completeness", "errors", "layout", "paths", "rotation"]


def _imported_modules(module: str) -> set[str]:
    """The ``hf_lightning.checkpointing`` modules ``module`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse((PACKAGE / f"{module}.py").read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.level:
                raise AssertionError(f"{module}.py uses a relative import; the package spells imports in full")
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {name[len(PREFIX) + 1:].split(".")[0] for name in names if name.startswith(PREFIX + ".")}
    return found & set(MODULES)


def _top_level_imports(module: str) -> set[str]:
    source = ast.parse((PACKAGE / f"{module}.py").read_text())
    imported = set()
    for node in ast.walk(source):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0])
    return imported


def test_no_import_cycle():
    graph = {module: _imported_modules(module) for module in MODULES}
    assert graph["rng"] <= {"errors", "layout", "safe_load"}
    done, path = set(), []

    def visit(module):
        if module in path:
            cycle = path[path.index(module):] + [module]
            raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
        if module in done:
            return
        path.append(module)
        for imported in sorted(graph[module]):
            visit(imported)
        path.pop()
        done.add(module)

    for module in MODULES:
        visit(module)


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_modules_import_no_torch_nor_lightning(module):
    heavy = {"torch", "lightning", "pytorch_lightning", "numpy", "safetensors", "transformers"}
    assert not _top_level_imports(module) & heavy
    assert _imported_modules(module) <= set(PURE_MODULES)


def test_package_init_imports_nothing_eagerly():
    assert not _top_level_imports("__init__") - {"__future__", "importlib", "typing"}
    for name in checkpointing.__all__:
        assert getattr(checkpointing, name) is not None
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        checkpointing.nope  # noqa: B018


@pytest.mark.parametrize("name,step", [
    ("checkpoint-0", 0),
    ("checkpoint-500", 500),
    (checkpoint_folder_name(42), 42),
    ("checkpoint-5-old", None),
    ("checkpoint-x", None),
    ("checkpoint-", None),
    ("checkpoint_5", None),
    ("Checkpoint-5", None),
    (".tmp-checkpoint-5-123", None),
    ("superseded-checkpoint-5-20240101-000000", None),
    ("checkpoint-5\n", None),
    ("runs", None),
])
def test_checkpoint_step(name, step):
    assert checkpoint_step(name) == step


class JsonModelState:
    """A model state the writer and reader know nothing of: parameters as lists in ``weights.json``."""

    def __init__(self):
        self.calls = []

    def prepare(self, model):
        self.calls.append("prepare")

    def gather(self, model, folder):
        self.calls.append("gather")
        return {name: tensor.tolist() for name, tensor in model.state_dict().items()}

    def write(self, gathered, folder):
        self.calls.append("write")
        with open(os.path.join(folder, "weights.json"), "w") as f:
            json.dump(gathered, f)

    def load(self, model, folder, strict=False):
        self.calls.append("load")
        with open(os.path.join(folder, "weights.json")) as f:
            stored = json.load(f)
        outcome = model.load_state_dict({name: torch.tensor(value) for name, value in stored.items()}, strict=strict)
        return WeightsLoadResult(list(outcome.missing_keys), list(outcome.unexpected_keys))


def _contents(model, model_state, **fields):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return CheckpointContents(global_step=1, model=model, optimizer=optimizer, scheduler=scheduler,
                              state=TrainerState(global_step=1), args=None, model_state=model_state, **fields)


def _model(seed):
    torch.manual_seed(seed)
    return nn.Linear(3, 2)


def test_another_model_state_is_used_by_the_writer_and_the_reader(tmp_path):
    model, model_state = _model(0), JsonModelState()
    path = write_checkpoint(tmp_path, _contents(model, model_state))

    assert model_state.calls == ["gather", "write"]
    assert "weights.json" in os.listdir(path) and "model.safetensors" not in os.listdir(path)
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= set(os.listdir(path))
    restored = _model(1)
    assert load_model_weights(restored, path, model_state=model_state) == ([], [])
    assert model_state.calls[-1] == "load"
    assert torch.equal(restored.weight, model.weight) and torch.equal(restored.bias, model.bias)


def test_another_model_state_through_checkpoint_io_and_save_model(tmp_path):
    model_state = JsonModelState()
    HFCheckpointIO().save_checkpoint(_contents(_model(0), model_state), str(tmp_path / "run"))
    assert os.path.isfile(tmp_path / "run" / "checkpoint-1" / "weights.json")
    save_model_files(_model(0), tmp_path / "final", model_state=model_state)
    assert os.listdir(tmp_path / "final") == ["weights.json"]
    assert model_state.calls == ["gather", "write", "gather", "write"]


def test_every_process_gathers_only_the_saving_one_writes(tmp_path):
    model_state = JsonModelState()
    # A process that does not save the shared files, in a two-process run (the other one would publish).
    write_checkpoint(tmp_path, _contents(_model(0), model_state, process_index=1, world_size=2, should_save=False,
                                         barrier=lambda: None))
    assert model_state.calls == ["gather"]
    assert os.listdir(tmp_path / ".tmp-checkpoint-1") == ["rng_state_1.pth"]
