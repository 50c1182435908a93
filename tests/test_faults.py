"""Faults on real worlds: every case ends the cell promptly with a diagnosis, and the next cell works."""

import _thread
import re
import threading

import pytest
from cells import DEADLOCK
from conftest import assert_all_gone, world_processes
from waiting import wait_for

from mpinb.errors import MPIError, RankError

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(180)]

INTERNAL = re.compile(r"mpinb/(magics|execute|channel|cluster)\.py|site-packages/(zmq|ipyparallel)/")


def failed(fn):
    """The exception *fn* raises (how long it took is measured in benchmarks/diagnosis.py, not here)."""
    with pytest.raises(BaseException) as raised:
        fn()
    return raised.value


def test_timeout_shows_where_each_rank_is_and_keeps_a_world_stuck_in_mpi(ip, magics, world_of, mpi, capsys):
    """Ranks deadlocked in MPI cannot answer the interrupt: each receives a stand-in message from the rank it
    waits for, leaves MPI, and the next cell finds the same processes, their variables, and MPI in agreement."""
    world = world_of(3)
    mpi("kept = rank * 10")
    old = world_processes(world)
    error = failed(lambda: mpi(DEADLOCK, line="--timeout 2"))
    assert isinstance(error, RankError)
    text = str(error)
    assert "rank 0: Timeout: still running after 2 s, blocked in comm.recv(source=1) at cell line 4" in text
    assert "rank 1: Timeout: still running after 2 s, blocked in comm.recv(source=0) at cell line 6" in text
    assert "; rank 2 finished it" in text
    assert "ranks 0-1 left recv on COMM_WORLD" in text and "every rank's variables are kept" in text
    assert "restarted" not in text and not magics.last.stuck
    assert any("Where it was" in line for ranks, failure in error.groups for line in failure["traceback"])
    assert all(process.is_running() for process in old)  # the same world
    assert mpi("kept") == {0: 0, 1: 10, 2: 20}
    assert mpi("comm.allreduce(rank)") == {0: 3, 1: 3, 2: 3}  # and MPI's messages match again
    assert mpi("comm.bcast(rank, root=2)") == {0: 2, 1: 2, 2: 2}


def test_a_world_mpinb_cannot_settle_is_restarted_with_the_reason(world_of, mpi, magics):
    """Rank 0 passed a broadcast (MPI let it), rank 1 waits in an allreduce that nothing can complete now."""
    world = world_of(2)
    old = world_processes(world)
    error = failed(lambda: mpi("import numpy as np\nif rank == 0:\n    comm.Bcast(np.zeros(4), root=0)\nelse:\n"
                               "    comm.Allreduce(np.zeros(4), np.zeros(4))", line="--timeout 30"))
    text = str(error)
    assert "rank 0 is not just before collective #" in text and "so it cannot join it" in text, text
    assert "so the world was started again with 2 new ranks" in text and "variables are gone" not in text, text
    assert_all_gone(old)
    assert mpi("rank") == {0: 0, 1: 1}


def test_timeout_on_python_code_interrupts_without_a_restart(world_of, mpi):
    world = world_of(2)
    mpi("kept = 42")
    error = failed(lambda: mpi("import time\ntime.sleep(60 if rank == 1 else 0)", line="--timeout 1"))
    assert "rank 1: Timeout: still running after 1 s, blocked in time.sleep(60 if rank == 1 else 0) at cell " \
           "line 3" in str(error)
    assert "restarted" not in str(error)
    assert mpi("kept") == {0: 42, 1: 42} and world.running  # nothing was lost


def test_a_rank_failing_before_a_collective_ends_the_cell_promptly(world_of, mpi, magics):
    world_of(3)
    error = failed(lambda: mpi("if rank == 1:\n    raise ValueError('bad input on rank 1')\n"
                                       "comm.allreduce(rank)"))
    lines = str(error).splitlines()
    assert lines[1] == "rank 1: ValueError: bad input on rank 1"  # the real exception first
    assert "Aborted: stopped after rank 1 failed, blocked in comm.allreduce(rank) at cell line 4" in lines[2]
    assert mpi("rank + 1") == {0: 1, 1: 2, 2: 3}


@pytest.mark.parametrize("crash, how", [
    ("import os\nos._exit(3)", "exit code 3"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "signal 9 (SIGKILL)"),
    ("import ctypes\nctypes.string_at(0)", "signal 11 (SIGSEGV)"),
    ("comm.Abort(5)", "called MPI_Abort(MPI_COMM_WORLD, 5), so mpiexec ended every rank of the job (error code 5)"),
])
def test_a_crashed_rank_is_named_with_how_it_died(crash, how, ip, world_of, mpi):
    world = world_of(3)
    old = world_processes(world)
    body = "import sys, time\nif rank == 2:\n    print('last words', file=sys.stderr, flush=True)\n" + "".join(
        f"    {line}\n" for line in crash.splitlines()) + "time.sleep(30)"
    error = failed(lambda: mpi(body))
    text = str(error)
    assert set(error.failures) == {0, 1, 2} and all(f["ename"] == "RankLost" for f in error.failures.values())
    if "Abort" in crash:  # the caller and its code, as plain mpiexec names them
        assert f"rank 2: RankLost: rank 2 {how}" in text
        assert error.failures[0]["evalue"].startswith(("rank 0 was ended by mpiexec after rank 2 called MPI_Abort",
                                                       "still running when rank 2 died"))
    else:
        assert f"rank 2: RankLost: rank 2 died: {how}" in text
        others = error.failures[0]["evalue"]  # ended by mpiexec, or found still running: either way named
        assert others.startswith(("rank 0 was ended by mpiexec after rank 2 died",
                                  "still running when rank 2 died"))
    if "os._exit" in crash:
        assert "its last stderr lines:\nlast words" in text
    if "ctypes" in crash:  # faulthandler's dump before the signal ended the rank says where it crashed
        assert re.search(r"signal 11 \(SIGSEGV\) in string_at \(__init__\.py:\d+\), called at cell line 6: "
                         r"ctypes\.string_at\(0\)", text)
        assert re.search(r"\n  Cell In\[\d+\], line 6\n", error.failures[2]["traceback"][0])  # as IPython names it
    with pytest.raises(MPIError, match=r"died during In\[\d+\] .*, so the world cannot run cells: %mpi restart"):
        mpi("size")
    ip.run_line_magic("mpi", "restart")
    assert_all_gone(old)
    assert mpi("size") == {0: 3, 1: 3, 2: 3}


def test_a_rank_told_to_end_while_busy_in_a_cell_ends_and_is_named(ip, world_of, mpi, tmp_path):
    """SIGTERM, as a batch system sends every process of a job it ends (scancel, a time limit), to one rank's
    process while the cell keeps it busy: ipyparallel's engine would end only once the cell did; the rank ends
    now and the cell says how."""
    import os
    import signal

    import psutil

    world = world_of(3)
    mark = tmp_path / "busy"
    launcher = psutil.Process(world.identities[2]["pid"]).parent()  # what mpiexec started: rank/launch.py

    def terminate_when_busy():
        wait_for(mark.exists, "rank 2 busy in the cell", 60, required=False)
        os.kill(launcher.pid, signal.SIGTERM)

    sender = threading.Thread(target=terminate_when_busy, daemon=True)
    sender.start()
    error = failed(lambda: mpi(f"import time\nif rank == 2:\n    open({str(mark)!r}, 'w').close()\n"
                               "time.sleep(60)"))
    sender.join(timeout=5)
    assert "rank 2: RankLost: rank 2 died: signal 15 (SIGTERM)" in str(error), error
    ip.run_line_magic("mpi", "restart")
    assert mpi("size") == {0: 3, 1: 3, 2: 3}


def test_stop_button_interrupts_python_on_every_rank(world_of, mpi, capsys):
    world_of(2)
    mpi("kept = 7")
    threading.Timer(1.0, _thread.interrupt_main).start()
    error = failed(lambda: mpi("import time\nwhile True:\n    time.sleep(0.05)"))
    assert isinstance(error, KeyboardInterrupt)
    shown = "\n".join(error._render_traceback_())  # what the notebook shows: the ranks' frames, none of mpinb's
    assert "ranks 0-1: KeyboardInterrupt: interrupted, blocked in time.sleep(0.05) at cell line 4" in str(error)
    assert "KeyboardInterrupt: cell interrupted on every rank it ran on (ranks 0-1)" in shown
    assert "time.sleep(0.05)" in shown and not INTERNAL.search(shown)
    assert mpi("kept") == {0: 7, 1: 7}


def test_stop_button_on_ranks_stuck_in_mpi_keeps_the_world(world_of, mpi, magics, capsys):
    world = world_of(2)
    mpi("kept = rank + 1")
    old = world_processes(world)
    threading.Timer(1.0, _thread.interrupt_main).start()
    error = failed(lambda: mpi(DEADLOCK))
    assert isinstance(error, KeyboardInterrupt)
    shown = "\n".join(error._render_traceback_())
    assert "blocked in comm.recv(source=1) at cell line 4" in shown
    assert "ranks 0-1 left recv on COMM_WORLD" in shown and "every rank's variables are kept" in shown
    assert not INTERNAL.search(shown)
    assert all(process.is_running() for process in old)
    assert mpi("kept") == {0: 1, 1: 2}
    assert mpi("comm.allreduce(kept)") == {0: 3, 1: 3}


def test_a_long_cell_says_no_step_of_an_earlier_cell(world_of, mpi, magics, capsys, monkeypatch):
    world_of(2)
    monkeypatch.setattr(magics, "status_after", 1.0)
    mpi("import mpinb\nfor step in range(60):\n    mpinb.report(step=step, loss=1.0)")
    mpi("import time\nif rank == 1:\n    time.sleep(2.5)\ncomm.Barrier()")
    err = capsys.readouterr().err
    assert "[mpinb] rank 0: running\n[mpinb] rank 1: running\n" in err, err  # both wait; neither reported here
    assert "last reported step 59" not in err


def test_a_long_cell_says_where_each_rank_is(world_of, mpi, magics, capsys, monkeypatch):
    world_of(2)
    monkeypatch.setattr(magics, "status_after", 1.0)
    mpi("import time, mpinb\nif rank == 1:\n    for step in range(6):\n        mpinb.report(step=step, loss=1.0)\n"
        "    time.sleep(2.5)")
    err = capsys.readouterr().err
    # the first status comes after 1 s; how many whole seconds it says depends on how busy the machine is
    assert re.search(r"\[mpinb\] cell running for \d+ s\n\[mpinb\] rank 0: finished\n"
                     r"\[mpinb\] rank 1: running, last reported step 5\n", err), err
