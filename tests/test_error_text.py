"""The text of a failed cell, as users read it: identical positions merged, each notice once, cells named as
IPython names them, and the rank that crashed first (real worlds; a real kernel where the kernel matters)."""

import re
import threading

import pytest
from conftest import leftover_ranks, new_world_tag, world_processes
from IPython.core.error import UsageError
from kernel_session import jupyter_client_kernel, run

from mpinb.errors import MPIError, RankError

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(240)]

RESTART_ADVICE = ("%mpi restart starts a fresh world of the same size, with every rank's variables as of the last cell "
                  "every rank finished (--fresh: without them)")


def failed(fn):
    with pytest.raises(BaseException) as raised:
        fn()
    return raised.value


def shown(error, capsys):
    """All the cell showed: what it printed, then the error as the notebook renders it."""
    captured = capsys.readouterr()
    return re.sub(r"\x1b\[[0-9;]*m", "", captured.out + captured.err + "\n".join(error._render_traceback_()))


def test_ranks_deadlocked_at_the_same_line_are_listed_once(world_of, mpi, capsys):
    world_of(4)
    capsys.readouterr()
    error = failed(lambda: mpi("x = 1\ncomm.recv(source=(rank + 1) % size)", line="--timeout 3"))
    text = shown(error, capsys)
    where = "blocked in comm.recv(source=(rank + 1) % size) at cell line 3"
    assert f"[mpinb]   ranks 0-3: {where}" in text, text
    assert "[mpinb]   rank 0:" not in text
    assert [ranks for ranks, _ in error.groups] == [[0, 1, 2, 3]], text
    assert f"ranks 0-3: Timeout: still running after 3 s, {where}" in str(error)
    assert mpi("x") == {0: 1, 1: 1, 2: 1, 3: 1}


def test_a_world_restarted_or_kept_after_a_failure_says_so_once(world_of, mpi, capsys):
    world_of(2)
    capsys.readouterr()
    error = failed(lambda: mpi("import numpy as np\nif rank == 0:\n    comm.Bcast(np.zeros(4), root=0)\nelse:\n"
                               "    comm.Allreduce(np.zeros(4), np.zeros(4))", line="--timeout 30"))
    text = shown(error, capsys)
    assert text.count("so the world was started again") == 1, text
    assert "so the world was started again" in str(error)
    assert mpi("rank") == {0: 0, 1: 1}
    error = failed(lambda: mpi("comm.recv(source=1 - rank)", line="--timeout 2"))  # let out: the world is kept
    text = shown(error, capsys)
    assert text.count("every rank's variables are kept") == 1, text


def test_a_syntax_error_reads_as_ipython_shows_it_with_the_line_and_a_caret(world_of, mpi, capsys):
    """It read 'invalid syntax (<ipython-input-0-838671dc4620>, line 2)' under an empty traceback."""
    world_of(2)
    capsys.readouterr()
    error = failed(lambda: mpi("x = 1\ndef f(:\n    pass"))
    text = shown(error, capsys)
    assert "ranks 0-1: SyntaxError: invalid syntax (cell line 3)" in str(error), str(error)
    assert re.search(r"Cell In\[\d+\], line 3\n    def f\(:\n +\^", text), text
    assert "ipython-input" not in text, text
    assert mpi("rank") == {0: 0, 1: 1}


def test_a_traceback_of_thousands_of_frames_is_shortened_before_it_is_rendered(world_of, mpi, capsys):
    """IPython renders a frame in about 0.35 ms: a RecursionError under a raised recursion limit kept its rank busy
    for minutes after the error (134 s for 100,000 frames), the cell waiting for it."""
    world_of(2)
    capsys.readouterr()
    error = failed(lambda: mpi("import sys\nsys.setrecursionlimit(30000)\ndef f(n):\n    return f(n + 1)\n"
                               "if rank == 1:\n    f(0)\n'fine'"))
    text = shown(error, capsys)
    assert "rank 1: RecursionError: maximum recursion depth exceeded" in str(error), str(error)
    assert re.search(r"\[\.\.\. \d{5} frames left out: the first \d+ and the last \d+ are shown\]", text), text
    assert "return f(n + 1)" in text
    assert mpi("rank") == {0: 0, 1: 1}


@pytest.mark.parametrize("crash, how", [("import os\n    os._exit(3)", "rank 1 died: exit code 3"),
                                        ("comm.Abort(3)", "rank 1 called MPI_Abort(MPI_COMM_WORLD, 3)")])
def test_the_rank_that_crashed_comes_first_and_the_advice_once(crash, how, ip, world_of, mpi, capsys):
    world = world_of(2)
    if world.dead_ranks(world.ranks):  # an earlier case that failed left its world dead
        ip.run_line_magic("mpi", "restart")
    capsys.readouterr()
    error = failed(lambda: mpi(f"if rank == 1:\n    {crash}\ncomm.Barrier()"))
    text = shown(error, capsys)
    assert error.groups[0][0] == [1], text
    assert str(error).splitlines()[1].startswith(f"rank 1: RankLost: {how}"), text
    assert text.count(RESTART_ADVICE) == 1, text
    assert str(error).splitlines()[-1] == RESTART_ADVICE
    ip.run_line_magic("mpi", "restart")
    assert mpi("rank") == {0: 0, 1: 1}


def test_where_each_rank_was_names_cells_as_ipython_does_in_a_kernel():
    """A cell run in a kernel is compiled as ``/tmp/ipykernel_PID/HASH.py`` on every rank; the diagnosis names it
    ``Cell In[N], line L`` (the cell that defined a function too), and identical stacks merge across ranks."""
    tag = new_world_tag()
    with jupyter_client_kernel() as client:
        assert run(client, "%load_ext mpinb\n%mpi start -n 2")[0] == "ok"  # In[1]
        assert run(client, "%%mpi\ndef wait():\n    return comm.recv(source=(rank + 1) % size)")[0] == "ok"  # In[2]
        status, text, _ = run(client, "%%mpi --timeout 2\nwait()")  # In[3]
        assert status == "error"
        assert "ipykernel_" not in text, text
        assert "[mpinb]   ranks 0-1: blocked in wait (Cell In[2], line 3), called at cell line 2: wait()" in text
        assert "Where it was (most recent call last):\n  Cell In[3], line 2\n  Cell In[2], line 3, in wait" in text
        assert "[ranks 0-1] Timeout: still running after 2 s" in text, text
        status, text, _ = run(client, "%%mpi\nimport ctypes\nif rank == 1:\n    ctypes.string_at(0)\n"
                                      "comm.Barrier()")  # In[4]
        assert status == "error" and "ipykernel_" not in text, text
        assert "Where it crashed (most recent call last):\n  Cell In[4], line 4\n" in text, text
        assert run(client, "%mpi stop")[0] == "ok"
    assert not leftover_ranks(tag)


def test_a_rank_that_died_during_a_cell_is_said_to_have_died_in_it_and_the_world_is_called_dead(world_of, ip, mpi):
    """The next cell said the rank "died while no cell ran", and ``-n 4`` that "a 2-rank world is running"."""
    world_of(2)
    with pytest.raises(RankError) as info:
        mpi("import os, threading, time\nif rank == 1:\n    threading.Timer(0.3, lambda: os._exit(3)).start()\n"
            "time.sleep(2)")
    assert "rank 1: RankLost: rank 1 died: exit code 3" in str(info.value), str(info.value)
    with pytest.raises(MPIError) as info:
        mpi("rank")
    assert re.search(r"^rank 1 of this world died during In\[\d+\] \(exit code 3\); rank 0 ended with it, so the "
                     r"world cannot run cells: %mpi restart", str(info.value)), str(info.value)
    with pytest.raises(UsageError) as info:
        mpi("rank", "-n 4")
    assert re.search(r"^the 2-rank world is dead \(ranks? [\d-]+ died during In\[\d+\]\): %mpi restart -n 4 starts 4 "
                     r"new ranks", str(info.value)), str(info.value)
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("mpi", "start -n 2")
    assert str(info.value).startswith("the 2-rank world is dead ("), str(info.value)
    ip.run_line_magic("mpi", "restart --fresh")
    assert mpi("rank") == {0: 0, 1: 1}


def test_a_rank_that_mpiexec_ends_a_moment_after_a_death_is_said_to_have_ended_with_it(world_of, mpi):
    """On a busy machine mpiexec can take a while to end the other ranks once one died: a cell sent meanwhile said
    rank 1 died, and not that rank 0 ended with it. mpiexec (and its proxy) are held here as a busy machine
    would: stopped from before the death until a moment after the next cell was sent."""
    world = world_of(2)
    hydra = [process for process in world_processes(world) if process.name().startswith(("mpiexec", "hydra"))]
    assert hydra, [process.name() for process in world_processes(world)]
    for process in hydra:
        process.suspend()
    resume = threading.Timer(2.0, lambda: [process.resume() for process in hydra])
    resume.start()
    try:
        with pytest.raises(RankError):
            mpi("import os, threading, time\nif rank == 1:\n    threading.Timer(0.3, lambda: os._exit(3)).start()\n"
                "time.sleep(1)")
        with pytest.raises(MPIError) as info:
            mpi("rank")
    finally:
        resume.join()
    assert re.search(r"^rank 1 of this world died during In\[\d+\] \(exit code 3\); rank 0 ended with it, so the "
                     r"world cannot run cells", str(info.value)), str(info.value)


def test_a_frameworks_internal_frames_are_folded_and_the_users_lines_shown(world_of, mpi):
    """A shape error deep inside nested torch modules: the cell's line, where the user's code called in and the
    last two frames where torch raised stay; the frames between are one line that says how many and whose."""
    world_of(2)
    with pytest.raises(RankError) as info:
        mpi("import torch\nmodel = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4))))"
            "\nout = model(torch.ones(2, 5))\n")
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(info.value._render_traceback_()))
    folded = re.search(r"\[\.\.\. (\d+) frames inside torch left out, between the first and the last two of each "
                       r"run: %mpi debug R shows them all\]", shown)
    assert folded and int(folded[1]) >= 4, shown
    assert "----> 4 out = model(torch.ones(2, 5))" in shown, shown  # the user's line
    assert "linear.py" in shown and "F.linear" in shown, shown  # where torch raised
    assert shown.count("module.py") <= 2, shown  # of torch's many Module.__call__ frames, the first
