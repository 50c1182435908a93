import os
import signal
import uuid

import psutil
import pytest
from IPython.core.interactiveshell import InteractiveShell


@pytest.fixture(scope="session")
def ip():
    """A real IPython shell with mpinb loaded, as a user gets it from ``%load_ext mpinb``."""
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "mpinb")
    yield shell
    shell.run_line_magic("unload_ext", "mpinb")


@pytest.fixture(scope="session")
def magics(ip):
    return ip.magics_manager.registry["MPIMagics"]


@pytest.fixture
def mpi(ip, magics):
    """Run a ``%%mpi`` cell: ``mpi(code, line="")`` returns what the magic returns."""

    def run(code, line=""):
        return ip.run_cell_magic("mpi", line, code)

    return run


@pytest.fixture
def world_of(ip, magics):
    """Make sure the shell's world has the given size, restarting it only when it differs."""

    def ensure(size):
        if magics.world is None or not magics.world.running:
            ip.run_line_magic("mpi", f"start -n {size}")
        elif magics.world.size != size:
            ip.run_line_magic("mpi", f"restart -n {size}")
        return magics.world

    return ensure


@pytest.fixture
def no_world(ip, magics):
    """The shared shell with no world running (other tests leave theirs up), and none left afterwards."""
    if magics.world is not None and magics.world.running:
        ip.run_line_magic("mpi", "stop")
    yield
    if magics.world is not None and magics.world.running:
        ip.run_line_magic("mpi", "stop")


def world_processes(world):
    """Every process the world started (controller, mpiexec, its proxy, the engines), as psutil objects."""
    return list(world._processes)


def assert_all_gone(processes, timeout=10):
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    assert not alive, f"processes left behind: {[(p.pid, p.name()) for p in alive]}"


TAG = "MPINB_TEST_TAG"


def new_world_tag():
    """Mark every process started from now on with a fresh tag in its environment (kernels, mpiexec and ranks
    inherit it), so that a check for leftovers sees only what this test started, whatever else runs here."""
    tag = uuid.uuid4().hex
    os.environ[TAG] = tag
    return tag


def leftover_ranks(tag, timeout=10):
    """Pids of rank processes (mpinb's engine wrapper) carrying *tag* (:func:`new_world_tag`) still alive after
    *timeout* s: what a notebook's kernel left behind, and nothing another job on this machine runs."""
    started = []
    for process in psutil.process_iter(["cmdline"]):
        if "mpinb.rank.launch" not in (process.info["cmdline"] or []):
            continue
        try:
            if process.environ().get(TAG) == tag:
                started.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    _, alive = psutil.wait_procs(started, timeout=timeout)
    return [process.pid for process in alive]


def pytest_configure(config):
    """Ctrl-C raises KeyboardInterrupt here as in a kernel, even when pytest was started with SIGINT ignored (as a
    background job of a non-interactive shell is): the Stop-button tests deliver it with ``interrupt_main``."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
