"""Every rank's variables survive a death, through a real kernel: a segfault, kill -9, MPI_Abort and a size
mismatch torch's backend ends the job over, each followed by ``%mpi restart`` and a check of every rank's values
(an int, an array, a tensor, a model's weights, an optimizer's state, still the model's own parameters) and of
the names not kept; ``--fresh``, snapshots switched off, the size limit, and nothing left after ``%mpi stop``."""

import os
import re
import signal
import time

import pytest
from conftest import leftover_ranks, new_world_tag

from kernel_session import jupyter_client_kernel
from waiting import wait_for

from mpinb.errors import MPIError, RankError

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.notebook]

STATE = """%%mpi
import threading, numpy as np, torch
torch.manual_seed(rank)
keep = rank * 7
arr = np.arange(5.0) + rank
t = torch.full((3,), float(rank))
model = torch.nn.Linear(4, 2)
opt = torch.optim.Adam(model.parameters(), lr=0.1)
model(torch.randn(8, 4)).sum().backward()
opt.step()
lock = threading.Lock()
def twice(v):
    return 2 * v
with torch.no_grad():
    before = (float(model.weight.sum()), float(opt.state[model.weight]['exp_avg'].sum()))
"""

CHECK = """%%mpi
with torch.no_grad():
    after = (float(model.weight.sum()), float(opt.state[model.weight]['exp_avg'].sum()))
print('values', keep, arr.tolist(), t.tolist(), twice(3), after == before,
      opt.param_groups[0]['params'][0] is model.weight, 'lock' in dir())
"""

CRASHES = {
    "segfault": "%%mpi\nimport ctypes\nif rank == 1:\n    ctypes.string_at(0)\ncomm.Barrier()",
    "kill -9": "%%mpi\nimport os, signal\nif rank == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\ncomm.Barrier()",
    "MPI_Abort": "%%mpi\nif rank == 1:\n    comm.Abort(3)\ncomm.Barrier()",
}


@pytest.fixture(scope="module")
def session():
    tag = new_world_tag()
    with jupyter_client_kernel() as k:
        # each cell waits for the snapshot of the one before: a crash right after a cell loses nothing of it
        assert k.run("%load_ext mpinb\n%config MPIMagics.snapshot_lag = 0\n%mpi start -n 2").status == "ok"
        yield k
        k.run("%mpi stop")
    assert not leftover_ranks(tag)


def crashed(session, code):
    shown = session.run(code)
    assert shown.status == "error" and "RankLost" in shown.text, shown.text
    return shown


def restarted(session, command="%mpi restart"):
    shown = session.run(command)
    assert shown.status == "ok", shown.text
    return shown.text


def values_of_every_rank(session):
    shown = session.run(CHECK)
    assert shown.status == "ok", shown.text
    return sorted(line for line in shown.text.splitlines() if "values" in line)


RESTORED = ["[rank 0] values 0 [0.0, 1.0, 2.0, 3.0, 4.0] [0.0, 0.0, 0.0] 6 True True False",
            "[rank 1] values 7 [1.0, 2.0, 3.0, 4.0, 5.0] [1.0, 1.0, 1.0] 6 True True False"]


@pytest.mark.parametrize("how", list(CRASHES))
def test_a_restart_after_a_death_puts_every_ranks_variables_back(session, how):
    assert session.run(STATE).status == "ok"
    crashed(session, CRASHES[how])
    said = restarted(session)
    restored = re.search(r"restored every rank's variables as of In\[\d+\], the last cell every rank finished "
                         r"and kept: ([\w, ]+) \(", said)
    assert restored, said
    assert {"arr", "before", "keep", "model", "opt", "t", "twice"} <= set(restored.group(1).split(", ")), said
    assert "not kept, so not restored: lock (a lock does not pickle" in said, said
    assert values_of_every_rank(session) == RESTORED


def test_a_restart_that_fails_to_start_loses_nothing_for_the_next_one(session):
    """A restart can fail to start (a wrong setting, a port taken, the user's Stop): the world that died is still
    the one the next start restores."""
    assert session.run(STATE).status == "ok"
    crashed(session, CRASHES["kill -9"])
    stopped = session.run("%mpi restart", stops=(0.5,), after="starting the ipyparallel controller")
    assert stopped.status == "error" and "interrupted" in stopped.text, stopped.text
    said = restarted(session)
    assert "restored every rank's variables" in said, said
    assert values_of_every_rank(session) == RESTORED


def test_a_kernel_killed_after_its_world_ended_leaves_no_kept_variables():
    """A world that died and whose restart was stopped is gone, its variables kept for the next restart: a kernel
    killed then (no exit handler runs) still leaves no folder of them behind."""
    tag = new_world_tag()
    with jupyter_client_kernel() as k:
        assert k.run("%load_ext mpinb\n%config MPIMagics.snapshot_lag = 0\n%mpi start -n 2").status == "ok"
        assert k.run("%%mpi\nkeep = rank").status == "ok"
        crashed(k, CRASHES["kill -9"])
        stopped = k.run("%mpi restart", stops=(0.5,), after="starting the ipyparallel controller")
        assert stopped.status == "error" and "interrupted" in stopped.text, stopped.text
        shown = k.run("print('KEPT', get_ipython().magics_manager.registry['MPIMagics'].world.kept_state.root)")
        kept = shown.text.split("KEPT ", 1)[1].split()[0]
        assert os.path.isdir(kept)
        os.kill(k.pid, signal.SIGKILL)
        # the ended world's reaper polls the kernel once a second
        wait_for(lambda: not os.path.exists(kept), "the ended world's reaper to remove the kept variables", 20, 0.2)
    assert not leftover_ranks(tag)


def test_a_size_mismatch_the_backend_ends_the_job_over_keeps_the_model_and_names_the_ddp_wrapper(session):
    # gloo, asked for: it aborts the rank on a size mismatch (the default mpi4py backend raises and keeps the world)
    setup = STATE + ("import mpinb.torch as mt, torch.distributed as dist\nmt.init_process_group('gloo')\n"
                     "ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))\n")
    assert session.run(setup).status == "ok"
    shown = session.run("%%mpi\ndist.all_reduce(torch.ones(4 if rank == 0 else 8))")
    assert shown.status == "error" and "all_reduce(4 x float32)" in shown.text, shown.text
    said = restarted(session)
    assert "ddp (a DDP wrapper: run the cell that wrapped the model again" in said, said
    assert values_of_every_rank(session) == RESTORED
    again = session.run("%%mpi\nmt.init_process_group()\nt2 = torch.ones(2) * (rank + 1)\ndist.all_reduce(t2)\n"
                        "print('sum', t2.tolist())")
    assert again.status == "ok" and again.text.count("sum [3.0, 3.0]") == 2, again.text


def test_fresh_and_a_world_of_another_size_start_empty(session):
    assert session.run(STATE).status == "ok"
    crashed(session, CRASHES["kill -9"])
    said = restarted(session, "%mpi restart --fresh")
    assert "restored" not in said, said
    shown = session.run("%%mpi\nkeep")
    assert shown.status == "error" and "NameError" in shown.text, shown.text
    assert session.run(STATE).status == "ok"
    crashed(session, CRASHES["kill -9"])
    said = restarted(session, "%mpi restart -n 3")
    assert "the world before had 2 ranks and this one has 3: its variables were not restored" in said, said
    assert restarted(session, "%mpi restart -n 2")


def test_snapshots_switched_off_and_the_size_limit(session):
    assert session.run("%config MPIMagics.snapshots = False").status == "ok"
    assert session.run(STATE).status == "ok"
    crashed(session, CRASHES["kill -9"])
    said = restarted(session)
    assert "restored" not in said, said
    assert session.run("%config MPIMagics.snapshots = True").status == "ok"
    assert session.run("%config MPIMagics.snapshot_limit = 100000").status == "ok"
    restarted(session, "%mpi restart")  # the setting is read at each start
    big = session.run("%%mpi\nimport numpy as np\nsmall = np.ones(10) * rank\nbig = np.ones(1_000_000)")
    assert big.status == "ok", big.text
    crashed(session, CRASHES["kill -9"])
    said = restarted(session)
    assert "big (7.63 MB, over the snapshot limit of 97.7 kB: %config MPIMagics.snapshot_limit)" in said, said
    assert "small" in said.split("not kept")[0], said
    shown = session.run("%%mpi\nprint('small', small.sum(), 'big' in dir())")
    assert "[rank 1] small 10.0 False" in shown.text, shown.text
    assert session.run(f"%config MPIMagics.snapshot_limit = {1 << 30}").status == "ok"


def test_stop_removes_every_snapshot(session):
    assert session.run(STATE).status == "ok"
    shown = session.run("print(get_ipython().magics_manager.registry['MPIMagics'].world.kept_state.root)")
    root = shown.text.strip()
    assert os.path.isdir(root) and oct(os.stat(root).st_mode & 0o777) == "0o700", root
    assert any(name.startswith("rank-") for start in os.listdir(root) for name in os.listdir(os.path.join(root, start)))
    assert session.run("%mpi stop").status == "ok"
    assert not os.path.exists(root)
    assert session.run("%mpi start -n 2").status == "ok"


# a model's averaging written the way MPI training code is: a class that holds comm, a function whose loop calls
# it, a global the function reads (rebound after the restore), and a communicator of the user's own
FUNCTIONS = """%%mpi
import numpy as np
weights = np.arange(3.0) + rank
class Averager:
    def __init__(self):
        self.comm = comm
    def mean(self, x):
        out = np.empty_like(x)
        self.comm.Allreduce(x, out)
        return out / size
def train(steps):
    for _ in range(steps):
        weights[:] = averager.mean(weights) + scale
    return weights.tolist()
averager = Averager()
scale = 1.0
pairs = comm.Split(rank % 2, rank)
print('trained', train(1))
"""


def test_functions_and_classes_that_use_comm_come_back_bound_to_the_new_world_and_the_live_namespace(session):
    shown = session.run(FUNCTIONS)
    assert "[rank 1] trained [1.5, 2.5, 3.5]" in shown.text, shown.text
    crashed(session, CRASHES["segfault"])
    said = restarted(session)
    restored = re.search(r"as of In\[\d+\], the last cell every rank finished and kept: ([\w, ]+) \(", said)
    assert restored and {"Averager", "averager", "train", "weights", "scale"} <= set(restored.group(1).split(", ")), said
    assert "pairs (a communicator made in a cell (comm.Split, comm.Dup, Create_cart...) of the world that died: run " \
           "the cell that made it again)" in said, said
    shown = session.run("%%mpi\nprint('again', train(1), averager.comm is comm, comm is MPI.COMM_WORLD)\nscale = 10.0\n"
                        "print('rebound', train(1))")
    assert shown.status == "ok", shown.text
    for rank in (0, 1):
        assert f"[rank {rank}] again [2.5, 3.5, 4.5] True True" in shown.text, shown.text
        assert f"[rank {rank}] rebound [12.5, 13.5, 14.5]" in shown.text, shown.text


MISMATCH = ("%%mpi\nimport numpy as np\nbuf = np.zeros(4)\nif rank == 0:\n    comm.Bcast(buf, root=0)\nelse:\n"
            "    comm.Reduce(buf, None, root=0)\nkeep = -1")


def test_a_mismatch_mpi_completed_is_named_before_the_restart_and_every_variable_comes_back(session):
    assert session.run(STATE).status == "ok"
    shown = session.run(MISMATCH)
    assert shown.status == "error" and "CollectiveMismatch" in shown.text, shown.text
    named = shown.text.index("[mpinb] CollectiveMismatch: collective #")
    assert named < shown.text.index("starting the ipyparallel controller"), shown.text
    assert "restored every rank's variables as of In[" in shown.text, shown.text
    assert "variables are gone" not in shown.text, shown.text
    assert values_of_every_rank(session) == RESTORED


STUCK = ("%%mpi\nimport signal, time\nkeep = -1\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
         "print('asleep', flush=True)\ntime.sleep(300)")


def test_ranks_that_do_not_answer_the_interrupt_come_back_with_their_variables(session):
    assert session.run(STATE).status == "ok"
    shown = session.run(STUCK, after="asleep", stops=(0.5,))
    assert "did not answer the interrupt" in shown.text, shown.text
    assert "restored every rank's variables as of In[" in shown.text, shown.text
    assert not shown.internal_frames(), shown.text
    assert values_of_every_rank(session) == RESTORED


def test_a_world_ended_by_three_stops_comes_back_with_its_variables_at_the_next_cell(session):
    assert session.run(STATE).status == "ok"
    shown = session.run(STUCK, after="asleep", stops=(0.5, 1.5, 2.5))
    assert "Stop pressed 3 times" in shown.text and "was ended" in shown.text, shown.text
    assert not shown.internal_frames(), shown.text
    shown = session.run(CHECK)
    assert shown.status == "ok", shown.text
    assert "restored every rank's variables as of In[" in shown.text, shown.text
    assert sorted(line for line in shown.text.splitlines() if "values" in line) == RESTORED


def test_a_restart_of_a_live_world_keeps_its_last_cell_and_fresh_starts_empty(session):
    assert session.run(STATE).status == "ok"
    assert session.run("%%mpi\nkeep = keep + 1").status == "ok"
    said = restarted(session)  # at once: the last cell's snapshot is written before the ranks stop
    assert "restored every rank's variables as of In[" in said, said
    assert session.run("%%mpi\nkeep = keep - 1").status == "ok"
    assert values_of_every_rank(session) == RESTORED
    assert "restored" not in restarted(session, "%mpi restart --fresh")
    assert "NameError" in session.run("%%mpi\nkeep").text


def test_a_second_death_right_after_a_restore_loses_nothing(session):
    assert session.run(STATE).status == "ok"
    crashed(session, CRASHES["kill -9"])
    restarted(session)
    crashed(session, CRASHES["segfault"])  # sent at once after the restore
    said = restarted(session)
    assert "restored every rank's variables" in said, said
    assert values_of_every_rank(session) == RESTORED


def test_a_stop_during_the_restore_keeps_the_snapshot_for_the_next_restart(session):
    big = ("%%mpi\nimport numpy as np\nbig = np.arange(12_500_000, dtype=np.float64) + rank\nkeep = rank * 7\n"
           "arr = np.arange(5.0) + rank")
    assert session.run(big).status == "ok"
    crashed(session, CRASHES["kill -9"])
    stopped = session.run("%mpi restart", after="started in", stops=(0.05,))
    assert stopped.status in ("ok", "error"), stopped.text
    assert not stopped.internal_frames(), stopped.text
    said = restarted(session)
    assert "restored every rank's variables" in said and "big" in said, said
    shown = session.run("%%mpi\nprint('kept', keep, float(big[-1]), arr.tolist())")
    assert "[rank 1] kept 7 12500000.0 [1.0, 2.0, 3.0, 4.0, 5.0]" in shown.text, shown.text


def test_a_start_that_fails_leaves_no_snapshot_folder(session):
    """No world runs, so no reaper would remove it if the kernel were killed: the folder goes at once."""
    assert session.run("%mpi stop").status == "ok"
    shown = session.run("%mpi start --mpi /bin/true")
    assert shown.status == "error" and "mpiexec exited" in shown.text, shown.text
    shown = session.run("from mpinb.notebook.world import kept_state\nprint('ROOTS', len(kept_state._roots))")
    assert "ROOTS 0" in shown.text, shown.text
    assert session.run("%mpi start -n 2").status == "ok"


def test_a_root_that_ran_ahead_of_a_failed_rank_is_not_left_to_corrupt_the_next_collective(session):
    """Rank 1 fails before a broadcast that rank 0, its root, completes at once: what rank 0 sent is in flight,
    and rank 1's next broadcast would receive it. The world is started again with every rank's variables."""
    assert session.run(STATE).status == "ok"
    shown = session.run("%%mpi\nimport numpy as np\nbuf = np.zeros(4) + 7\nif rank == 1:\n    raise ValueError('bad')\n"
                        "comm.Bcast(buf, root=0)")
    assert shown.status == "error" and "ValueError: bad" in shown.text, shown.text
    assert "the ranks left the collectives on COMM_WORLD at different points (rank 0 after #" in shown.text, shown.text
    assert "restored every rank's variables as of In[" in shown.text, shown.text
    shown = session.run("%%mpi\nb = np.zeros(4) + rank\ncomm.Bcast(b, root=0)\nprint('got', b.tolist())")
    assert shown.status == "ok" and "[rank 1] got [0.0, 0.0, 0.0, 0.0]" in shown.text, shown.text
    assert values_of_every_rank(session) == RESTORED


def test_a_snapshot_lag_set_while_the_world_runs_holds_for_every_rank_at_once(ip, magics, world_of, mpi):
    """``snapshot_lag = 0`` set after the world started: every rank's next cell waits for its snapshot of the cell
    before, so a death after cells run back to back loses at most the last one. (The ranks kept their own clocks,
    set when the world started: after the first cell they dropped every snapshot, and running cell after cell the
    ranks of a world kept different cells, none of which a restore could use.)"""
    world = world_of(2)
    before = magics.snapshot_lag
    magics.snapshot_lag = 0.0
    try:
        for value in range(1, 7):
            mpi(f"x = {value}")
        os.kill(world.identities[1]["pid"], signal.SIGKILL)
        with pytest.raises((MPIError, RankError)):
            mpi("comm.Barrier()")
        ip.run_line_magic("mpi", "restart")
        assert mpi("x") in ({0: 5, 1: 5}, {0: 6, 1: 6})
    finally:
        magics.snapshot_lag = before
