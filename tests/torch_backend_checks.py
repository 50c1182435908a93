"""Every collective of the ``"mpi4py"`` backend against gloo's on the same inputs, and DistributedDataParallel's and
FSDP's training on both, under ``mpiexec -n N python tests/torch_backend_checks.py``.

The default group is the mpi4py backend's; a gloo group over the same ranks (``new_group(backend="gloo")``) gives
the reference. Prints ``ok NAME`` or ``FAIL NAME: why`` per check on rank 0, and exits 1 if any failed.
"""

import os
import socket
import sys
import traceback

import torch
import torch.distributed as dist
from mpi4py import MPI

import mpinb.rank.torch_backend as backend

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
torch.set_num_threads(1)
backend.register()
port = comm.bcast(socket.create_server(("127.0.0.1", 0)).getsockname()[1] if rank == 0 else None)
os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
dist.init_process_group("mpi4py")
GLOO = dist.new_group(backend="gloo")
MINE = dist.group.WORLD
R = dist.ReduceOp
failures = []


def check(name):
    def run(function):
        try:
            function()
            ok = True
        except Exception:  # noqa: BLE001 - reported, then the next check runs
            ok = False
            why = traceback.format_exc().strip().splitlines()[-1]
        everywhere = comm.allreduce(ok, op=MPI.LAND)
        if rank == 0:
            print(f"ok {name}" if everywhere else f"FAIL {name}: {why if not ok else 'on another rank'}", flush=True)
        if not everywhere:
            failures.append(name)
        return function

    return run


def values(dtype, n=5, shift=0):
    """Inputs that differ by rank and are exact in every dtype."""
    base = torch.arange(n) + 1 + rank * 2 + shift
    if dtype == torch.bool:
        return (base % (2 + rank)) == 0
    return base.to(dtype)


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    assert torch.equal(a, b), f"{a.tolist()} != gloo's {b.tolist()}"


def both(call):
    """*call(group)* on the mpi4py group and on gloo's."""
    return call(MINE), call(GLOO)


def _reduced(tensor, op, group):
    dist.all_reduce(tensor, op=op, group=group)
    return tensor


def _broadcast(tensor, root, group):
    dist.broadcast(tensor, src=root, group=group)
    return tensor


def _reduce(tensor, root, op, group):
    dist.reduce(tensor, dst=root, op=op, group=group)
    return tensor


def _all_gather(tensor, group):
    out = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(out, tensor, group=group)
    return out


def _all_gather_tensor(tensor, group):
    out = torch.empty(tensor.numel() * size, dtype=tensor.dtype)
    dist.all_gather_into_tensor(out, tensor, group=group)
    return out


def _gather(tensor, root, group):
    out = [torch.empty_like(tensor) for _ in range(size)] if rank == root else None
    dist.gather(tensor, out, dst=root, group=group)
    return out or []


def _scatter(dtype, root, group):
    out = torch.empty(4, dtype=dtype)
    parts = [values(dtype, 4, shift=10 * i) for i in range(size)] if rank == root else None
    dist.scatter(out, parts, src=root, group=group)
    return out


def _all_to_all_single(tensor, splits, group, out=None):
    out = torch.empty_like(tensor) if out is None else out
    dist.all_to_all_single(out, tensor, output_split_sizes=splits[0] if splits else None,
                           input_split_sizes=splits[1] if splits else None, group=group)
    return out


def _all_to_all(dtype, group):
    inputs = [values(dtype, 3, shift=i) for i in range(size)]
    outputs = [torch.empty(3, dtype=dtype) for _ in range(size)]
    dist.all_to_all(outputs, inputs, group=group)
    return outputs


def _reduce_scatter_tensor(tensor, group):
    out = torch.empty(tensor.numel() // size, dtype=tensor.dtype)
    dist.reduce_scatter_tensor(out, tensor, group=group)
    return out


def _reduce_scatter_list(dtype, group):
    out = torch.empty(3, dtype=dtype)
    dist.reduce_scatter(out, [values(dtype, 3, shift=i) for i in range(size)], group=group)
    return out


FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8]
OPS = {"SUM": R.SUM, "PRODUCT": R.PRODUCT, "MIN": R.MIN, "MAX": R.MAX}
BITS = {"BAND": R.BAND, "BOR": R.BOR, "BXOR": R.BXOR}

for dtype in FLOATS + INTS + [torch.bool]:
    ops = dict(OPS)
    if not dtype.is_floating_point:
        ops.update(BITS)
    for op_name, op in ops.items():
        if dtype == torch.bool and op_name not in ("SUM", "MIN", "MAX", "PRODUCT"):
            continue

        @check(f"all_reduce {op_name} {dtype}")
        def _(dtype=dtype, op=op):
            mine, gloo = both(lambda g: _reduced(values(dtype), op, g))
            same(mine, gloo)


for dtype in [torch.float32, torch.float64]:
    @check(f"all_reduce AVG {dtype} (gloo has none: the sum divided)")
    def _(dtype=dtype):
        t = values(dtype)
        dist.all_reduce(t, op=R.AVG)
        s = values(dtype)
        dist.all_reduce(s, group=GLOO)
        same(t, s / size)


@check("all_reduce of a non-contiguous tensor, a 0-d tensor, an empty one")
def _():
    for make in (lambda: values(torch.float32, 12).view(3, 4).t(), lambda: torch.tensor(rank + 1.0),
                 lambda: torch.zeros(0)):
        mine, gloo = both(lambda g: _reduced(make(), R.SUM, g))
        same(mine, gloo)


for dtype in FLOATS + [torch.int64, torch.bool]:
    @check(f"broadcast {dtype}")
    def _(dtype=dtype):
        for root in range(size):
            mine, gloo = both(lambda g: _broadcast(values(dtype), root, g))
            same(mine, gloo)

    @check(f"reduce SUM {dtype}")
    def _(dtype=dtype):
        for root in range(size):
            op = R.SUM if dtype != torch.bool else R.MAX
            mine, gloo = both(lambda g: _reduce(values(dtype), root, op, g))
            if rank == root:
                same(mine, gloo)

    @check(f"all_gather (list) {dtype}")
    def _(dtype=dtype):
        mine, gloo = both(lambda g: _all_gather(values(dtype), g))
        for a, b in zip(mine, gloo):
            same(a, b)

    @check(f"all_gather_into_tensor {dtype}")
    def _(dtype=dtype):
        mine, gloo = both(lambda g: _all_gather_tensor(values(dtype), g))
        same(mine, gloo)

    @check(f"gather {dtype}")
    def _(dtype=dtype):
        for root in range(size):
            mine, gloo = both(lambda g: _gather(values(dtype), root, g))
            for a, b in zip(mine, gloo):
                same(a, b)

    @check(f"scatter {dtype}")
    def _(dtype=dtype):
        for root in range(size):
            mine, gloo = both(lambda g: _scatter(dtype, root, g))
            same(mine, gloo)

    @check(f"all_to_all_single {dtype}")
    def _(dtype=dtype):
        mine, gloo = both(lambda g: _all_to_all_single(values(dtype, 2 * size), None, g))
        same(mine, gloo)

    @check(f"all_to_all (list) {dtype}")
    def _(dtype=dtype):
        mine, gloo = both(lambda g: _all_to_all(dtype, g))
        for a, b in zip(mine, gloo):
            same(a, b)

for dtype in FLOATS + [torch.int64]:
    @check(f"reduce_scatter_tensor SUM {dtype}")
    def _(dtype=dtype):
        mine, gloo = both(lambda g: _reduce_scatter_tensor(values(dtype, 3 * size), g))
        same(mine, gloo)

    @check(f"reduce_scatter (list) SUM {dtype}")
    def _(dtype=dtype):
        mine = _reduce_scatter_list(dtype, MINE)
        # gloo has no list reduce_scatter on CPU: the same sums by all_reduce
        parts = [values(dtype, 3, shift=i) for i in range(size)]
        for part in parts:
            dist.all_reduce(part, group=GLOO)
        same(mine, parts[rank])


@check("all_reduce of a 2-d tensor keeps its shape; a leaf that requires grad is reduced in place")
def _():
    mine, gloo = both(lambda g: _reduced(values(torch.float32, 12).view(3, 4), R.SUM, g))
    same(mine, gloo)
    leaf = values(torch.float32).requires_grad_()
    with torch.no_grad():
        dist.all_reduce(leaf)
    same(leaf.detach(), _reduced(values(torch.float32), R.SUM, GLOO))


@check("a call every rank made before, then one rank's of another size: named on every rank, nothing moved")
def _():
    for _ in range(3):  # the same call again and again, as a training step makes it
        dist.all_reduce(torch.ones(4))
    t = torch.ones(4 + (rank == size - 1))
    try:
        dist.all_reduce(t)
    except RuntimeError as error:
        assert "called different collectives" in str(error) and "4 x float32" in str(error) and \
            "5 x float32" in str(error), error
    else:
        raise AssertionError("the ranks' different sizes were not named")
    assert t.tolist() == [1.0] * t.numel(), t
    summed = torch.ones(4)
    dist.all_reduce(summed)  # the group goes on
    assert summed.tolist() == [float(size)] * 4, summed

@check("all_to_all_single with uneven splits (rows of 2 columns)")
def _():
    # rank r sends i + 1 rows to rank i; receives r + 1 rows from each
    input_splits = [i + 1 for i in range(size)]
    output_splits = [rank + 1] * size
    tensor = torch.arange(sum(input_splits) * 2, dtype=torch.float32).view(-1, 2) + 100 * rank
    mine = torch.empty(sum(output_splits), 2)
    gloo = torch.empty(sum(output_splits), 2)
    _all_to_all_single(tensor, (output_splits, input_splits), MINE, mine)
    _all_to_all_single(tensor, (output_splits, input_splits), GLOO, gloo)
    same(mine, gloo)


@check("barrier")
def _():
    dist.barrier()


@check("send and recv, isend and irecv, batch_isend_irecv (a ring)")
def _():
    right, left = (rank + 1) % size, (rank - 1) % size
    sent = values(torch.float32)
    got = torch.empty_like(sent)
    if rank % 2 == 0:
        dist.send(sent, right)
        dist.recv(got, left)
    else:
        dist.recv(got, left)
        dist.send(sent, right)
    expected = values(torch.float32) - 2 * rank + 2 * left
    same(got, expected)
    got2 = torch.empty_like(sent)
    works = [dist.isend(sent, right), dist.irecv(got2, left)]
    for work in works:
        work.wait()
    same(got2, expected)
    got3 = torch.empty_like(sent)
    ops = [dist.P2POp(dist.isend, sent, right), dist.P2POp(dist.irecv, got3, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    same(got3, expected)


@check("recv from any source returns the sender")
def _():
    if rank == 0:
        got = torch.empty(1)
        senders = sorted(dist.recv(got) for _ in range(size - 1))
        assert senders == list(range(1, size)), senders
    else:
        dist.send(torch.tensor([float(rank)]), 0)


@check("async_op: wait(), is_completed(), get_future()")
def _():
    t = values(torch.float32)
    work = dist.all_reduce(t, async_op=True)
    assert work.wait()
    assert work.is_completed()
    (result,) = work.get_future().wait()
    s = values(torch.float32)
    dist.all_reduce(s, group=GLOO)
    same(result, s)


@check("new_group: a group of some ranks, and every rank alone")
def _():
    odd = dist.new_group([r for r in range(size) if r % 2])
    alone = [dist.new_group([r]) for r in range(size)]
    if rank % 2:
        t = torch.ones(2)
        dist.all_reduce(t, group=odd)
        same(t, torch.full((2,), float(len([r for r in range(size) if r % 2]))))
        assert dist.get_rank(odd) == rank // 2
    t = torch.ones(2) * rank
    dist.all_reduce(t, group=alone[rank])
    same(t, torch.ones(2) * rank)
    assert dist.get_backend(alone[rank]) == "mpi4py"


@check("all_reduce_coalesced and the coalescing manager")
def _():
    tensors = [values(torch.float32), values(torch.float64, 3)]
    with dist._coalescing_manager(async_ops=True) as manager:
        for t in tensors:
            dist.all_reduce(t)
    manager.wait()
    for t, dtype, n in zip(tensors, [torch.float32, torch.float64], [5, 3]):
        s = values(dtype, n)
        dist.all_reduce(s, group=GLOO)
        same(t, s)


# --- training: DDP and FSDP on both groups to the same weights ---

def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4))


def batches(steps=6, n=8):
    generator = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(n, 8, generator=generator), torch.randn(n, 4, generator=generator)) for _ in range(steps)]


def ddp_train(group, *, hook=None, steps=6, accumulate=1, extra_batches=0, **options):
    net = torch.nn.parallel.DistributedDataParallel(model(), process_group=group, **options)
    if hook is not None:
        net.register_comm_hook(group, hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    data = batches(steps + extra_batches * rank)
    with net.join() if extra_batches else _nothing():
        for i, (x, y) in enumerate(data):
            sync = (i + 1) % accumulate == 0
            with _nothing() if sync else net.no_sync():
                loss = torch.nn.functional.mse_loss(net(x), y)
                loss.backward()
            if sync:
                opt.step()
                opt.zero_grad()
    return [p.detach().clone() for p in net.parameters()]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def close(a, b, tolerance=1e-6):
    for x, y in zip(a, b):
        assert torch.allclose(x, y, atol=tolerance, rtol=0), float((x - y).abs().max())


DDP_CASES = {
    "plain": {},
    "no_sync (gradient accumulation over 2 steps)": {"accumulate": 2},
    "find_unused_parameters": {"find_unused_parameters": True},
    "static_graph": {"static_graph": True},
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
    "small buckets (bucket_cap_mb)": {"bucket_cap_mb": 0.0005},
    "join() with uneven inputs": {"extra_batches": 2},
}
for case, options in DDP_CASES.items():
    @check(f"DDP {case}: the weights gloo gives")
    def _(options=options):
        close(ddp_train(MINE, **options), ddp_train(GLOO, **options))


@check("DDP fp16 compression hook: the weights gloo gives")
def _():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    close(ddp_train(MINE, hook=default_hooks.fp16_compress_hook),
          ddp_train(GLOO, hook=default_hooks.fp16_compress_hook), tolerance=1e-4)


def fsdp_train(group):
    from torch.distributed.fsdp import FullyShardedDataParallel

    net = FullyShardedDataParallel(model(), process_group=group, device_id=torch.device("cpu"),
                                   use_orig_params=True)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for x, y in batches():
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        opt.zero_grad()
    with FullyShardedDataParallel.summon_full_params(net):
        return [p.detach().clone() for p in net.parameters()]


@check("FSDP (FULL_SHARD, CPU): the weights gloo gives")
def _():
    close(fsdp_train(MINE), fsdp_train(GLOO), tolerance=1e-5)


@check("destroy_process_group(group) keeps the group's communicator for a rank that stands in; the next group frees it")
def _():
    group = dist.new_group(list(range(size)))
    made = group.comm
    dist.destroy_process_group(group)
    assert made != MPI.COMM_NULL, "freed while a rank may still stand in on it"
    again = dist.new_group(list(range(size)))
    assert made == MPI.COMM_NULL, made
    summed = torch.ones(3)
    dist.all_reduce(summed, group=again)
    assert summed.tolist() == [float(size)] * 3, summed


dist.barrier()
default_comm = MINE.comm
dist.destroy_process_group()
dist.init_process_group("mpi4py")


@check("destroy_process_group() and init_process_group() again: the old default group's communicator is freed")
def _():
    assert default_comm == MPI.COMM_NULL, default_comm
    summed = torch.ones(2)
    dist.all_reduce(summed)
    assert summed.tolist() == [float(size)] * 2, summed


dist.destroy_process_group()
if rank == 0:
    print(f"{len(failures)} failed", flush=True)
sys.exit(1 if failures else 0)
