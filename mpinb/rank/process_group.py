"""``torch.distributed`` from an MPI world: rank, size, rendezvous address and device all come from MPI, and every
rank has the environment ``torchrun`` gives a worker."""

import atexit
import datetime
import os
import socket
import uuid

from . import group_record, master_port

LOOPBACK = "127.0.0.1"

# what torch's elastic agent puts in a worker's environment (torch/distributed/elastic/agent/server/
# local_elastic_agent.py), in its order; OMP_NUM_THREADS is the world's own (rank/world.py), CUDA_VISIBLE_DEVICES
# is inherited as torchrun leaves it, and TORCHELASTIC_ERROR_FILE is left out: no agent reads what it names
TORCHRUN_VARIABLES = ("RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
                      "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                      "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "LOCAL_RANK")


def torchrun_environment(*, comm=None):
    """Give this rank of *comm* (default ``MPI.COMM_WORLD``) the environment ``torchrun`` gives a worker; collective.

    Every ``%%mpi`` world has it from its start, so ``dist.init_process_group("gloo")`` (``env://``) and the
    frameworks that read it (Hugging Face ``Accelerator(cpu=True)``) work as under ``torchrun``;
    under plain ``mpiexec python train.py``, call this first.

    - ``RANK``, ``WORLD_SIZE`` and, as ``torchrun`` has them for one role, ``ROLE_RANK``, ``ROLE_WORLD_SIZE``,
      ``ROLE_NAME=default``: from MPI. ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``: this rank's place among the ranks
      on its host (an MPI shared-memory split; hosts may hold different numbers of ranks). ``GROUP_RANK``,
      ``GROUP_WORLD_SIZE``: the host's index among the hosts, in the order of their lowest rank, and how many.
    - ``MASTER_ADDR``: ``127.0.0.1`` when every rank shares one host, else rank 0's address as the others reach
      it. ``MASTER_PORT``: a port that was free on rank 0's host; rank 0 listens on it from then on (no other
      socket of the host can take it) and the first store served there takes that socket over (``master_port.py``).
      Both are rank 0's own when its environment already has them (each kept on its own), the same on every rank
      either way.
    - ``TORCHELASTIC_RUN_ID``: new for every call (so for every world); ``TORCHELASTIC_RESTART_COUNT`` and
      ``TORCHELASTIC_MAX_RESTARTS`` ``0``: each world is a first start to torch; ``TORCHELASTIC_USE_AGENT_STORE``
      ``False``: rank 0 hosts the store, as ``env://`` does without an agent.
    - ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` (``1``, as ``torchrun`` sets it) and, on one host,
      ``GLOO_SOCKET_IFNAME`` (loopback: gloo otherwise looks for the address of the host name, which may not
      route) are kept when already set. Every other variable above is set whatever was there: it describes this
      world, and one inherited from the notebook's environment would be wrong on every rank but one.

    Returns the variables above as set, ``{name: value}``. Raises ``RuntimeError`` on every rank when rank 0
    cannot choose an address and port.

    Example (a script under plain ``mpiexec``)::

        import mpinb.torch as mt, torch.distributed as dist
        mt.torchrun_environment()
        dist.init_process_group("gloo")
    """
    from mpi4py import MPI

    if comm is None:
        comm = MPI.COMM_WORLD
    local_rank, local_size, leader, hosts, leaders = _places(comm)
    one_host = len(set(hosts)) == 1 and len(leaders) == 1
    chosen = None
    if comm.rank == 0:
        try:
            chosen = _master(hosts, one_host)
        except Exception as exc:  # noqa: BLE001 - said on every rank, so none waits in the bcast
            chosen = f"rank 0 could not choose MASTER_ADDR and MASTER_PORT: {type(exc).__name__}: {exc}"
    chosen = comm.bcast(chosen, root=0)
    if isinstance(chosen, str):
        raise RuntimeError(chosen)
    address, port, run_id = chosen
    os.environ.update({
        "RANK": str(comm.rank), "GROUP_RANK": str(leaders.index(leader)), "ROLE_RANK": str(comm.rank),
        "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(local_size), "WORLD_SIZE": str(comm.size),
        "GROUP_WORLD_SIZE": str(len(leaders)), "ROLE_WORLD_SIZE": str(comm.size), "MASTER_ADDR": address,
        "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "False", "LOCAL_RANK": str(local_rank),
    })
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if one_host:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", _loopback_interface())
    return {name: os.environ[name] for name in TORCHRUN_VARIABLES}


def _places(comm):
    """This rank's place on its host and the hosts': ``(local rank, ranks on this host, this host's lowest rank,
    every rank's host name, the hosts' lowest ranks in order)``; collective."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank, local_size = local.rank, local.size
    leader = local.bcast(comm.rank, root=0)  # a host is named by its lowest rank
    local.Free()
    places = comm.allgather((socket.gethostname(), leader))
    return local_rank, local_size, leader, [host for host, _ in places], sorted({lead for _, lead in places})


def _master(hosts, one_host):
    """Rank 0's ``(MASTER_ADDR, MASTER_PORT, run id)``: those of its environment where it has them, else its
    address (loopback on one host) and a free port it holds."""
    address = os.environ.get("MASTER_ADDR") or (LOOPBACK if one_host else _reachable_address(hosts))
    port = os.environ.get("MASTER_PORT")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"MASTER_PORT={port!r} in the environment is not a port: unset it (a free one is chosen) "
                         "or give a number from 1 to 65535")
    if not port:  # on loopback when the ranks meet there, so the port is not open beyond this host
        port = master_port.hold(LOOPBACK if address == LOOPBACK else "")
    return address, int(port), f"mpinb-{uuid.uuid4().hex}"


def _reachable_address(hosts):
    """This host's address as the other *hosts* reach it: the address of its name, unless that is loopback (as
    Debian's ``127.0.1.1`` is), then the one it sends from towards another host."""
    here = socket.gethostname()
    try:
        address = socket.gethostbyname(here)
    except OSError:
        address = None
    if address and not address.startswith("127."):
        return address
    for other in dict.fromkeys(hosts):
        if other == here:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((other, 9))  # UDP: nothing is sent, the route is looked up
                return probe.getsockname()[0]
        except OSError:
            continue
    return address or here


MPI4PY = "mpi4py"  # mpinb's backend over mpi4py (rank/torch_backend/)


def choose_backend(requested, *, gpus_per_rank, local_size, nccl_available):
    """The backend and whether ranks bind to a GPU: ``(backend, use_cuda, note)``.

    *gpus_per_rank* is the fewest GPUs any rank sees. Without a GPU, ``None`` is mpinb's backend over mpi4py
    (``"mpi4py"``); ``"gloo"`` asks for gloo. nccl needs a GPU of its own per rank on a host (it refuses two ranks
    on one device), so ranks that would share one use gloo, with their tensors on the GPU.
    """
    if requested not in (None, "gloo", "nccl", "mpi", MPI4PY):
        raise ValueError(f"backend must be 'mpi4py', 'gloo', 'nccl', 'mpi' or None (choose for me), not "
                         f"{requested!r}")
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
        return MPI4PY, False, None
    return requested, gpus_per_rank > 0, None


def init_process_group(backend=None, *, comm=None, timeout=120.0):
    """Initialise ``torch.distributed`` on every rank of *comm* (default ``MPI.COMM_WORLD``); collective.

    Rank and world size come from MPI. Where the ranks meet: when the environment describes *comm* on every rank
    (``RANK`` and ``WORLD_SIZE`` are its rank and size, and every rank has the same ``MASTER_ADDR`` and
    ``MASTER_PORT``: every ``%%mpi`` world has them from its start, a script has them after
    :func:`torchrun_environment`), at ``MASTER_ADDR:MASTER_PORT`` as ``env://`` meets, so a group this makes
    and one that ``dist.init_process_group()`` or a framework makes in the same world meet at the same store,
    and either can follow the other once it is destroyed. Otherwise (plain ``mpiexec``, a sub-communicator)
    rank 0 picks a free port (on loopback when every rank shares its host), holds it as ``MASTER_PORT`` is held, and
    broadcasts it.
    *backend* ``None`` picks nccl when each rank has a GPU of its own, gloo when ranks share GPUs, and on CPUs
    ``"mpi4py"``, mpinb's backend over MPI (``rank/torch_backend/``: every call through mpi4py, a mismatch named on
    every rank, the world kept); ``backend="gloo"`` gives gloo on CPUs as before; with a GPU,
    each rank is bound to ``cuda:local_rank`` (local rank from an MPI shared-memory split, wrapping when ranks
    outnumber GPUs).
    Calling it again returns the existing group's description (a group made by ``dist.init_process_group`` is
    described, not changed). The group is destroyed when the rank's process exits.

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
        return group_record.described() or _existing_group()
    from . import torch_backend

    torch_backend.register()
    local_rank, local_size = _local_rank_and_size(comm)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    chosen, use_cuda, note = _agreed_backend(comm, backend, gpus=gpus, local_size=local_size)
    device = None
    if use_cuda:
        device = torch.device("cuda", local_rank % gpus)
        torch.cuda.set_device(device)
    torch_backend.use_communicator(comm if chosen == MPI4PY else None)
    dist.init_process_group(chosen, init_method=_meeting_point(comm), rank=comm.rank, world_size=comm.size,
                            timeout=datetime.timedelta(seconds=timeout),
                            **({"device_id": device} if chosen == "nccl" else {}))
    group_record.remember(backend=chosen, rank=comm.rank, size=comm.size, local_rank=local_rank,
                          device=str(device) if device is not None else "cpu", note=note)
    atexit.register(_destroy_at_exit)
    if chosen == MPI4PY:
        _abort_on_unhandled_exception(comm)
    return group_record.described()


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


def _meeting_point(comm):
    """The ``init_method`` where the ranks of *comm* meet to start ``torch.distributed``: ``env://`` when the
    environment describes *comm* on every rank (see :func:`init_process_group`), else ``tcp://host:port``, rank 0's
    choice. On one host gloo is kept on loopback either way (``GLOO_SOCKET_IFNAME``, unless set): it otherwise
    looks for the address of the host name, and waits forever where that is not routable."""
    meeting = (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"))
    mine = (os.environ.get("RANK"), os.environ.get("WORLD_SIZE")) == (str(comm.rank), str(comm.size))
    views = comm.allgather((all(meeting) and mine, meeting, socket.gethostname()))
    hosts = [host for _, _, host in views]
    one_host = len(set(hosts)) == 1
    if one_host:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", _loopback_interface())
    if all(described for described, _, _ in views) and len({where for _, where, _ in views}) == 1:
        return "env://"
    address = None
    if comm.rank == 0:
        host = LOOPBACK if one_host else _reachable_address(hosts)
        address = (host, master_port.hold(host if one_host else ""))
    host, port = comm.bcast(address, root=0)
    return f"tcp://{f'[{host}]' if ':' in host else host}:{port}"


def _existing_group():
    """The description :func:`init_process_group` returns, of a default group made by ``dist.init_process_group``."""
    import torch
    import torch.distributed as dist

    backend = dist.get_backend()
    device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
    return {"backend": backend, "rank": dist.get_rank(), "size": dist.get_world_size(),
            "local_rank": int(os.environ.get("LOCAL_RANK", "0")), "device": device,
            "note": "the group was made by dist.init_process_group, not by mpinb: described, not changed"}


def _destroy_at_exit():
    """Tear the group down as the process exits, unless it exits with an unhandled exception: then the other
    ranks may be waiting for this one inside a collective, a barrier here would wait for them forever, and the
    job must end at once (``python -m mpi4py`` aborts it after the exit handlers, plain mpiexec when this rank
    exits non-zero)."""
    import sys

    if getattr(sys, "last_value", None) is not None or getattr(sys, "last_exc", None) is not None:
        return
    destroy_process_group()


def _abort_on_unhandled_exception(comm):
    """In a script (not under IPython, where an exception ends a cell, not the rank), end the MPI job when an
    exception ends this rank, once its traceback is printed, as ``python -m mpi4py`` does: the other ranks may wait
    for it inside an MPI call of the mpi4py backend, which nothing else lets out (gloo's see its connection close;
    MPI's wait, and this rank's ``MPI_Finalize`` at exit waits for them)."""
    import sys

    shell = sys.modules.get("IPython")
    if (shell is not None and shell.get_ipython() is not None) or getattr(sys.excepthook, "aborts_mpi", False):
        return
    previous = sys.excepthook

    def abort(kind, value, traceback):
        import time

        previous(kind, value, traceback)
        sys.stdout.flush()
        sys.stderr.flush()
        # mpiexec's proxy ends the job on MPI_Abort without reading what is left in this rank's pipes: the
        # traceback just written was at times lost; a moment lets it be forwarded first
        time.sleep(0.5)
        comm.Abort(1)

    abort.aborts_mpi = True
    sys.excepthook = abort


def destroy_process_group():
    """Tear the group down (harmless when there is none)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        import gc

        dist.barrier()  # no rank tears down while another still talks to it
        gc.collect()  # DistributedDataParallel's reducer holds the group: let it go first
        dist.destroy_process_group()
    group_record.forget()


def _loopback_interface():
    """The name of the loopback interface (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        for _, name in socket.if_nameindex():
            if name.startswith("lo"):
                return name
    except OSError:
        pass
    return "lo"
