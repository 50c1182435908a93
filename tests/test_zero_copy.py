"""--gather through shared memory gives views, not copies: the values the notebook gets are mapped from the
segments the ranks wrote, stay as they were while the user holds them, and give their memory back when dropped."""

import ctypes
import gc

import pytest
import torch

from mpinb.wire.shm import KEEP_FREE

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]


def segment_mappings():
    """``[(start, end)]`` of this process's mappings of ranks' shared-memory segments."""
    spans = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "/mpinb-" in line and ("/dev/shm/" in line or "/tmp/" in line):
                start, end = (int(part, 16) for part in line.split()[0].split("-"))
                spans.append((start, end))
    return spans


def resident():
    """``(all, shared memory)``: the bytes of this process that are resident, and of those the ones in shared memory
    (the ranks' segments it maps), from ``/proc/self/status``."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            fields[name] = value
    return tuple(int(fields[name].split()[0]) << 10 for name in ("VmRSS", "RssShmem"))


def address(value):
    return value.data_ptr() if isinstance(value, torch.Tensor) else value.__array_interface__["data"][0]


def lent(mpi):
    """How many segments each rank has lent to the notebook."""
    return mpi("len(__import__('mpinb.rank.agent', fromlist=['_agent'])._agent.segments.lent)")


def test_gathered_arrays_and_tensors_are_views_of_the_ranks_shared_memory(world_of, mpi, ip):
    world_of(2)
    mpi("import numpy as np, torch\nx = np.full(1 << 20, rank, dtype=np.float64)\nt = torch.arange(8.0) * rank",
        line="--gather x t --no-inspect")
    x, t = ip.user_ns["x"], ip.user_ns["t"]
    spans = segment_mappings()
    for value in (x[0], x[1], t[0], t[1]):
        assert any(start <= address(value) < end for start, end in spans), "a copy, not a view"
    assert (x[1] == 1).all() and torch.equal(t[1], torch.arange(8.0))


def test_a_held_value_never_changes_and_writing_to_it_stays_in_the_notebook(world_of, mpi, ip):
    world_of(2)
    mpi("import numpy as np\nx = np.full(1000, 10.0 + rank)", line="--gather x --no-inspect")
    kept = ip.user_ns["x"]
    kept[0][:3] = -1.0  # the notebook's own copy-on-write pages
    for value in (20.0, 30.0):  # later gathers write elsewhere while `kept` holds the first
        mpi(f"x = np.full(1000, {value} + rank)", line="--gather x --no-inspect")
        assert (ip.user_ns["x"][1] == value + 1).all()
    assert (kept[0][3:] == 10.0).all() and (kept[0][:3] == -1.0).all() and (kept[1] == 11.0).all()
    assert mpi("float(x[0])") == {0: 30.0, 1: 31.0}  # the ranks' own values are theirs


def test_a_dropped_value_gives_its_segment_back_to_the_rank(world_of, mpi, ip):
    world_of(2)
    gc.collect()
    mpi("pass")
    other = lent(mpi)[0]  # what earlier gathers still hold
    mpi("import numpy as np\ny = np.ones(1 << 16)", line="--gather y --no-inspect")
    ip.run_cell("held = y")  # the notebook's own names only (this function's locals are seen by the magics)
    mpi("pass")
    assert lent(mpi) == {0: other + 1, 1: other + 1}  # held: still lent
    before = len(segment_mappings())
    ip.run_cell("del held, y")
    gc.collect()
    assert len(segment_mappings()) == before - 2  # unmapped here
    mpi("pass")  # the next cell tells the ranks
    assert lent(mpi) == {0: other, 1: other}


def test_fifty_gathers_keeping_only_the_last_hold_the_memory_of_one(world_of, mpi, ip):
    """50 gathers of 32 MB per rank, each read in full, the name rebound each time: the ranks' shared memory the
    kernel holds stays within 1.2x of what one gather added, its whole resident memory grows by less than one more
    gather would add, and each rank keeps one segment lent and at most two free."""
    world_of(2)
    mpi("import numpy as np\nfifty = np.zeros(1 << 22)", line="--no-inspect")  # 32 MB of float64 per rank
    # a name no other test binds: the shell lives across tests, and rebinding, say, test_gather's `big` frees 40 MB
    # of its views at step 0, hiding this gather's growth
    ip.user_ns.pop("fifty", None)
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)  # nor the allocator give back, mid-test, what it holds from before
    other = lent(mpi)[0]  # what earlier gathers still hold
    base = resident()
    growth = []
    for step in range(50):
        mpi(f"fifty[:] = {step} + rank", line="--gather fifty --no-inspect")
        ip.run_cell(f"assert fifty[0].sum() == {step} * (1 << 22) and fifty[1].min() == {step} + 1")  # read in full
        gc.collect()
        growth.append([now - before for now, before in zip(resident(), base)])
    payload = 2 * (32 << 20)
    shared = [step[1] for step in growth]
    assert shared[0] >= 0.9 * payload
    assert max(shared) <= 1.2 * shared[0] + payload * 0.05, [g >> 20 for g in shared]
    # the whole process: other threads of this test session allocate too (14-21 MB once, in a full run), but a
    # gather kept, or copied out of its segment, adds a whole payload
    assert max(step[0] for step in growth) < shared[0] + payload / 2, [[g >> 20 for g in step] for step in growth]
    mpi("pass")  # tells the ranks what was dropped
    pools = mpi("s = __import__('mpinb.rank.agent', fromlist=['_agent'])._agent.segments\n"
                "len(s.lent), len(s.free)")
    assert all(lent_now <= other + 1 and free <= KEEP_FREE for lent_now, free in pools.values()), (other, pools)
