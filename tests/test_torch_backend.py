"""The ``"mpi4py"`` torch.distributed backend on real worlds: every collective gives gloo's result on the same
inputs, DistributedDataParallel (no_sync, join, find_unused_parameters, static_graph, gradient_as_bucket_view,
the fp16 compression hook) and FSDP train to gloo's weights, under plain mpiexec; and through a %%mpi world."""

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from mpinb.notebook.world.mpis import default_mpiexec
from mpinb.torch import choose_backend

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]

HERE = Path(__file__).parent


def test_mpi4py_is_the_backend_mpinb_torch_chooses_on_cpus_and_gloo_one_switch_away():
    assert choose_backend("mpi4py", gpus_per_rank=0, local_size=2, nccl_available=False) == ("mpi4py", False, None)
    assert choose_backend(None, gpus_per_rank=0, local_size=2, nccl_available=False) == ("mpi4py", False, None)
    assert choose_backend("gloo", gpus_per_rank=0, local_size=2, nccl_available=False) == ("gloo", False, None)
    with pytest.raises(ValueError, match="'mpi4py', 'gloo'"):
        choose_backend("mpi4pi", gpus_per_rank=0, local_size=1, nccl_available=False)


def test_every_collective_and_ddp_and_fsdp_match_gloo_under_mpiexec():
    done = subprocess.run([default_mpiexec(), "-n", "2", sys.executable, str(HERE / "torch_backend_checks.py")],
                          capture_output=True, text=True, timeout=200)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("ok ", "FAIL "))]
    failed = [line for line in lines if line.startswith("FAIL ")]
    assert not failed and done.returncode == 0, "\n".join(failed) or done.stderr[-3000:]
    assert len(lines) > 100, done.stdout[-2000:]


SETUP = """%%mpi -n 2
import torch, torch.distributed as dist
import mpinb.torch as mt
info = mt.init_process_group("mpi4py")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [torch.randn(8, 4) for _ in range(11)][rank::2]
def step(x):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
print(info['backend'], dist.get_backend())
"""
STEP = "%%mpi\nstep(batches[0])\nprint('step ok', model.module.weight.sum().item())"


@pytest.fixture(scope="module")
def session():
    from kernel_session import jupyter_client_kernel

    with jupyter_client_kernel() as k:
        assert k.run("%load_ext mpinb").status == "ok"
        yield k
        k.run("%mpi stop")


@pytest.fixture
def ddp(session):
    """A 2-rank world whose default group is the mpi4py backend's, a DDP model and 6 batches on rank 0, 5 on 1."""
    shown = session.run(SETUP)
    if shown.status != "ok":
        session.run("%mpi stop")
        shown = session.run(SETUP)
    assert shown.status == "ok" and shown.text.count("mpi4py mpi4py") == 2, shown.text
    return session


def healthy_step(k):
    shown = k.run(STEP)
    assert shown.status == "ok", shown.text
    sums = [line.split("step ok")[1] for line in shown.text.splitlines() if "step ok" in line]
    assert len(sums) == 2 and len(set(sums)) == 1, shown.text


@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.parametrize("cell, said", [
    ("dist.all_reduce(torch.ones(4 if rank == 0 else 8))",
     "rank 0 in all_reduce(4 x float32, SUM); rank 1 in all_reduce(8 x float32, SUM). Likely the ranks passed "
     "tensors of different sizes or types"),
    ("dist.all_reduce(torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64))",
     "rank 0 in all_reduce(4 x float32, SUM); rank 1 in all_reduce(4 x float64, SUM)"),
    ("t = torch.ones(4)\nif rank == 0:\n    dist.all_reduce(t)\nelse:\n    dist.broadcast(t, src=0)",
     "rank 0 in all_reduce(4 x float32, SUM); rank 1 in broadcast(root=0, 4 x float32). Likely the ranks call "
     "collectives in a different order"),
])
def test_a_mismatch_is_named_on_every_rank_and_the_world_kept(cell, said, ddp):
    shown = ddp.run("%%mpi\n" + cell)
    assert shown.status == "error", shown.text
    assert "RuntimeError: ranks of process group 'default' called different collectives: " + said in shown.text, \
        shown.text
    assert "RankError: cell failed on every rank it ran on (ranks 0-1)" in shown.text
    assert "Abort" not in shown.text and "restart" not in shown.text, shown.text  # MPI did not end the job
    healthy_step(ddp)


@pytest.mark.slow
@pytest.mark.notebook
def test_a_ddp_model_of_other_shapes_on_one_rank_is_named_and_the_world_kept(ddp):
    shown = ddp.run("%%mpi\nother = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1 if rank == 0 else 2))")
    assert shown.status == "error", shown.text
    assert "rank 1: RuntimeError: [1]: params[0] in this process with sizes [2, 4] appears not to match" in shown.text
    assert "the world and every rank's variables are kept" in shown.text, shown.text
    healthy_step(ddp)


@pytest.mark.slow
@pytest.mark.notebook
def test_uneven_inputs_are_named_as_under_gloo(ddp):
    shown = ddp.run("%%mpi\nfor x in batches:\n    step(x)\nkept = 'yes'")
    assert shown.status == "error", shown.text
    assert "rank 0 in DDP all_reduce(5 x float32) at cell line 3" in shown.text, shown.text
    assert "rank 1 finished the cell without entering it" in shown.text
    assert "the world and every rank's variables are kept" in shown.text


@pytest.mark.slow
@pytest.mark.notebook
def test_a_traced_cell_shows_each_ddp_bucket_and_call(ddp):
    shown = ddp.run("%%mpi --trace\nstep(batches[0])\ndist.all_reduce(torch.ones(3))")
    assert shown.status == "ok", shown.text
    shown = ddp.run("import mpinb\nspans = mpinb.trace()\n"
                    "print(sorted(set(map(tuple, spans[['kind', 'op', 'comm']].values.tolist()))))")
    assert "('collective', 'all_reduce', 'torch.mpi:default')" in shown.text, shown.text  # DDP's bucket, and ours
    assert "('torch', 'all_reduce', 'torch:default')" in shown.text, shown.text  # the dist.all_reduce call


@pytest.mark.slow
@pytest.mark.notebook
def test_stop_reaches_a_rank_waiting_in_a_collective_and_the_world_is_kept(ddp):
    code = ("%%mpi\nimport time\nprint('waiting', flush=True)\nif rank == 0:\n    dist.all_reduce(torch.ones(3))\n"
            "else:\n    time.sleep(60)")
    shown = ddp.run(code, stops=(1.0,), after="[rank 1] waiting", timeout=120)
    assert shown.status == "error", shown.text
    assert "KeyboardInterrupt" in shown.text or "interrupted" in shown.text.lower(), shown.text
    assert "world and every rank's variables are kept" in shown.text or "restart" not in shown.text, shown.text
    healthy_step(ddp)


@pytest.mark.slow
@pytest.mark.notebook
def test_stop_lets_out_a_rank_waiting_in_backward_for_a_rank_stopped_after_its_forward(ddp):
    """Stop at a random moment of a training loop: one rank waits in its backward's bucket all_reduce while the
    other is stopped in Python after its forward (the step is in its ledger, its reduction never began)."""
    code = ("%%mpi\nimport time\nstep(batches[0])\nloss = model(batches[1]).pow(2).mean()\n"
            "print('waiting', flush=True)\nif rank == 0:\n    loss.backward()\nelse:\n    time.sleep(60)")
    shown = ddp.run(code, stops=(1.0,), after="[rank 1] waiting", timeout=120)
    assert shown.status == "error", shown.text
    assert "the world and every rank's variables are kept" in shown.text, shown.text
    assert "starting the world" not in shown.text, shown.text
    healthy_step(ddp)


@pytest.mark.slow
@pytest.mark.notebook
def test_stop_during_python_inside_a_backward_waits_for_its_buckets(ddp):
    """A Stop that comes while a rank's backward runs Python (a gradient hook) before a bucket is reduced: raised
    there, the rank would leave the bucket the other rank waits in; it is raised once the backward is over."""
    code = ("%%mpi\nimport time\nif rank == 1:\n"
            "    hook = model.module.weight.register_hook(lambda g: time.sleep(4) or g)\n"
            "print('waiting', flush=True)\ntry:\n    step(batches[0])\nfinally:\n"
            "    if rank == 1:\n        hook.remove()")
    shown = ddp.run(code, stops=(1.5,), after="[rank 1] waiting", timeout=120)
    assert shown.status == "error", shown.text
    assert "KeyboardInterrupt: cell interrupted on every rank it ran on (ranks 0-1)" in shown.text, shown.text
    assert "starting the world" not in shown.text and "started again" not in shown.text, shown.text
    healthy_step(ddp)


@pytest.mark.slow
@pytest.mark.notebook
def test_stops_at_random_moments_of_a_training_loop_keep_the_world(ddp):
    """Stop a DDP training loop at random moments (``MPINB_STOP_SEED=N`` replays them): each stops the cell on
    every rank and keeps the world, whichever of forward, backward, its buckets or the optimizer each rank was in."""
    seed = int(os.environ.get("MPINB_STOP_SEED") or random.randrange(1 << 16))
    chooser = random.Random(seed)
    loop = "%%mpi\nprint('training', flush=True)\nfor i in range(10 ** 6):\n    step(batches[i % len(batches)])"
    for number in range(3):
        delay = chooser.uniform(0.2, 2.0)
        shown = ddp.run(loop, stops=(delay,), after="[rank 1] training", timeout=120)
        said = f"seed {seed}, Stop {number + 1} {delay:.2f} s after the loop began:\n{shown.text}"
        assert shown.status == "error" and "KeyboardInterrupt" in shown.text, said
        assert "starting the world" not in shown.text and "started again" not in shown.text, said
        healthy_step(ddp)


@pytest.mark.slow
@pytest.mark.notebook
def test_pytorchs_own_tests_pass_in_a_world(session):
    """Tests of torch's own suite (tests/torch_suite.py), run by %mpi run in the kernel's world."""
    shown = session.run("%%mpi -n 2\nimport torch.distributed as dist\n"
                        "if dist.is_initialized():\n    dist.destroy_process_group()")
    assert shown.status == "ok", shown.text
    shown = session.run(f"%mpi run {HERE / 'torch_suite.py'} test_all_reduce_sum test_broadcast "
                        "test_all_gather_coalesced_simple test_DistributedDataParallelCPU test_send_recv_any_source")
    assert "5 passed, 0 skipped, 0 failed on 2 ranks (as mpi4py)" in shown.text, shown.text
    assert shown.status == "ok", shown.text
