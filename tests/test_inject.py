"""Faults on demand (``%mpi inject``): each planted on one rank of a real world, acted on at its collectives in
code that was not changed, diagnosed as mpinb diagnoses the real thing, and removed with one command."""

import math

import pytest
from conftest import assert_all_gone, world_processes
from IPython.core.error import UsageError

from mpinb.errors import RankError

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(180)]

# a student's loop: a gradient allreduce (buffers) and a loss averaged (objects), every step
LOOP = """
import numpy as np
grads = np.ones(4)
for step in range(6):
    comm.Allreduce(MPI.IN_PLACE, grads)
    grads /= size
    loss = comm.allreduce(1.0 / (step + 1)) / size
"""


def test_nan_and_perturb_spoil_what_one_rank_receives_and_clear_puts_it_right(ip, world_of, mpi, capsys):
    world_of(3)
    ip.run_line_magic("mpi", "inject clear")
    # the loop's last two collectives are its 11th (the gradients) and 12th (the loss)
    ip.run_line_magic("mpi", "inject nan --rank 1 --at 12")
    ip.run_line_magic("mpi", "inject perturb --rank 2 --at 11 --scale 0.5")
    ip.run_line_magic("mpi", "inject")
    out = capsys.readouterr().out
    assert "rank 1 nan: gets NaN from its 12th collective (0 collectives so far)" in out, out
    assert "rank 2 perturb: gets noise of scale 0.5 added to what each collective gives it, from its 11th on" in out
    mpi(LOOP)
    grads, loss = mpi("grads"), mpi("loss")
    assert (grads[0] == 1.0).all() and (grads[1] == 1.0).all() and not (grads[2] == 1.0).all(), grads
    assert math.isnan(loss[1]) and not math.isnan(loss[0]) and loss[2] != loss[0], loss
    ip.run_line_magic("mpi", "inject clear")
    assert "removed 2 faults: the ranks run as written" in capsys.readouterr().out
    mpi(LOOP)
    assert all((grads == 1.0).all() for grads in mpi("grads").values())


def test_kill_at_the_third_collective_is_named_as_a_death(ip, world_of, mpi):
    world = world_of(3)
    ip.run_line_magic("mpi", "inject kill --rank 2 --at 3")
    old = world_processes(world)
    with pytest.raises(RankError) as raised:
        mpi(LOOP)
    assert "rank 2: RankLost: rank 2 died: signal 9 (SIGKILL)" in str(raised.value), raised.value
    ip.run_line_magic("mpi", "restart --fresh")  # a new world has no fault planted
    assert_all_gone(old)
    mpi(LOOP)
    assert mpi("step") == {0: 5, 1: 5, 2: 5}


def test_a_stalled_rank_is_named_by_the_ranks_waiting_for_it(ip, world_of, mpi):
    world_of(3)
    ip.run_line_magic("mpi", "inject clear")
    ip.run_line_magic("mpi", "inject stall --rank 0 --at 4")
    with pytest.raises(RankError) as raised:
        mpi(LOOP, "--timeout 4")
    text = str(raised.value)
    assert "rank 0" in text and "Timeout" in text, text
    assert "mpinb/rank/faults.py" not in text, text
    ip.run_line_magic("mpi", "inject clear")
    mpi(LOOP)


def test_a_straggler_is_named_by_the_trace(ip, world_of, mpi, capsys):
    world_of(3)
    ip.run_line_magic("mpi", "inject clear")
    ip.run_line_magic("mpi", "inject straggler --rank 1 --delay 0.05")
    capsys.readouterr()
    mpi(LOOP, "--trace")
    assert "rank 1 arrived last at" in capsys.readouterr().out
    ip.run_line_magic("mpi", "inject clear")


TORCH_LOOP = """
import torch, mpinb.torch as mt
torch.manual_seed(0)
model = torch.nn.Linear(32, 4)
for step in range(8):
    model.zero_grad()
    model(torch.ones(16, 32) * (rank + 1)).sum().backward()
    mt.allreduce_gradients(model)
"""


def test_a_straggler_in_mpinbs_own_gradient_allreduce_arrives_late_at_it_once_a_step(ip, world_of, mpi, capsys):
    """allreduce_gradients makes several collectives inside one traced call: the fault acts on the call, so the
    straggler arrives last at each step's call, and the step counts once for --at."""
    world_of(2)
    ip.run_line_magic("mpi", "inject clear")
    # the loop once before the fault: a world's first import of torch and first backward can take one rank
    # longer than the other by more than the delay (rank 0 arrived last at the first call, on a busy machine);
    # the delay is well over what a busy machine holds a rank up by between two calls
    mpi(TORCH_LOOP)
    # the fault from the 2nd collective on: the barrier before the loop lets the ranks start it together
    ip.run_line_magic("mpi", "inject straggler --rank 1 --delay 0.15 --at 2")
    capsys.readouterr()
    mpi("comm.Barrier()\n" + TORCH_LOOP, "--trace")
    said = capsys.readouterr().out
    assert "rank 1 arrived last at 8 of 8 allreduce_gradients calls" in said, said
    ip.run_line_magic("mpi", "inject clear")
    ip.run_line_magic("mpi", "inject kill --rank 0 --at 3")
    with pytest.raises(RankError, match="rank 0 died") as died:
        # each step's line given time to leave the rank before the next step (a killed rank's last lines can
        # be in its buffer still)
        mpi(TORCH_LOOP + "    print('step', step, flush=True)\n    __import__('time').sleep(0.5)")
    out = capsys.readouterr().out + str(died.value)
    assert sorted(out.count(f"[rank {r}] step") for r in range(2)) == [2, 2], out


def test_inject_needs_a_rank_of_the_world(ip, world_of):
    world_of(3)
    with pytest.raises(UsageError, match=r"%mpi inject kill takes --rank R, a rank of this world \(0-2\)"):
        ip.run_line_magic("mpi", "inject kill --rank 7")


def test_faults_act_once_at_each_torch_collective_of_the_mpi4py_backend(ip, world_of, mpi, capsys):
    """On mpinb's torch.distributed backend a ``dist.all_reduce`` is one collective to a fault, as on gloo: not
    the MPI calls the backend makes for it (its agreement check, its Allreduce)."""
    pytest.importorskip("torch")
    world_of(2)
    mpi("import torch, torch.distributed as dist, mpinb.torch as mt\nbackend = mt.init_process_group()['backend']")
    assert mpi("backend") == {0: "mpi4py", 1: "mpi4py"}
    try:
        ip.run_line_magic("mpi", "inject clear")
        ip.run_line_magic("mpi", "inject nan --rank 1 --at 2")
        mpi("out = []\nfor _ in range(3):\n    t = torch.ones(4)\n    dist.all_reduce(t)\n    out.append(t.tolist())")
        out = mpi("out")
        assert out[0] == [[2.0] * 4] * 3, out
        assert out[1][0] == out[1][2] == [2.0] * 4 and all(math.isnan(x) for x in out[1][1]), out
        capsys.readouterr()
        ip.run_line_magic("mpi", "inject")
        assert "rank 1 nan: gets NaN from its 2nd collective (3 collectives so far)" in capsys.readouterr().out
    finally:
        ip.run_line_magic("mpi", "inject clear")
        mpi("dist.destroy_process_group()")  # the world goes on to other tests without a group
