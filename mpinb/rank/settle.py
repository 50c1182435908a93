"""Let a rank stuck in MPI leave: the other ranks complete what it waits for, with stand-in data.

After a cell is stopped (a rank failed, a timeout, the Stop button), a rank blocked in a collective or in a
blocking send or receive cannot answer the interrupt, since MPI does not return to Python. The notebook learns
from every rank's roll call what each one waits in, and asks the ranks that can to finish it: a rank that never
entered the collective joins it, a rank a receive waits for sends a message, a rank a send waits for receives it.
The stuck rank then returns to Python, where the interrupt ends its cell: the world, and every rank's variables,
are kept, and the collectives' numbers agree on every rank again. The values the completed call left (the
stuck rank's receive buffer, the reduction) are not meaningful.

Runs on the rank's roll-call thread (``rank/rollcall.py``), which MPI's ``THREAD_MULTIPLE`` lets call MPI while
the main thread is blocked in it; calls go through the traced communicators, so the ledgers count them.
"""

import numpy as np

from . import tracing


def settle(items):
    """Do each of *items* (from the notebook); return ``[None or "what went wrong", ...]``, one per item."""
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        return ["MPI was initialised without THREAD_MULTIPLE"] * len(items)
    outcomes = []
    for item in items:
        try:
            _do(item)
            outcomes.append(None)
        except Exception as exc:  # noqa: BLE001 - said to the notebook, which then restarts the world
            outcomes.append(f"{type(exc).__name__}: {exc}")
    return outcomes


def _do(item):
    kind, name = item[0], item[1]
    if kind == "join" and name.startswith("torch:"):  # a torch.distributed group's collective, or a DDP step
        from .tracing import trace_ddp, trace_torch

        stand_in = trace_ddp.shadow if item[2][0] == trace_ddp.OP else trace_torch.stand_in
        stand_in(name, tuple(item[2]))
        return
    comm = _comm(name)
    if kind == "join":
        _join(comm, tuple(item[2]))
    elif kind == "send":
        _, _, dest, tag, size, objects = item
        if objects or size is None:
            comm.send(None, dest=dest, tag=tag)
        else:
            comm.Send(np.zeros(size, dtype=np.uint8), dest, tag)
    elif kind == "recv":
        _, _, source, tag, size, objects = item
        if objects or size is None:
            comm.recv(source=source, tag=tag)
        else:
            comm.Recv(np.empty(size, dtype=np.uint8), source, tag)
    else:
        raise ValueError(f"unknown settling step {kind!r}")


def _comm(name):
    reference = tracing.state.comms.get(name)
    comm = reference() if reference is not None else None
    if comm is None:
        raise LookupError(f"communicator {name} is gone on this rank")
    return comm


def _join(comm, signature):
    """Enter the collective *signature* describes, with zeros of its count and type."""
    op, root, count, dtype = signature
    size, rank = comm.Get_size(), comm.Get_rank()
    base = op[1].upper() + op[2:] if op[0] == "I" and op[1].islower() else op
    if base.islower():  # pickle-based: any object will do
        call = {"barrier": lambda: comm.barrier(), "bcast": lambda: comm.bcast(None, root=root),
                "gather": lambda: comm.gather(None, root=root),
                "scatter": lambda: comm.scatter([None] * size if rank == root else None, root=root),
                "allgather": lambda: comm.allgather(None), "alltoall": lambda: comm.alltoall([None] * size),
                "reduce": lambda: comm.reduce(0, root=root), "allreduce": lambda: comm.allreduce(0),
                "scan": lambda: comm.scan(0), "exscan": lambda: comm.exscan(0)}.get(base)
        if call is None:
            raise ValueError(f"cannot stand in for {op}")
        call()
        return
    if base == "Barrier":
        _finish(getattr(comm, op)())
        return
    if count is None:
        raise ValueError(f"cannot stand in for {op}: its count differs by rank")
    kind = _dtype(dtype)

    def zeros(n):
        return np.zeros(n, dtype=kind)

    arguments = {
        "Bcast": lambda: (zeros(count), root),
        "Reduce": lambda: (zeros(count), zeros(count), _sum(), root),
        "Allreduce": lambda: (zeros(count), zeros(count)),
        "Scan": lambda: (zeros(count), zeros(count)),
        "Exscan": lambda: (zeros(count), zeros(count)),
        "Gather": lambda: (zeros(count), zeros(count * size) if rank == root else None, root),
        "Scatter": lambda: (zeros(count * size) if rank == root else None, zeros(count), root),
        "Allgather": lambda: (zeros(count), zeros(count * size)),
        "Alltoall": lambda: (zeros(count), zeros(count)),
        "Reduce_scatter_block": lambda: (zeros(count), zeros(count // size)),
    }.get(base)
    if arguments is None:
        raise ValueError(f"cannot stand in for {op}")
    _finish(getattr(comm, op)(*arguments()))


def _finish(request):
    if request is not None and hasattr(request, "Wait"):
        request.Wait()


def _sum():
    from mpi4py import MPI

    return MPI.SUM


def _dtype(name):
    try:
        return np.dtype(name)
    except TypeError:
        return {"bfloat16": np.float16}.get(name, np.uint8)
