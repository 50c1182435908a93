"""mpinb.torch on real worlds: data-parallel training equals one process on the whole batch, bad input is an
error on every rank, and everything works under plain mpiexec and with one rank."""

import subprocess
import sys
import textwrap

import pytest
import torch

from mpinb.errors import RankError
from mpinb.preflight import default_mpiexec
from mpinb.torch import choose_backend

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]

STEPS, BATCH, LR = 20, 64, 0.1

SETUP = f"""
import torch
import mpinb.torch as mt
torch.set_num_threads(1)

def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

def data():
    generator = torch.Generator().manual_seed(42)
    x = torch.randn({BATCH}, 8, generator=generator)
    return x, x @ torch.randn(8, 3, generator=generator)

x, y = data()
half = {BATCH} // size
mine = slice(rank * half, (rank + 1) * half)
"""


def reference(steps=STEPS):
    """One process, the whole batch, *steps* SGD steps."""
    namespace = {"rank": 0, "size": 1}
    exec(SETUP, namespace)
    model = namespace["make_model"]()
    x, y = namespace["data"]()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {name: p.detach() for name, p in model.named_parameters()}


def trained(ip, mpi, body):
    mpi(SETUP + body + "\nfinal = {n: p.detach() for n, p in model.named_parameters()}", line="--gather final --no-inspect")
    return ip.user_ns["final"]


def max_diff(a, b):
    return max(float((a[name] - b[name]).abs().max()) for name in a)


HOROVOD = f"""
model = make_model()
torch.manual_seed(rank)  # different seeds on purpose: broadcast_parameters must fix it
for p in model.parameters():
    p.data.add_(torch.randn_like(p) * (rank > 0))
mt.broadcast_parameters(model)
opt = torch.optim.SGD(model.parameters(), lr={LR})
for _ in range({STEPS}):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
    mt.allreduce_gradients(model, bucket_mb=BUCKET_MB)
    opt.step()
"""

DDP = f"""
mt.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(make_model())
opt = torch.optim.SGD(model.parameters(), lr={LR})
for _ in range({STEPS}):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
    opt.step()
model = model.module
"""

OPTIMIZER = f"""
model = make_model()
opt = mt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr={LR}), model, overlap=OVERLAP,
                              bucket_mb=0, compression=COMPRESSION)
for _ in range({STEPS}):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
    opt.step()
"""


def test_horovod_way_ddp_way_and_one_process_agree(world_of, ip, mpi):
    world_of(2)
    single = reference()
    fused = trained(ip, mpi, HOROVOD.replace("BUCKET_MB", "25"))
    per_layer = trained(ip, mpi, HOROVOD.replace("BUCKET_MB", "0"))  # a bucket per parameter
    ddp = trained(ip, mpi, DDP)
    for rank in (0, 1):
        assert max_diff(fused[rank], single) < 1e-6
        assert max_diff(per_layer[rank], single) < 1e-6
        assert max_diff(ddp[rank], single) < 1e-6
        assert max_diff(fused[rank], ddp[rank]) < 1e-6
    assert max_diff(fused[0], reference(steps=0)) > 0.01  # the comparison can fail: training moved weights


@pytest.mark.parametrize("overlap, compression, tolerance", [(False, None, 1e-6), (True, None, 1e-6),
                                                             (True, "fp16", 2e-3), (False, "fp16", 2e-3)])
def test_distributed_optimizer_overlapped_and_compressed(overlap, compression, tolerance, world_of, ip, mpi):
    world_of(2)
    single = reference()
    body = OPTIMIZER.replace("OVERLAP", str(overlap)).replace("COMPRESSION", repr(compression))
    result = trained(ip, mpi, body)
    for rank in (0, 1):
        assert max_diff(result[rank], single) < tolerance
    assert max_diff(result[0], result[1]) == 0  # every rank holds the same model


@pytest.mark.parametrize("dtype, tolerance", [("float16", 2e-3), ("bfloat16", 1.6e-2)])
def test_16_bit_gradients_sum_blocking_and_overlapped(dtype, tolerance, world_of, mpi):
    """16-bit sums go through mpinb's own MPI op (MPICH's is 20× slower): fused buckets, gradients reduced in place
    in more than one 2 MB piece, blocking and from backward hooks, all equal the float64 sum to 16-bit rounding."""
    world_of(3)
    errors = mpi(f"""
import torch, mpinb.torch as mt
torch.manual_seed(rank)
model = torch.nn.Sequential(torch.nn.Linear(2048, 1024), torch.nn.Linear(1024, 3)).to(torch.{dtype})
torch.manual_seed(0); mt.broadcast_parameters(model)
x = torch.randn(4, 2048).to(torch.{dtype})
def backward():
    model.zero_grad()
    model(x).float().square().sum().backward()
backward()
local = [p.grad.double() for p in model.parameters()]
expected = [sum(grads) for grads in zip(*comm.allgather(local))]
def error():
    return max(float((p.grad.double() - e).abs().max() / e.abs().max()) for p, e in zip(model.parameters(), expected))
mt.allreduce_gradients(model, average=False)
blocking = error()
reducer = mt.GradientAllreducer(model, average=False)
backward()
reducer.synchronize()
reducer.remove()
(blocking, error())
""")
    for rank, (blocking, overlapped) in errors.items():
        assert blocking < tolerance and overlapped < tolerance, (rank, blocking, overlapped)


def test_different_shapes_are_an_error_on_every_rank(world_of, mpi):
    world_of(2)
    with pytest.raises(RankError) as raised:
        mpi("import torch, mpinb.torch as mt\nbad = torch.nn.Linear(3, 2 + rank)\nmt.broadcast_parameters(bad)")
    text = str(raised.value)
    assert "ranks 0-1: ValueError: broadcast_parameters: ranks disagree on 2 parameter(s): " in text
    assert "parameter 'weight': (2, 3) float32 on rank 0; (3, 3) float32 on rank 1" in text
    assert mpi("comm.allreduce(1)") == {0: 2, 1: 2}  # no rank left inside a collective


def test_a_missing_gradient_names_parameter_and_ranks_on_every_rank(world_of, mpi):
    world_of(2)
    code = """
import torch, mpinb.torch as mt
net = torch.nn.ModuleDict({"used": torch.nn.Linear(2, 2), "sometimes": torch.nn.Linear(2, 2)})
out = net["used"](torch.ones(1, 2))
if rank == 1:
    out = net["sometimes"](out)
out.sum().backward()
"""
    with pytest.raises(RankError) as raised:
        mpi(code + "mt.allreduce_gradients(net)")
    text = str(raised.value)
    assert "ranks 0-1: ValueError: allreduce_gradients: ranks disagree on 2 parameter(s)" in text
    assert ("parameter 'sometimes.weight': (2, 2) float32, no gradient on rank 0; (2, 2) float32, gradient on "
            "rank 1 (not used in that rank's forward pass?)") in text
    with pytest.raises(RankError, match="ranks 0-1: ValueError: GradientAllreducer: ranks disagree"):
        mpi("""
net.zero_grad(set_to_none=True)
reducer = mt.GradientAllreducer(net, bucket_mb=0)
out = net["used"](torch.ones(1, 2))
if rank == 1:
    out = net["sometimes"](out)
out.sum().backward()
reducer.synchronize()
""")
    mpi("reducer.remove()\nnet.zero_grad(set_to_none=True)\nnet['used'](torch.ones(1, 2)).sum().backward()\n"
        "net['sometimes'](torch.ones(1, 2)).sum().backward()\nmt.allreduce_gradients(net)")  # usable again


def test_init_process_group_twice_is_harmless(world_of, mpi):
    world_of(2)
    first = mpi("import mpinb.torch as mt\nmt.init_process_group()")
    assert first[0]["backend"] == "gloo" and first[1]["rank"] == 1 and first[1]["device"] == "cpu"
    assert mpi("mt.init_process_group()") == first
    assert mpi("import torch, torch.distributed as dist\nt = torch.tensor([rank + 1.0])\ndist.all_reduce(t)\n"
               "t.item()") == {0: 3.0, 1: 3.0}


@pytest.mark.parametrize("ranks", [1, 2])
def test_under_plain_mpiexec(ranks, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import torch
        import mpinb.torch as mt
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        info = mt.init_process_group()
        model = torch.nn.Linear(4, 1)
        mt.broadcast_parameters(model)
        opt = mt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, overlap=True)
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
        weights = comm.allgather(model.weight.detach())
        assert all(torch.equal(w, weights[0]) for w in weights)
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        ddp(torch.randn(2, 4)).sum().backward()
        with open(f"{tmp_path}/done-{{comm.rank}}", "w") as done:
            done.write(f"{{info['backend']}} {{info['size']}}")
    """))
    done = subprocess.run([default_mpiexec(), "-n", str(ranks), sys.executable, str(script)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for rank in range(ranks):
        assert (tmp_path / f"done-{rank}").read_text() == f"gloo {ranks}"


def test_backend_and_device_choice():
    assert choose_backend(None, gpus_per_rank=0, local_size=4, nccl_available=True) == ("gloo", False, None)
    assert choose_backend(None, gpus_per_rank=1, local_size=1, nccl_available=True) == ("nccl", True, None)
    assert choose_backend(None, gpus_per_rank=8, local_size=8, nccl_available=True) == ("nccl", True, None)
    backend, cuda, note = choose_backend(None, gpus_per_rank=1, local_size=2, nccl_available=True)
    assert (backend, cuda) == ("gloo", True) and "2 ranks share 1 GPU(s)" in note
    assert choose_backend(None, gpus_per_rank=2, local_size=2, nccl_available=False)[:2] == ("gloo", True)
    with pytest.raises(ValueError, match="needs one GPU per rank, but 2 ranks share 1 GPU"):
        choose_backend("nccl", gpus_per_rank=1, local_size=2, nccl_available=True)
    with pytest.raises(ValueError, match="needs a CUDA GPU on every rank"):
        choose_backend("nccl", gpus_per_rank=0, local_size=1, nccl_available=True)
    with pytest.raises(ValueError, match="not 'ncll'"):
        choose_backend("ncll", gpus_per_rank=0, local_size=1, nccl_available=True)
    assert choose_backend("gloo", gpus_per_rank=0, local_size=2, nccl_available=False) == ("gloo", False, None)
