"""The classic DDP bugs, planted in a real kernel's notebook with no ``--timeout``: each is named in the cell (the
ranks, the collective or the parameters, the cell line, the fix), and the world and variables are kept where the
backend lets them be (the next DDP step works): with the default mpi4py backend on CPUs every time; gloo, asked for,
aborts a rank on a size mismatch.

torch.distributed's own collectives (DDP's gradient buckets through its communication hook, its buffer
broadcasts, ``dist.*`` calls, async ones) are in the ledger mismatch detection and the roll call read."""

import pytest
from kernel_session import jupyter_client_kernel

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.notebook]

SETUP = """%%mpi -n 2
import torch, torch.distributed as dist
import mpinb.torch as mt
info = mt.init_process_group()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [torch.randn(8, 4) for _ in range(11)][rank::2]
def step(x):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
"""
STEP = "%%mpi\nstep(batches[0])\nprint('step ok', model.module.weight.sum().item())"


def clean(shown):
    assert not shown.internal_frames(), shown.text
    return shown


@pytest.fixture(scope="module")
def session():
    with jupyter_client_kernel() as k:
        assert k.run("%load_ext mpinb").status == "ok"
        yield k
        k.run("%mpi stop")


@pytest.fixture
def ddp(session):
    """A 2-rank world with a DDP model ``model``, its optimizer ``opt`` and 6 batches on rank 0, 5 on rank 1."""
    shown = session.run(SETUP)
    if shown.status != "ok":  # the world an earlier test left may have ended: start afresh
        session.run("%mpi stop")
        shown = session.run(SETUP)
    assert shown.status == "ok", shown.text
    return session


def healthy_step(k):
    """The next DDP step runs on both ranks, with the same weights on each."""
    shown = clean(k.run(STEP))
    assert shown.status == "ok", shown.text
    sums = [line.split("step ok")[1] for line in shown.text.splitlines() if "step ok" in line]
    assert len(sums) == 2 and len(set(sums)) == 1, shown.text


def test_uneven_inputs_are_named_and_the_world_kept(ddp):
    shown = clean(ddp.run("%%mpi\nfor x in batches:\n    step(x)\nkept = 'yes'"))
    assert shown.status == "error", shown.text
    assert "rank 0 in DDP all_reduce(5 x float32) at cell line 3" in shown.text, shown.text
    assert "rank 1 finished the cell without entering it" in shown.text
    assert "uneven inputs" in shown.text and "model.join()" in shown.text and "drop_last=True" in shown.text
    assert "the world and every rank's variables are kept" in shown.text
    assert "Timed out" not in shown.text  # not gloo's timeout, minutes later
    healthy_step(ddp)


def test_the_fix_join_trains_the_uneven_batches(ddp):
    shown = clean(ddp.run("%%mpi\nwith model.join():\n    for x in batches:\n        step(x)\nprint('joined')"))
    assert shown.status == "ok" and shown.text.count("joined") == 2, shown.text
    healthy_step(ddp)


def test_a_size_mismatch_is_named_on_every_rank_and_the_world_kept(ddp):
    """On CPUs the default group is mpinb's backend over mpi4py: it checks every call before data moves."""
    shown = clean(ddp.run("%%mpi\ndist.all_reduce(torch.ones(4 if rank == 0 else 8))"))
    assert shown.status == "error", shown.text
    assert "rank 0 in all_reduce(4 x float32" in shown.text and "rank 1 in all_reduce(8 x float32" in shown.text
    assert "different sizes or types" in shown.text
    assert "%mpi restart" not in shown.text
    healthy_step(ddp)


def test_on_gloo_a_size_mismatch_says_both_sizes_and_that_the_backend_ended_the_job(session):
    """gloo checks the sizes itself and aborts the process (SIGABRT): the job is over, and the message says so."""
    session.run("%mpi stop")  # a group already made would be described, not changed: gloo needs a new world
    try:
        shown = session.run(SETUP.replace("mt.init_process_group()", 'mt.init_process_group("gloo")'))
        assert shown.status == "ok", shown.text
        shown = clean(session.run("%%mpi\nassert info['backend'] == 'gloo'\n"
                                  "dist.all_reduce(torch.ones(4 if rank == 0 else 8))"))
        assert shown.status == "error", shown.text
        assert "rank 0 in all_reduce(4 x float32)" in shown.text and "rank 1 in all_reduce(8 x float32)" in shown.text
        assert "different sizes or types" in shown.text
        assert "%mpi restart" in shown.text
    finally:
        session.run("%mpi stop")  # the next test's world makes its group with the default backend


def test_a_different_order_of_collectives_is_named(ddp):
    code = ("%%mpi\nt = torch.ones(4)\nif rank == 0:\n    dist.all_reduce(t)\n    dist.broadcast(t, src=0)\n"
            "else:\n    dist.broadcast(t, src=0)\n    dist.all_reduce(t)")
    shown = clean(ddp.run(code))
    assert shown.status == "error", shown.text
    assert "all_reduce(4 x float32" in shown.text and "broadcast(root=0, 4 x float32)" in shown.text, shown.text
    assert "different order" in shown.text
    healthy_step(ddp)  # the mpi4py backend raised before any data moved: the world and its group are kept


def test_rank_dependent_branches_name_the_parameters_each_rank_left_out(ddp):
    code = """%%mpi
class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
    def forward(self, x):
        return self.a(x) if rank == 0 else self.b(x)
two = torch.nn.parallel.DistributedDataParallel(Two())
for _ in range(2):
    two(batches[0]).sum().backward()
"""
    shown = clean(ddp.run(code))
    assert shown.status == "error", shown.text
    assert "parameters b.weight, b.bias of the DDP model got no gradient on rank 0" in shown.text, shown.text
    assert "parameters a.weight, a.bias of the DDP model got no gradient on rank 1" in shown.text
    assert "find_unused_parameters=True" in shown.text
    healthy_step(ddp)


def test_parameters_that_drift_apart_are_named_after_the_cell(ddp):
    shown = clean(ddp.run("%%mpi\nwith torch.no_grad():\n    if rank == 1:\n        model.module.bias += 1"))
    assert shown.status == "ok", shown.text
    assert "the parameters of `model` differ across ranks after this cell (module.bias" not in shown.text
    assert "the parameters of `model` differ across ranks after this cell (bias: rank 0; rank 1" in shown.text, \
        shown.text
    again = ddp.run("%%mpi\nwith torch.no_grad():\n    if rank == 1:\n        model.module.bias += 1")
    assert "differ across ranks" not in again.text  # said once


def test_batchnorm_statistics_without_syncbatchnorm_are_named(ddp):
    code = """%%mpi
net = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))
net(batches[0] + rank).sum().backward()
"""
    shown = clean(ddp.run(code))
    assert shown.status == "ok", shown.text
    assert "the BatchNorm statistics of `net` differ across ranks (1.running_mean" in shown.text, shown.text
    assert "SyncBatchNorm.convert_sync_batchnorm" in shown.text
    averaged = code + ("for buffer in net.module[1].running_mean, net.module[1].running_var:\n"
                       "    dist.all_reduce(buffer)\n    buffer /= size\n")  # the CPU fix (SyncBatchNorm needs GPUs)
    shown = clean(ddp.run(averaged.replace("net", "averaged")))
    assert shown.status == "ok" and "differ across ranks" not in shown.text, shown.text


def test_a_distributed_sampler_without_set_epoch_is_named(ddp):
    code = """%%mpi
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
data = TensorDataset(torch.arange(16.0))
sampler = DistributedSampler(data, shuffle=True)
orders = [[int(x) for (x,) in DataLoader(data, sampler=sampler, batch_size=1)] for epoch in range(3)]
"""
    shown = clean(ddp.run(code))
    assert shown.status == "ok", shown.text
    assert "iterated again with epoch 0" in shown.text and "sampler.set_epoch(epoch)" in shown.text, shown.text
    assert shown.text.count("iterated again") == 2  # once per sampler, on each rank
    fixed = code.replace("for epoch in range(3)]", "for epoch in range(3) if sampler.set_epoch(epoch) is None]")
    shown = clean(ddp.run(fixed.replace("sampler =", "sampler2 = sampler =")))
    assert shown.status == "ok" and "iterated again" not in shown.text, shown.text
