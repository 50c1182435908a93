"""``torch.distributed`` from an MPI world: rank, size, rendezvous address and device all come from MPI."""

import atexit
import datetime
import os
import socket

LOOPBACK = "127.0.0.1"


def choose_backend(requested, *, gpus_per_rank, local_size, nccl_available):
    """The backend and whether ranks bind to a GPU: ``(backend, use_cuda, note)``.

    *gpus_per_rank* is the fewest GPUs any rank sees. nccl needs a GPU of its own per rank on a host (it
    refuses two ranks on one device), so ranks that would share one use gloo, with their tensors on the GPU.
    """
    if requested not in (None, "gloo", "nccl", "mpi"):
        raise ValueError(f"backend must be 'gloo', 'nccl', 'mpi' or None (choose for me), not {requested!r}")
    own_gpu = gpus_per_rank >= local_size and gpus_per_rank > 0
    if requested == "nccl":
        if not nccl_available or gpus_per_rank == 0:
            raise ValueError("backend='nccl' needs a CUDA GPU on every rank and a torch built with NCCL; "
                             "use backend='gloo' (or None to choose)")
        if not own_gpu:
            raise ValueError(f"backend='nccl' needs one GPU per rank, but {local_size} ranks share "
                             f"{gpus_per_rank} GPU(s) on a host (NCCL refuses duplicate GPUs); use "
                             "backend='gloo' or fewer ranks per host")
        return "nccl", True, None
    if requested is None:
        if own_gpu and nccl_available:
            return "nccl", True, None
        if gpus_per_rank > 0:
            return "gloo", True, (f"{local_size} ranks share {gpus_per_rank} GPU(s) on a host: gloo, since "
                                  "NCCL needs one GPU per rank")
        return "gloo", False, None
    return requested, gpus_per_rank > 0, None


def init_process_group(backend=None, *, comm=None, timeout=120.0):
    """Initialise ``torch.distributed`` on every rank of *comm* (default ``MPI.COMM_WORLD``); collective.

    Rank and world size come from MPI. Rank 0 picks a free port (on loopback when every rank shares its host)
    and broadcasts it. *backend* ``None`` picks nccl when each rank has a GPU of its own, else gloo; with a
    GPU, each rank is bound to ``cuda:local_rank`` (local rank from an MPI shared-memory split, wrapping when
    ranks outnumber GPUs). Calling it again returns the existing group's description. The group is destroyed
    when the rank's process exits.

    Returns ``{"backend", "rank", "size", "local_rank", "device", "note"}``.

    Example::

        %%mpi
        import mpinb.torch as mt
        info = mt.init_process_group()
        model = torch.nn.parallel.DistributedDataParallel(model)
    """
    import torch
    import torch.distributed as dist

    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    if dist.is_initialized():
        return dict(_current)
    local_rank, local_size = _local_rank_and_size(comm)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    chosen, use_cuda, note = _agreed_backend(comm, backend, gpus=gpus, local_size=local_size)
    device = None
    if use_cuda:
        device = torch.device("cuda", local_rank % gpus)
        torch.cuda.set_device(device)
    host, port = _rendezvous_address(comm)
    dist.init_process_group(chosen, init_method=f"tcp://{host}:{port}", rank=comm.rank, world_size=comm.size,
                            timeout=datetime.timedelta(seconds=timeout),
                            **({"device_id": device} if chosen == "nccl" else {}))
    _current.update(backend=chosen, rank=comm.rank, size=comm.size, local_rank=local_rank,
                    device=str(device) if device is not None else "cpu", note=note)
    atexit.register(_destroy_at_exit)
    return dict(_current)


def _local_rank_and_size(comm):
    """This rank's place among the ranks of *comm* on its host, and how many there are (an MPI shared-memory
    split)."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank, local_size = local.rank, local.size
    local.Free()
    return local_rank, local_size


def _agreed_backend(comm, requested, *, gpus, local_size):
    """:func:`choose_backend` for the fewest GPUs any rank of *comm* sees: ``(backend, use_cuda, note)``; when it
    refuses, every rank raises the same ``ValueError``, none waits for the others."""
    import torch.distributed as dist
    from mpi4py import MPI

    gpus_per_rank = comm.allreduce(gpus, op=MPI.MIN)
    try:
        chosen, use_cuda, note = choose_backend(requested, gpus_per_rank=gpus_per_rank, local_size=local_size,
                                                nccl_available=dist.is_nccl_available())
        failure = None
    except ValueError as exc:
        failure = str(exc)
    failures = comm.allgather(failure)  # every rank raises the same error, none waits for the others
    if any(failures):
        raise ValueError(next(f for f in failures if f))
    return chosen, use_cuda, note


def _rendezvous_address(comm):
    """``(host, port)`` where the ranks of *comm* meet to start ``torch.distributed``: rank 0 picks a free port, on
    loopback when every rank shares its host, and broadcasts it."""
    hosts = comm.allgather(socket.gethostname())
    one_host = len(set(hosts)) == 1
    if one_host:
        # gloo otherwise looks for the address of the host name, and waits forever where that is not routable
        os.environ.setdefault("GLOO_SOCKET_IFNAME", _loopback_interface())
    address = None
    if comm.rank == 0:
        host = LOOPBACK if one_host else socket.gethostbyname(socket.gethostname())
        address = (host, _free_port(host if one_host else ""))
    host, port = comm.bcast(address, root=0)
    return host, port


def _destroy_at_exit():
    """Tear the group down as the process exits, unless it exits with an unhandled exception: then the other
    ranks may be waiting for this one inside a collective, a barrier here would wait for them forever, and the
    job must end at once (``python -m mpi4py`` aborts it after the exit handlers, plain mpiexec when this rank
    exits non-zero)."""
    import sys

    if getattr(sys, "last_value", None) is not None or getattr(sys, "last_exc", None) is not None:
        return
    destroy_process_group()


def destroy_process_group():
    """Tear the group down (harmless when there is none)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        import gc

        dist.barrier()  # no rank tears down while another still talks to it
        gc.collect()  # DistributedDataParallel's reducer holds the group: let it go first
        dist.destroy_process_group()
    _current.clear()


_current = {}


def bound_device():
    """The device :func:`init_process_group` bound this rank to (``"cuda:1"``, ``"cpu"``), or ``None`` before."""
    return _current.get("device")


def _free_port(host):
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _loopback_interface():
    """The name of the loopback interface (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        for _, name in socket.if_nameindex():
            if name.startswith("lo"):
                return name
    except OSError:
        pass
    return "lo"
