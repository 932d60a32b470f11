"""The docs stay true: docs/migration.md lists every ``TrainingArguments`` field and every public ``Trainer`` method
of transformers 5.x, and the ```python blocks in docs/*.md run.

A python block that cannot run in the test suite (it needs GPUs, a launcher, the network, ...) is marked by an
HTML comment on the line just before its fence, giving the reason::

    <!-- docs-test: skip (needs two GPUs) -->

Such a block is still compiled, so its syntax is checked. The blocks of one file run in order in one namespace
(like a notebook), in a fresh working directory.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MIGRATION = DOCS / "migration.md"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SKIP_MARK = re.compile(r"<!--\s*docs-test:\s*skip\b[^>]*-->\s*$")
FIELD_STATUSES = {"supported", "mapped", "accepted", "refused", "kept", "no effect (as HF)"}
METHOD_STATUSES = {"supported", "mapped", "refused", "not provided"}


def _section_rows(heading: str) -> list[tuple[str, str]]:
    """``(name, status)`` of the table rows between the ``## heading`` and the next ``## `` heading."""
    text = MIGRATION.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    rows = []
    for line in text[start:end if end != -1 else None].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        rows.append((re.match(r"`([^`]+)`", cells[0]).group(1), cells[1]))
    return rows


def _field_rows() -> dict[str, str]:
    return dict(_section_rows("## Every `TrainingArguments` field"))


def _method_rows() -> dict[str, str]:
    return dict(_section_rows("## Every public `Trainer` method"))


def _hf_fields() -> list[str]:
    import transformers

    names = []
    for cls in (transformers.TrainingArguments, transformers.Seq2SeqTrainingArguments):
        names += [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_") and f.name not in names]
    return names


def _hf_methods() -> list[str]:
    import transformers

    names = [name for name in dir(transformers.Trainer) if not name.startswith("_")]
    names += [name for name in dir(transformers.Seq2SeqTrainer) if not name.startswith("_") and name not in names]
    return names


# --------------------------------------------------------------------------- the migration tables
def test_every_training_arguments_field_has_a_row():
    rows = _field_rows()
    missing = [name for name in _hf_fields() if name not in rows]
    assert not missing, f"docs/migration.md has no row for these TrainingArguments fields: {missing}"


def test_every_public_trainer_method_has_a_row():
    rows = _method_rows()
    missing = [name for name in _hf_methods() if name not in rows]
    assert not missing, f"docs/migration.md has no row for these public Trainer methods: {missing}"


def test_the_tables_name_nothing_transformers_does_not_have():
    stale_fields = [name for name in _field_rows() if name not in _hf_fields()]
    stale_methods = [name for name in _method_rows() if name not in _hf_methods()]
    assert not stale_fields and not stale_methods, (stale_fields, stale_methods)


@pytest.mark.parametrize("rows, allowed", [(_field_rows, FIELD_STATUSES), (_method_rows, METHOD_STATUSES)],
                         ids=["fields", "methods"])
def test_every_status_is_one_the_page_defines(rows, allowed):
    unknown = {name: status for name, status in rows().items()
               if not all(part.strip() in allowed for part in status.split("/"))}
    assert not unknown, f"statuses outside {sorted(allowed)}: {unknown}"


def test_method_statuses_match_hf_lightning(tmp_path):
    """A method documented as present exists; "not provided" does not; "refused" raises ValueError."""
    import hf_lightning
    from tests.helpers.models import RegressionModel

    trainer = hf_lightning.Trainer(
        model=RegressionModel(), args=hf_lightning.TrainingArguments(output_dir=str(tmp_path), report_to="none")
    )
    for name, status in _method_rows().items():
        owner = hf_lightning.Seq2SeqTrainer if name not in dir(__import__("transformers").Trainer) \
            else hf_lightning.Trainer
        if status == "not provided":
            assert not hasattr(owner, name), f"{name} exists now: update its row in docs/migration.md"
            continue
        assert hasattr(owner, name), f"docs/migration.md says {name} is {status!r}, but {owner.__name__} lacks it"
        if status == "refused":
            with pytest.raises(ValueError):
                getattr(trainer, name)()


# --------------------------------------------------------------------------- code blocks and links
def _python_blocks(path: Path) -> list[tuple[str, bool]]:
    """``(code, runnable)`` for each ```python block of ``path``."""
    text = path.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        if match.group(1) != "python":
            continue
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        blocks.append((match.group(2), not SKIP_MARK.search(before)))
    return blocks


DOC_FILES = sorted(DOCS.glob("*.md"))


@pytest.mark.parametrize("path", [p for p in DOC_FILES if _python_blocks(p)], ids=lambda p: p.name)
def test_python_blocks_run(path, tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)
    namespace = {"__name__": f"docs_{path.stem}"}
    for index, (code, runnable) in enumerate(_python_blocks(path)):
        compiled = compile(code, f"{path.name} python block {index}", "exec")
        if runnable:
            exec(compiled, namespace)


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_links_between_docs_resolve(path):
    for link in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", path.read_text()):
        assert (path.parent / link).resolve().is_file(), f"{path.name} links to {link}, which does not exist"
