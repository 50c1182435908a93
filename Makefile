# make lab   — create .venv if missing, open JupyterLab on the tutorials
# make test  — create .venv if missing, run every test
# make bench — print the benchmark table (and keep it in benchmarks/RESULTS.md)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# The CPU build; an unpinned torch pulls gigabytes of CUDA packages.
TORCH  := torch==2.13.0
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: lab test bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)" -e ".[dev]"
	touch $@

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/bench.py --markdown benchmarks/RESULTS.md

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
