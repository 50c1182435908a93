"""mpinb.torch on real worlds: data-parallel training equals one process on the whole batch, bad input is an
error on every rank, and everything works under plain mpiexec and with one rank."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from mpinb.errors import RankError
from mpinb.notebook.world.mpis import default_mpiexec
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
    keep = "\nfinal = {n: p.detach() for n, p in model.named_parameters()}"
    mpi(SETUP + body + keep, line="--gather final --no-inspect")
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
    assert first[0]["backend"] == "mpi4py" and first[1]["rank"] == 1 and first[1]["device"] == "cpu"
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
        adam = torch.optim.Adam(model.parameters(), lr=0.1)
        if comm.rank == 0:  # rank 0 resumes from a checkpoint: it has stepped once
            model(torch.randn(8, 4)).pow(2).mean().backward()
            adam.step()
        mt.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = mt.DistributedOptimizer(adam, model, overlap=True)
        mt.broadcast_optimizer_state(opt, root_rank=0)
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
        weights = comm.allgather(model.weight.detach())
        assert all(torch.equal(w, weights[0]) for w in weights)
        assert float(adam.state_dict()["state"][0]["step"]) == 4
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        ddp(torch.randn(2, 4)).sum().backward()
        with open(f"{tmp_path}/done-{{comm.rank}}", "w") as done:
            done.write(f"{{info['backend']}} {{info['size']}}")
    """))
    done = subprocess.run([default_mpiexec(), "-n", str(ranks), sys.executable, str(script)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for rank in range(ranks):
        assert (tmp_path / f"done-{rank}").read_text() == f"mpi4py {ranks}"


@pytest.mark.parametrize("runner", [["-m", "mpi4py"], []])
def test_an_unhandled_exception_after_init_process_group_ends_the_job(runner, tmp_path):
    """The group's exit-time teardown must not wait for ranks that wait for the one that failed."""
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        import mpinb.torch as mt
        from mpi4py import MPI
        mt.init_process_group(timeout=900)  # a teardown waiting on the group waits this long
        if MPI.COMM_WORLD.rank == 1:
            raise ValueError("bad batch on rank 1")
        dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1
    """))
    try:
        done = subprocess.run([default_mpiexec(), "-n", "2", sys.executable, *runner, str(script)],
                              capture_output=True, text=True, timeout=150)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the job hung after rank 1 failed:\n{exc.stderr}") from None
    assert done.returncode != 0 and "ValueError: bad batch on rank 1" in done.stderr


def test_a_stop_in_torchs_own_code_leaves_grad_mode_as_the_cell_began_it():
    """A Stop can land where torch turns grad mode back on (``optimizer.step()``'s ``finally``): the rank's next
    step would fail alone. Here the KeyboardInterrupt is raised by code compiled under the name of torch's
    optimizer module, with grad mode off, as when the Stop lands there; the rank's runner runs the cells."""
    from mpinb.rank import runner

    optimizer_file = str(Path(torch.__file__).parent / "optim" / "optimizer.py")
    stopped_in_torch = ("import torch\ntorch.set_grad_enabled(False)\n"
                        f"exec(compile('raise KeyboardInterrupt', {optimizer_file!r}, 'exec'))")
    try:
        reply = runner.execute(stopped_in_torch, namespace={})
        assert reply.error["ename"] == "KeyboardInterrupt", reply.error
        assert torch.is_grad_enabled()
        reply = runner.execute("import torch\ntorch.set_grad_enabled(False)\nraise KeyboardInterrupt", namespace={})
        assert reply.error["ename"] == "KeyboardInterrupt", reply.error
        assert not torch.is_grad_enabled()  # stopped in the cell's own code: what it set is kept
    finally:
        torch.set_grad_enabled(True)


def test_backend_and_device_choice():
    assert choose_backend(None, gpus_per_rank=0, local_size=4, nccl_available=True) == ("mpi4py", False, None)
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


BROADCAST = """
import torch, mpinb.torch as mt
torch.manual_seed(rank)  # every rank starts different
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
with torch.no_grad():
    model[1].running_mean.add_(rank + 1.0)
    model[1].running_var.mul_(rank + 2.0)
    model[1].num_batches_tracked.add_(rank + 1)
before = comm.allgather({name: t.clone() for name, t in model.state_dict().items()})
CALL
sorted(name for name, t in model.state_dict().items() if torch.equal(t, before[ROOT][name]))
"""
EVERYTHING = ["0.bias", "0.weight", "1.bias", "1.num_batches_tracked", "1.running_mean", "1.running_var", "1.weight"]
PARAMETERS = ["0.bias", "0.weight", "1.bias", "1.weight"]


@pytest.mark.parametrize("call, root, expected", [
    ("mt.broadcast_parameters(model.state_dict(), root_rank=0)", 0, EVERYTHING),  # Horovod's spelling
    ("mt.broadcast_parameters(model.state_dict(), root_rank=1)", 1, EVERYTHING),
    ("mt.broadcast_parameters(dict(reversed(model.state_dict().items())) if rank else model.state_dict())", 0,
     EVERYTHING),  # dicts go in name order: insertion order may differ between ranks
    ("mt.broadcast_parameters(model.named_parameters(), root_rank=1)", 1, PARAMETERS),
    ("mt.broadcast_parameters(model, 1)", 1, EVERYTHING),
    ("mt.broadcast_parameters(list(model.parameters()), root=1)", 1, PARAMETERS),
], ids=["state_dict", "state_dict-root_rank-1", "state_dict-other-order", "named_parameters", "module",
        "tensor-list"])
def test_broadcast_parameters_takes_state_dicts_named_pairs_modules_and_tensor_lists(call, root, expected, world_of,
                                                                                       mpi):
    world_of(2)
    same_as_root = mpi(BROADCAST.replace("CALL", call).replace("ROOT", str(root)))
    assert same_as_root == {root: EVERYTHING, 1 - root: expected}


ADAM = """
import torch, mpinb.torch as mt

def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.Adam([{"params": model[0].parameters()}, {"params": model[1].parameters(), "lr": 0.05}],
                           lr=0.01, betas=(0.8, 0.9))
    return model, opt

x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))

def step(model, opt):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()

def same_everywhere(tensors):
    everyone = comm.allgather([t.detach().clone() for t in tensors])
    return all(torch.equal(a, b) for theirs in everyone[1:] for a, b in zip(everyone[0], theirs))
"""


def test_broadcast_optimizer_state_from_a_rank_that_stepped(world_of, mpi):
    """Rank 0 resumed: it has Adam state and a scheduler's learning rate, rank 1 has an optimizer that never
    stepped. After both broadcasts, one more step on every rank gives identical weights; without the optimizer
    state (the control) it does not."""
    world_of(2)
    result = mpi(ADAM + """
synced, control = make(), make()
for model, opt in (synced, control):
    if rank == 0:
        for _ in range(3):
            step(model, opt)
        opt.param_groups[1]["lr"] = 0.02
    mt.broadcast_parameters(model.state_dict(), root_rank=0)
mt.broadcast_optimizer_state(synced[1], root_rank=0)
state = synced[1].state_dict()
seen = {"steps": [float(s["step"]) for s in state["state"].values()],
        "lr": [group["lr"] for group in state["param_groups"]], "betas": state["param_groups"][0]["betas"],
        "same state": same_everywhere([t for s in state["state"].values() for t in s.values()])}
for model, opt in (synced, control):
    step(model, opt)
seen["same weights"] = same_everywhere(synced[0].parameters())
seen["control same weights"] = same_everywhere(control[0].parameters())
seen
""")
    for rank in (0, 1):
        assert result[rank] == {"steps": [3.0] * 4, "lr": [0.01, 0.02], "betas": (0.8, 0.9), "same state": True,
                                "same weights": True, "control same weights": False}


def test_broadcast_optimizer_state_from_a_root_that_never_stepped_clears_the_others(world_of, mpi):
    world_of(2)
    result = mpi("""
import torch, mpinb.torch as mt
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.9)
if rank == 1:
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
before = len(opt.state)
mt.broadcast_optimizer_state(opt)
(before, len(opt.state), opt.param_groups[0]["lr"])
""")
    assert result == {0: (0, 0, 0.1), 1: (2, 0, 0.1)}


@pytest.mark.parametrize("call, error", [
    ('mt.broadcast_parameters({"weight": model.weight, "epoch": 3, "name": "x"})',
     "TypeError: broadcast_parameters: params['epoch'] is an int, params['name'] is a str, not a tensor: "
     "broadcast_parameters copies root's tensors into every rank's in place, which only tensors can take. Pass "
     "the model itself"),
    ("mt.broadcast_parameters(model.state_dict() if rank == 0 else {'weight': 'oops', 'bias': model.bias})",
     "TypeError: broadcast_parameters: on rank 1: params['weight'] is a str, not a tensor"),
    ("mt.broadcast_parameters(3)",
     "TypeError: broadcast_parameters: params must be a torch.nn.Module, a dict of tensors (a state_dict), or an "
     "iterable of tensors or of (name, tensor) pairs such as model.named_parameters(), not an int"),
    ("mt.broadcast_parameters([model.weight, 'bias'])",
     "TypeError: broadcast_parameters: item 1 of params is a str, not a tensor or a (name, tensor) pair"),
    ("mt.broadcast_parameters(opt)",
     "TypeError: broadcast_parameters: params must be a torch.nn.Module, a dict of tensors (a state_dict), or an "
     "iterable of tensors or of (name, tensor) pairs such as model.named_parameters(), not an optimizer; for an "
     "optimizer's state use broadcast_optimizer_state(optimizer)"),
    ("mt.broadcast_parameters(model, 0, root_rank=1)",
     "ValueError: broadcast_parameters: root=0 and root_rank=1 disagree: give one of them (root_rank is Horovod's "
     "name for root)"),
    ("mt.broadcast_parameters(model.state_dict(), root_rank=2)",
     "ValueError: broadcast_parameters: root_rank=2 is not a rank of comm (ranks 0-1)"),
    ("mt.broadcast_parameters(model, root=rank)",
     "ValueError: broadcast_parameters: ranks disagree on the root: 0 on rank 0; 1 on rank 1"),
    ("mt.broadcast_optimizer_state(model)",
     "TypeError: broadcast_optimizer_state: optimizer must be a torch.optim.Optimizer (or an "
     "mpinb.torch.DistributedOptimizer), not a Linear; pass the optimizer itself, e.g. "
     "torch.optim.Adam(model.parameters()); for a model's weights use broadcast_parameters(model)"),
    ("mt.broadcast_optimizer_state(opt.state_dict(), root_rank=0)",
     "TypeError: broadcast_optimizer_state: optimizer must be a torch.optim.Optimizer (or an "
     "mpinb.torch.DistributedOptimizer), not a dict"),
    ("mt.broadcast_optimizer_state(opt if rank == 0 else torch.optim.SGD(model.parameters(), lr=0.1))",
     "ValueError: broadcast_optimizer_state: ranks disagree on the optimizer: 'Adam' on rank 0; 'SGD' on rank 1"),
    ("mt.broadcast_optimizer_state(torch.optim.Adam(torch.nn.Linear(2, 1 + rank).parameters()))",
     "ValueError: broadcast_optimizer_state: ranks disagree on 2 parameter(s): parameter 'param_groups[0][0]': "
     "(1, 2) float32 on rank 0; (2, 2) float32 on rank 1"),
    ("opt.param_groups[0]['schedule'] = lambda step: 1.0\nmt.broadcast_optimizer_state(opt)",
     "TypeError: broadcast_optimizer_state: rank 0's optimizer state cannot be pickled: "),
], ids=["dict-of-non-tensors", "bad-on-one-rank", "not-iterable", "not-a-tensor-item", "optimizer-as-params",
        "root-and-root_rank", "root-out-of-range", "roots-differ", "module-as-optimizer", "state_dict-as-optimizer",
        "optimizers-differ", "parameters-differ", "unpicklable-state"])
def test_bad_input_to_broadcasts_is_an_error_on_every_rank(call, error, world_of, mpi):
    world_of(2)
    mpi("import torch, mpinb.torch as mt\nmodel = torch.nn.Linear(3, 2)\nopt = torch.optim.Adam(model.parameters())")
    with pytest.raises(RankError) as raised:
        mpi(call)
    assert f"ranks 0-1: {error}" in str(raised.value)
    assert mpi("comm.allreduce(1)") == {0: 2, 1: 2}  # no rank left inside a collective
