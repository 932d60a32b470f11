"""The data under examples/data/ is what make_data.py writes, small, and in the formats the scripts read."""

from __future__ import annotations

import json

import pytest

from tests.examples.conftest import EXAMPLES, load_example

DATA = EXAMPLES / "data"


def test_make_data_reproduces_the_bundled_files(tmp_path):
    make_data = load_example("data/make_data")
    make_data.main(tmp_path)
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    bundled = sorted(p.relative_to(DATA) for p in DATA.rglob("*") if p.is_file() and p.suffix in {".txt", ".jsonl"})
    assert written == bundled
    for relative in written:
        assert (tmp_path / relative).read_bytes() == (DATA / relative).read_bytes(), relative


def test_the_bundled_data_stays_small():
    total = sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file())
    assert total < 500_000, f"examples/data holds {total} bytes; keep the bundled data to a few hundred KB"


@pytest.mark.parametrize(
    "folder, keys",
    [
        ("classification", {"sentence", "label"}),
        ("ner", {"tokens", "ner_tags"}),
        ("translation", {"translation"}),
    ],
)
def test_jsonl_rows_have_the_columns_the_scripts_read(folder, keys):
    for split in ("train", "validation", "test"):
        rows = [json.loads(line) for line in (DATA / folder / f"{split}.jsonl").read_text().splitlines()]
        assert rows and all(set(row) == keys for row in rows), (folder, split)
        if folder == "ner":
            assert all(len(row["tokens"]) == len(row["ner_tags"]) for row in rows)
        if folder == "translation":
            assert all(set(row["translation"]) == {"en", "fr"} for row in rows)
