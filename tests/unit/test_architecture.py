"""The package's shape (docs/architecture.md, "Rules that keep this shape"), checked on the source and at import.

The static rules read every module with ``ast``. "Module level" means what runs on import: class bodies count,
function bodies and ``if TYPE_CHECKING:`` blocks do not.
"""

import ast
import importlib
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

import hf_lightning

PACKAGE_DIR = Path(hf_lightning.__file__).parent

# Importing these must load neither Lightning nor the facade (each is checked in a fresh interpreter).
PURE_MODULES = [
    "hf_lightning",
    "hf_lightning.args",
    "hf_lightning.args.plan",
    "hf_lightning.args.parser",
    "hf_lightning.state",
    "hf_lightning.flow",
    "hf_lightning.data.collators",
    "hf_lightning.checkpointing.rotation",
    "hf_lightning.callbacks.hf_api",
    "hf_lightning.outputs",
    "hf_lightning.seed",
    "hf_lightning.evaluation",
    "hf_lightning.eval_gather",
    "hf_lightning.optim",
]
# Their source may not import Lightning anywhere, not even inside a function.
LIGHTNING_FREE_SOURCES = ["args/", "state.py", "flow.py", "data/collators.py", "checkpointing/rotation.py"]
LIGHTNING_ROOTS = {"lightning", "pytorch_lightning", "lightning_fabric"}
NEVER_IMPORTED_AT_MODULE_LEVEL = {"transformers", "accelerate", "datasets"}
FACADE = "hf_lightning.trainer.facade"
# The facade depends on everything and nothing depends on it, except its own package, the top-level lazy name map
# and the demo (a runnable example: an application of the facade that no module imports).
MAY_IMPORT_FACADE = {"hf_lightning", "hf_lightning.trainer", "hf_lightning.demo"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _sources() -> dict[str, tuple[Path, ast.Module]]:
    return {_module_name(p): (p, ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST, module_level_only: bool) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree``; with ``module_level_only``, those that run when the module is imported."""
    found = []

    def visit(nodes) -> None:
        for node in nodes:
            if module_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if module_level_only and isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            visit(ast.iter_child_nodes(node))

    visit([tree])
    return found


def _from_base(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if _sources()[module][0].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


@cache
def _package_names(package: str) -> dict[str, str]:
    """Name → the module it comes from, for every name a package's ``__init__`` imports (lazy ones included)."""
    return {
        alias.asname or alias.name: _from_base(package, node)
        for node in _import_nodes(_sources()[package][1], module_level_only=False)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def _target(base: str, name: str) -> str:
    """The module ``from base import name`` loads: a submodule, the module a package takes the name from, or base."""
    if f"{base}.{name}" in _sources():
        return f"{base}.{name}"
    origin = _package_names(base).get(name) if base in _sources() else None
    return _target(*origin.rpartition(".")[::2]) if origin else base


def _imported_modules(module: str, module_level_only: bool) -> list[tuple[str, int]]:
    """``(module, line)`` for each module an import in ``module`` loads: ``from package import name`` loads the
    package and (:func:`_target`) the module the name comes from."""
    found = []
    for node in _import_nodes(_sources()[module][1], module_level_only):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        else:
            base = _from_base(module, node)
            found.append((base, node.lineno))
            if base in _sources():
                found += [(_target(base, alias.name), node.lineno) for alias in node.names]
    return found


def _files_under(prefixes: list[str]) -> list[str]:
    return [
        m for m, (path, _) in _sources().items()
        if any(path.relative_to(PACKAGE_DIR).as_posix().startswith(prefix) for prefix in prefixes)
    ]


# ---------------------------------------------------------------------------------------------- import time
def test_pure_modules_import_without_lightning_or_the_facade():
    # One fresh interpreter imports the pure modules one after the other and records what each import added:
    # a module that pulls in Lightning or the facade shows up as the first one whose import added it.
    code = (
        "import importlib, json, sys\n"
        "added = {}\n"
        f"for module in {PURE_MODULES!r}:\n"
        "    before = set(sys.modules)\n"
        "    importlib.import_module(module)\n"
        "    added[module] = sorted(set(sys.modules) - before)\n"
        "print(json.dumps(added))\n"
    )
    added = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                      cwd=PACKAGE_DIR.parent).stdout)
    assert list(added) == list(PURE_MODULES)
    offending = {module: [m for m in loaded if m.split(".")[0] in LIGHTNING_ROOTS or m == FACADE]
                 for module, loaded in added.items()}
    assert {module: found for module, found in offending.items() if found} == {}


def test_star_import_gives_exactly_all_and_each_name_resolves():
    namespace: dict = {}
    exec("from hf_lightning import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(hf_lightning.__all__)
    for name in hf_lightning.__all__:
        assert namespace[name] is getattr(hf_lightning, name)
        assert name in dir(hf_lightning)


@pytest.mark.parametrize("package", ["hf_lightning", "hf_lightning.callbacks", "hf_lightning.trainer"])
def test_lazy_names_match_all_and_the_type_checking_imports(package):
    module = importlib.import_module(package)
    type_checking = set(_package_names(package)) - {"TYPE_CHECKING", "lazy_exports"}
    assert type_checking == set(module.__all__)
    assert set(module.__all__) <= set(dir(module))
    for name in module.__all__:
        origin = importlib.import_module(_package_names(package)[name])
        assert getattr(module, name) is getattr(origin, name)


def test_unknown_names_still_raise_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        hf_lightning.NoSuchName  # noqa: B018
    assert not hasattr(hf_lightning, "no_such_module")


# ---------------------------------------------------------------------------------------------- static rules
def test_only_the_trainer_package_top_level_and_demo_import_the_facade():
    importers = sorted(
        f"{module}:{line}"
        for module in _sources()
        for target, line in _imported_modules(module, module_level_only=False)
        if target == FACADE and module not in MAY_IMPORT_FACADE and not module.startswith("hf_lightning.trainer.")
    )
    assert importers == []
    assert not [m for m in _sources() for t, _ in _imported_modules(m, False) if t == "hf_lightning.demo"]


def test_pure_sources_import_no_lightning():
    offenders = sorted(
        f"{module}:{line} {target}"
        for module in _files_under(LIGHTNING_FREE_SOURCES)
        for target, line in _imported_modules(module, module_level_only=False)
        if target.split(".")[0] in LIGHTNING_ROOTS
    )
    assert offenders == []


def test_no_module_level_import_of_transformers_accelerate_or_datasets():
    offenders = sorted(
        f"{module}:{line} {target}"
        for module in _sources()
        for target, line in _imported_modules(module, module_level_only=True)
        if target.split(".")[0] in NEVER_IMPORTED_AT_MODULE_LEVEL
    )
    assert offenders == []


def test_no_import_cycle_among_the_modules():
    graph = {
        module: {t for t, _ in _imported_modules(module, module_level_only=True) if t in _sources() and t != module}
        for module in _sources()
    }
    cycles, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target in graph and target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


@cache
def _lightning_private_names() -> tuple[frozenset[str], frozenset[str]]:
    """Private attribute names of the Lightning and torch objects the package handles, from the installed versions.

    Returns ``(all names, the LightningModule's own)``: the second set is what ``self._x`` may not read inside a
    ``LightningModule`` subclass.
    """
    import lightning.pytorch as pl
    import torch

    def private(obj: object) -> set[str]:
        return {n for n in [*vars(obj), *dir(type(obj))] if n.startswith("_") and not n.startswith("__")}

    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    epoch_loop = trainer.fit_loop.epoch_loop
    optimizer = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    objects = [
        trainer, trainer.fit_loop, epoch_loop, epoch_loop.val_loop, epoch_loop.manual_optimization,
        trainer.strategy, trainer.precision_plugin,
        optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        torch.utils.data.DataLoader([0]),
    ]
    module_names = private(pl.LightningModule())
    return frozenset(set().union(module_names, *map(private, objects))), frozenset(module_names)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_accesses(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, code)`` of each Lightning/torch private the code reaches: ``x._name`` with a private name of those
    objects (on ``self`` only inside a ``LightningModule`` subclass, where it is Lightning's), the same name as a
    ``getattr``-family string, and private modules or names of ``torch`` / ``lightning``."""
    names, module_names = _lightning_private_names()
    libraries = {"torch", "pl", *LIGHTNING_ROOTS}
    found = []

    def visit(node: ast.AST, in_lightning_module: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Attribute):
                on_self = isinstance(child.value, ast.Name) and child.value.id == "self"
                forbidden = (module_names if in_lightning_module else frozenset()) if on_self else names
                dotted = ast.unparse(child)
                if child.attr in forbidden or (dotted.split(".")[0] in libraries and _is_private(child.attr)):
                    found.append((child.lineno, dotted))
            elif isinstance(child, ast.Call) and ast.unparse(child.func) in {"getattr", "setattr", "hasattr"}:
                if len(child.args) > 1 and isinstance(child.args[1], ast.Constant) and child.args[1].value in names:
                    found.append((child.lineno, ast.unparse(child)))
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                modules = [child.module or ""] if isinstance(child, ast.ImportFrom) else []
                dotted = [*modules, *(alias.name for alias in child.names)]
                if dotted[0].split(".")[0] in libraries and any(map(_is_private, ".".join(dotted).split("."))):
                    found.append((child.lineno, ast.unparse(child)))
            if isinstance(child, ast.ClassDef):
                visit(child, any(ast.unparse(base).endswith("LightningModule") for base in child.bases))
            else:
                visit(child, in_lightning_module)

    visit(tree, False)
    return found


def test_only_compat_touches_lightning_or_torch_privates():
    offenders = sorted(
        f"{module}:{line} {text}"
        for module, (_, tree) in _sources().items()
        if module != "hf_lightning._compat"
        for line, text in _private_accesses(tree)
    )
    assert offenders == []


def test_the_private_access_rule_sees_the_usual_patterns():
    sample = ast.parse(
        "import torch\n"
        "def f(trainer, module):\n"
        "    trainer._logger_connector._first_loop_iter = 1\n"
        "    getattr(module, '_trainer', None)\n"
        "    torch._utils._flatten_dense_tensors([])\n"
        "    module._parameters\n"
        "from lightning.pytorch.loops.utilities import _block_parallel_sync_behavior\n"
        "import torch._dynamo\n"
        "class M(pl.LightningModule):\n"
        "    def g(self):\n"
        "        return self._trainer, self._own_thing\n"
        "def h(self):\n"
        "    return self._trainer, torch.nn.Module\n"
        "class C:\n"
        "    def g(self, other):\n"
        "        return self._trainer, other.__dict__, other._trainer\n"
    )
    lines = sorted({line for line, _ in _private_accesses(sample)})
    assert lines == [3, 4, 5, 6, 7, 8, 11, 16]
