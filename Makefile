# make lab   — create .venv if missing, open JupyterLab on the tutorials
# make test  — create .venv if missing (and install Chromium for the browser test), run every test
# make bench — print the benchmark table (and keep it in benchmarks/RESULTS.md)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# The CPU build; an unpinned torch pulls gigabytes of CUDA packages.
TORCH  := torch==2.13.0
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Debian's Chromium for the JupyterLab browser test (Playwright's own browser download does not work everywhere)
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: lab test bench clean chromium

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)" -e ".[dev]"
	touch $@

# JupyterLab refuses to run as root unless told; as a user it needs nothing
ROOTFLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab $(ROOTFLAG) notebooks/

chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium package for the browser test"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }

test: $(STAMP) chromium
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/bench.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/slurm_start.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/diagnosis.py --markdown benchmarks/RESULTS.md

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
