import atexit
import os
import shutil
import signal
import tempfile

import psutil
import pytest
import world_record
from IPython.core.interactiveshell import InteractiveShell
from mpinb.notebook.world.lifecycle import State


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
        elif magics.world.size != size or magics.world.lifecycle.state == State.DEAD:  # an earlier test's, failed
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
    return world.processes


def assert_all_gone(processes, timeout=10):
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    assert not alive, f"processes left behind: {[(p.pid, p.name()) for p in alive]}"


def new_world_tag():
    """A fresh record of the worlds started from now on, in this process and in the kernels it starts
    (``world_record.py``): the processes a check for leftovers looks at, and no others."""
    handle, path = tempfile.mkstemp(prefix="mpinb-test-worlds-", dir=_SESSION)
    os.close(handle)
    os.environ[world_record.ENV] = path
    return path


def leftover_ranks(record, timeout=10, *, started=True):
    """Pids of the processes of the worlds in *record* (:func:`new_world_tag`) still running after *timeout* s:
    what a notebook's kernel left behind, and nothing another job on this machine runs. With *started*, the record
    must name some processes (else the check would look at nothing)."""
    assert not started or world_record.noted(record), f"no world was recorded in {record}"
    return [process.pid for process in world_record.still_running(record, timeout=timeout)]


_SESSION = tempfile.mkdtemp(prefix="mpinb-tests-")


def pytest_configure(config):
    """Ctrl-C raises KeyboardInterrupt here as in a kernel, even when pytest was started with SIGINT ignored (as a
    background job of a non-interactive shell is): the Stop-button tests deliver it with ``interrupt_main``."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # kernels and servers the tests start run IPython startup files from here: they note their worlds too
    startup = os.path.join(_SESSION, "ipython", "profile_default", "startup")
    os.makedirs(startup)
    with open(os.path.join(startup, "00-mpinb-world-record.py"), "w") as script:
        script.write(world_record.STARTUP)
    os.environ["IPYTHONDIR"] = os.path.join(_SESSION, "ipython")
    world_record.install()
    # registered before any shell exists, so it runs after the shells' own exit handlers (their history lives here)
    atexit.register(shutil.rmtree, _SESSION, ignore_errors=True)


@pytest.fixture
def fresh(world_of, magics, mpi, capsys):
    """A world of the given size whose ranks and history hold no metrics yet (worlds are shared by tests)."""
    from mpinb.notebook.models.history import History

    def world(size):
        world_of(size)
        mpi("from mpinb.rank import report as _report\n_report.recorder.__init__(sink=_report.recorder.sink)")
        magics.history = History()
        capsys.readouterr()

    return world


def text_of(cell_or_outputs):
    """What a cell printed, returned and raised, as text, in order: from a notebook cell, or from a list of
    outputs as nbformat writes them (``lab_server.outputs_of`` makes that list from a kernel's messages)."""
    outputs = cell_or_outputs.outputs if hasattr(cell_or_outputs, "outputs") else cell_or_outputs
    parts = []
    for output in outputs:
        if output["output_type"] == "stream":
            # a stream's text carries its own line ends, and one print may come in two outputs (the kernel sent
            # what it had when its flush came between the print's writes): the pieces join as they were written
            kind = ("stream", output["name"])
            if parts and parts[-1][0] == kind:
                parts[-1] = (kind, parts[-1][1] + output["text"])
            else:
                parts.append((kind, output["text"]))
        elif output["output_type"] in ("execute_result", "display_data"):
            parts.append(("data", output["data"].get("text/plain", "")))
        elif output["output_type"] == "error":
            parts.append(("error", f"{output['ename']}: {output['evalue']}"))
    return "\n".join(text for _, text in parts)
