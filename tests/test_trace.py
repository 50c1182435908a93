"""Who waits for whom, on real worlds: %%mpi --trace, mpinb.trace(), Chrome export, MPINB_TRACE under plain
mpiexec, the straggler in synchronised training, and mismatched collectives caught while (or after) ranks wait."""

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mpinb
from mpinb.errors import RankError
from mpinb.notebook.world.mpis import default_mpiexec

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


def failed(run):
    with pytest.raises(RankError) as caught:
        run()
    return caught.value


@pytest.fixture
def healthy(ip, magics, world_of):
    """A world of *size* ranks that can run cells (a test before may have let MPI end the job)."""

    def ensure(size):
        world = world_of(size)
        if world.dead_ranks(world.ranks):
            ip.run_line_magic("mpi", "restart")
        return magics.world

    return ensure


STRAGGLER = """
import time, torch, mpinb, mpinb.torch as mt
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
for step in range(40):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    if rank == 2:
        time.sleep(0.03)
    mt.allreduce_gradients(model)
    opt.step()
    mpinb.report(step=step, loss=loss)
"""


def test_the_straggler_of_synchronised_training_is_named(healthy, mpi, magics, capsys):
    """Every rank runs at the same steps/s (the allreduce makes them wait for rank 2): the trace's summary and the
    live table's wait per step both name rank 2."""
    healthy(4)
    mpi(STRAGGLER, "--trace")
    out = capsys.readouterr().out
    assert "rank 2 arrived last at" in out and "per step for it" in out
    trace = mpinb.trace()
    assert set(trace["rank"]) == {0, 1, 2, 3}
    assert "step" in set(trace["op"]) and {"Allreduce", "Iallreduce"} & set(trace["op"])
    assert magics.history.held_up_by("main").keys() == {2}
    table = magics.history.summary("main")
    assert "straggler: the other ranks wait" in "; ".join(table[2]["notes"])
    assert all(not row["notes"] for row in table if row["rank"] != 2)
    mpi(STRAGGLER.replace("rank == 2", "rank == 1"), "--trace")
    assert "rank 1 arrived last at" in capsys.readouterr().out
    from mpinb.notebook.models.traces import summarize

    assert summarize(mpinb.trace()).straggler == 1


RING = """
import numpy as np
right, left = (rank + 1) % size, (rank - 1) % size
out, into = np.full(1000, rank, dtype=np.float64), np.empty(1000)
requests = [comm.Isend(out, right, tag=1), comm.Irecv(into, left, tag=1)]
MPI.Request.Waitall(requests)
got = comm.sendrecv(rank, dest=right, source=left)
half = comm.Split(rank % 2, rank)
total = half.allreduce(rank)
copy = comm.Dup()
copy.Bcast(out[:10], root=0)
"""


def test_a_ring_exchange_is_traced_call_by_call_with_bytes_and_peers(healthy, mpi, tmp_path):
    healthy(3)
    mpi(RING, "--trace")
    trace = mpinb.trace()
    assert list(trace.columns[:8]) == ["rank", "op", "comm", "peer", "bytes", "start", "end", "seq"]
    for rank in range(3):
        calls = trace[trace["rank"] == rank].set_index("op")
        assert (calls.loc["Isend", "peer"], calls.loc["Isend", "bytes"]) == ((rank + 1) % 3, 8000)
        assert (calls.loc["Irecv", "peer"], calls.loc["Irecv", "bytes"]) == ((rank - 1) % 3, 8000)
        assert calls.loc["Waitall", "kind"] == "wait" and "Isend→" in calls.loc["Waitall", "detail"]
        assert calls.loc["sendrecv", "peer"] == (rank + 1) % 3
        assert calls.loc["allreduce", "comm"] == "COMM_WORLD.Split#1"
        assert calls.loc["Bcast", "comm"] == "COMM_WORLD.Dup#2" and calls.loc["Bcast", "peer"] == 0
        assert calls.loc["Bcast", "detail"] == "10 x float64"
        assert (trace.loc[trace["rank"] == rank, "end"] >= trace.loc[trace["rank"] == rank, "start"]).all()
    bcasts = trace[trace["op"] == "Bcast"]
    assert bcasts["seq"].nunique() == 1  # the same collective on every rank
    path = tmp_path / "cell.json"
    trace.to_chrome(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    complete = [event for event in events if event["ph"] == "X"]
    assert len(complete) == len(trace[trace["kind"] != "step"])
    assert {event["name"] for event in complete} >= {"Isend", "Irecv", "Waitall", "sendrecv", "allreduce", "Bcast"}
    names = {event["pid"]: event["args"]["name"] for event in events if event.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2"}


def test_torch_distributed_collectives_are_traced(healthy, mpi):
    healthy(2)
    mpi("""
import torch, torch.distributed as dist, mpinb.torch as mt
mt.init_process_group(backend="gloo")
t = torch.ones(1000)
dist.all_reduce(t)
dist.broadcast(t, src=1)
""", "--trace")
    torch_calls = mpinb.trace().query("kind == 'torch'")
    assert set(torch_calls["op"]) == {"all_reduce", "broadcast"}
    assert set(torch_calls.loc[torch_calls["op"] == "broadcast", "peer"]) == {1}
    assert set(torch_calls["bytes"]) == {4000}


def test_the_last_trace_is_shown_again_and_untraced_cells_keep_it(healthy, mpi, ip, capsys):
    healthy(2)
    mpi("comm.Barrier()", "--trace")
    first = mpinb.trace()
    mpi("comm.Barrier()")
    capsys.readouterr()
    ip.run_line_magic("mpi", "trace")
    assert "rank  calls" in capsys.readouterr().out
    assert mpinb.trace() is first


MISMATCHES = {
    "operation": ("""import numpy as np, time
if rank == 3:
    time.sleep(60)
elif rank == 1:
    comm.Allreduce(np.zeros(4, 'f'), np.zeros(4, 'f'))
else:
    comm.Bcast(np.zeros(4), root=0)
""", ["rank 1 in Allreduce(4 x float32) at cell line 6",
      "rank 3 is not in a collective (at cell line 4: time.sleep(60))"]),
    "root": ("""import numpy as np
comm.Bcast(np.zeros(4), root=0 if rank < 2 else 1)
""", ["ranks 0-1 called Bcast(root=0, 4 x float64)", "ranks 2-3 called Bcast(root=1, 4 x float64)",
      "MPI completed it"]),
    "count": ("""import numpy as np
n = 8 if rank == 1 else 4
comm.Allreduce(np.zeros(n), np.zeros(n))
""", ["rank 1 in Allreduce(8 x float64)", "in Allreduce(4 x float64)"]),
    "type": ("""import numpy as np
t = 'f' if rank == 1 else 'd'
comm.Allreduce(np.zeros(4, t), np.zeros(4, t))
""", ["rank 1 in Allreduce(4 x float32)", "in Allreduce(4 x float64)"]),
    "skipped, then the cell ends": ("""if rank != 2:
    comm.Barrier()
""", ["ranks 0-1, 3 in Barrier() at cell line 3", "rank 2 finished the cell without entering it"]),
    "skipped, then the next one": ("""import numpy as np
if rank != 2:
    comm.Bcast(np.zeros(4), root=0)
comm.Allreduce(np.zeros(4), np.zeros(4))
""", ["rank 2 in Allreduce(4 x float64) at cell line 5"]),
    "pickle-based": ("x = comm.bcast(1, root=0) if rank != 3 else comm.allreduce(1)\n",
                     ["rank 3 in allreduce() at cell line 2", "ranks 0-2 passed it as bcast(root=0)"]),
}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_mismatched_collectives_are_named_with_each_ranks_operation(case, healthy, mpi, magics):
    """Without --trace: the collective's number, the communicator, each rank's operation and cell line, whether
    the ranks hang in it (caught by the roll call, long before the timeout), MPI completes it (caught from the
    ranks' ledgers) or MPI ends the job over it (caught from each rank's mirror of its last collective)."""
    healthy(4)
    code, expected = MISMATCHES[case]
    error = failed(lambda: mpi(code, "--timeout 60"))
    text = str(error)
    assert "collective #" in text and " on COMM_WORLD: " in text, text
    for part in expected:
        assert part in text, text
    assert "CollectiveMismatch" in text and "Timeout" not in text
    assert magics.last.mismatch and magics.last.trouble != "timeout"


def test_matching_collectives_are_never_called_a_mismatch(healthy, mpi):
    """Slow ranks, v-variants with different counts, in-place and scatter buffers of different sizes, a rank
    late to a collective by more than collective_wait: all fine."""
    healthy(3)
    result = mpi("""import numpy as np, time
if rank == 0:
    time.sleep(2.5)
comm.Barrier()
counts = [1, 2, 3]
mine = np.full(counts[rank], float(rank))
everyone = np.empty(sum(counts)) if rank == 0 else None
comm.Gatherv(mine, [everyone, counts] if rank == 0 else None, root=0)
x = np.full(3, float(rank))
comm.Allreduce(MPI.IN_PLACE, x)
part = np.empty(2)
comm.Scatter(np.arange(6, dtype=np.float64) if rank == 1 else None, part, root=1)
gathered = np.zeros(3 * 2)
comm.Allgather(MPI.IN_PLACE if rank == 0 else part, gathered) if False else None
float(x[0])
""")
    assert result == {0: 3.0, 1: 3.0, 2: 3.0}


def test_a_split_that_leaves_ranks_out_does_not_make_later_communicators_a_mismatch(healthy, mpi):
    """Ranks given COMM_NULL by a Split still count that Split, and a Create_group counts only among its group:
    the communicators made after them have the same name on every member, so collectives on them are compared
    with the right partners (once named one apart, ranks 2-3's second Split was compared with ranks 0-1's third
    and called a mismatch)."""
    healthy(4)
    code = """import numpy as np
pair = comm.Split(0 if rank < 2 else MPI.UNDEFINED, rank)
first = comm.Split(0, rank)
group = comm.Get_group().Incl([2, 3]) if rank >= 2 else None
own = comm.Create_group(group) if rank >= 2 else MPI.COMM_NULL   # collective over ranks 2-3 alone
second = comm.Split(0, rank)
first.Bcast(np.zeros(4), root=0)
second.Allreduce(MPI.IN_PLACE, np.zeros(2))
second.Barrier()
if rank >= 2:
    own.Barrier()
    group.Free()
names = (first._mpinb.name, second._mpinb.name, pair != MPI.COMM_NULL)
for made in (pair, first, second, own):
    if made != MPI.COMM_NULL:
        made.Free()
names
"""
    for _ in range(2):  # and again, when the ranks' counts of communicators made from COMM_WORLD have moved on
        result = mpi(code)
        assert len({names[:2] for names in result.values()}) == 1, result
        assert [result[rank][2] for rank in range(4)] == [True, True, False, False]


def test_tracing_works_under_plain_mpiexec(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import mpinb
        import numpy as np
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        half = comm.Split(comm.rank % 2, comm.rank)
        for step in range(5):
            comm.Allreduce(np.ones(16), np.empty(16))
            half.Barrier()
            mpinb.report(step=step, loss=1.0)
    """))
    env = dict(os.environ, MPINB_TRACE=str(tmp_path / "trace-{rank}.json"), MPINB_REPORT_EVERY="0")
    done = subprocess.run([default_mpiexec(), "-n", "2", sys.executable, str(script)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for rank in range(2):
        events = json.loads((tmp_path / f"trace-{rank}.json").read_text())["traceEvents"]
        calls = [event for event in events if event["ph"] == "X"]
        assert [event["name"] for event in calls].count("Allreduce") == 5
        assert {event["args"]["comm"] for event in calls if event["name"] == "Barrier"} == {"COMM_WORLD.Split#1"}
        assert all(event["pid"] == rank for event in calls)
        assert [event["args"]["seq"] for event in calls if event["name"] == "Allreduce"] == [1, 2, 3, 4, 5]
        assert sum(event["ph"] == "i" for event in events) == 5  # one marker per report()


def test_an_error_mpi_raises_in_a_noted_call_shows_no_frame_of_mpinb(healthy, mpi):
    """Every MPI call goes through mpinb's wrapper; the traceback reads as if the cell called mpi4py itself."""
    healthy(2)
    error = failed(lambda: mpi("import numpy as np\ncomm.Send(np.zeros(1), dest=99)"))
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error._render_traceback_()))
    assert "Invalid rank" in shown and "comm.Send(np.zeros(1), dest=99)" in shown
    assert "mpinb/rank" not in shown, shown
    assert mpi("comm.allreduce(1)") == {0: 2, 1: 2}


IDLE_THEN_TRAINING = """
import time, torch, mpinb, mpinb.torch as mt
torch.manual_seed(0)
model = torch.nn.Linear(16, 4)                       # 64 + 4 float32 parameters: one bucket of 68
mt.broadcast_parameters(model, root_rank=0)
x = torch.randn(8, 16)
time.sleep(3)                                        # loading data, say: no rank calls MPI
for step in range(30):
    loss = model(x).square().mean()
    model.zero_grad()
    loss.backward()
    time.sleep(0.04 if rank == 1 else 0.01)          # rank 1 is the straggler
    mt.allreduce_gradients(model)
    mpinb.report(step=step, loss=loss)
"""


def test_a_training_cell_after_an_idle_stretch_shows_the_steps_the_straggler_and_the_users_calls(
        healthy, mpi, ip, magics, monkeypatch):
    """What a user saw: a 3 s stretch without MPI calls squeezed the steps into a corner of the picture, the
    summary blamed mpinb's own agreement allgather, the Allreduce said "272 x uint8" for 68 float32 gradients,
    and %mpi trace showed a static image."""
    from IPython.utils.capture import capture_output

    from mpinb.notebook.models.traces import summarize

    healthy(2)
    mpi(IDLE_THEN_TRAINING, "--trace")
    trace = mpinb.trace()
    # the sizes are the user's: 68 float32 gradients in one bucket, not the 272 bytes of its raw memory
    reduces = trace[trace["op"] == "Allreduce"]
    assert len(reduces) == 2 * 30 and set(reduces["detail"]) == {"SUM, 68 x float32"}, set(reduces["detail"])
    # mpinb's own checks are labelled as mpinb's; the user's calls are mpinb.torch's
    checks = trace[trace["kind"] == "mpinb"]
    assert set(checks["op"]) == {"allgather"} and len(checks) == 2 * 31, trace["kind"].value_counts()
    assert (trace["op"] == "allreduce_gradients").sum() == 2 * 30
    assert (trace["op"] == "broadcast_parameters").sum() == 2
    summary = summarize(trace)
    assert summary.straggler == 1, summary.sentence
    assert "arrived last at" in summary.sentence and "allreduce_gradients" in summary.sentence
    assert "allgather" not in summary.sentence, summary.sentence
    assert any("mpinb's own" in note for note in summary.notes), summary.notes
    # the 3 s without calls is folded into a labelled band: the steps fill the picture
    from mpinb.widgets.idle_folding import Folding

    fold = Folding.of(trace)
    assert len(fold.bands) == 1, fold.bands
    (low, high, seconds), = fold.bands
    assert 2.9 < seconds < 4.0 and re.fullmatch(r"idle \d\.\d s", fold.label(seconds))
    steps = trace[trace["kind"] == "step"]
    first, last = steps["start"].min(), trace["end"].max()
    unfolded = (last - first) / last  # under a third: the ranks may also start the cell apart (imports)
    folded = (fold.extent - float(fold.fold(first))) / fold.extent
    assert folded > 0.5 and folded > 2 * unfolded, (folded, unfolded)
    # %mpi trace: the zoomable widget while the kernel lives, the static rendering as the fallback
    monkeypatch.setattr(magics, "live_view", "widgets")
    with capture_output() as captured:
        ip.run_line_magic("mpi", "trace")
    (shown,) = [output.data for output in captured.outputs]
    assert "application/vnd.jupyter.widget-view+json" in shown
    assert {"image/png", "text/html", "text/plain"} <= set(shown)
    assert "allreduce_gradients" in shown["text/plain"]
