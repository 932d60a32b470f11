# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the whole suite).
# Each builds .venv on first use. torch is pinned first so the project's range is already met by the
# CPU wheel that lies on this machine's disk (an unpinned torch could pull a multi-GB CUDA build).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-slow clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test,examples]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py --output_dir demo_output

# Two pytest workers (pytest-xdist), one per core; --dist loadfile keeps a file's tests (and its module-scoped
# fixtures, e.g. one torchrun launch shared by several tests) in one worker.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST)

# Also the long tests (fuzz trials, extra torchrun variants, the benchmark's quick run): `@pytest.mark.slow`.
test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) --run-slow

clean:
	rm -rf $(VENV) demo_output
