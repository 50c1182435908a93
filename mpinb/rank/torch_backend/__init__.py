"""A ``torch.distributed`` backend over mpi4py: DistributedDataParallel, FSDP and every ``dist.*`` call go through
MPI on the world's communicators (and, under ``%%mpi``, through mpinb's ledger of collectives) instead of gloo.

Each call is in the rank's ledger of collectives as torch's call (``all_reduce(4 x float32)`` on ``torch:default``,
a DDP step as ``DDP all_reduce``), as for gloo, and in a traced cell each MPI call, DDP's gradient buckets
included, is a span of its own. Before its data moves, every collective checks with one small ``Allgather`` that
every rank makes the same call with the same size and dtype: a mismatch raises on every rank, naming each rank's
call, where MPI would end the job ("message truncated") or wait for ever.

Registered as ``"mpi4py"`` (torch keeps ``"mpi"`` for its own from-source backend) when ``torch.distributed`` is
imported on a rank, or by :func:`register`::

    import torch.distributed as dist
    dist.init_process_group("mpi4py")            # env:// as every %%mpi world has it; data goes through MPI
    model = torch.nn.parallel.DistributedDataParallel(model)

The group is in ``group.py``, the check that the ranks make the same call in ``agreement.py``, its calls as
spans on the timeline in ``spans.py`` with Stop held until their MPI calls are done by ``interrupts.py``, a flat
tensor's parts per rank in ``splits.py``, tensors as MPI buffers and torch's reductions as MPI ops in
``buffers.py``, what its calls return in ``work.py``.
"""

NAME = "mpi4py"
_base = []  # the communicator the default group is made over, when not MPI.COMM_WORLD (use_communicator)


def register():
    """Make ``"mpi4py"`` a backend of ``torch.distributed`` (idempotent)."""
    import torch.distributed as dist

    if not dist.is_available() or NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])


def use_communicator(comm):
    """Make the next default group over *comm* instead of ``MPI.COMM_WORLD`` (``mpinb.torch.init_process_group``
    with ``comm=``)."""
    from mpi4py import MPI

    _base[:] = [comm] if comm is not None and comm != MPI.COMM_WORLD else []


def _create(options, backend_options=None):
    """torch's factory call: a group over the ranks *options* name (its ``global_ranks_in_group``, empty for the
    default group). The default group duplicates its communicator; a sub-group (``new_group``) is made from the
    default group's by ``Create_group``, collective over its members only, as torch calls this on members only."""
    from mpi4py import MPI

    from .group import MPIProcessGroup, free_retired

    global _default
    free_retired()
    ranks = list(options.global_ranks_in_group or [])
    rank, size = options.group_rank, options.group_size
    if not ranks or _default is None:
        base = _base[0] if _base else _world()
        if (base.Get_rank(), base.Get_size()) != (rank, size):
            raise RuntimeError(f"backend {NAME!r} takes its ranks from MPI: this process is rank {base.Get_rank()} "
                               f"of {base.Get_size()} there, but torch was given rank {rank} of {size} (RANK and "
                               "WORLD_SIZE must be the MPI rank and size; every %%mpi world has them so)")
        comm = _untraced(base).Dup()
        _default = comm
        name = "default"
    else:
        group = _default.Get_group()
        members = group.Incl(ranks)
        comm = _default.Create_group(members, tag=_tag(ranks))
        group.Free()
        members.Free()
        name = options.group_id or ",".join(map(str, ranks))
    if comm.Get_rank() != rank:
        raise RuntimeError(f"backend {NAME!r}: MPI made this process rank {comm.Get_rank()} of group {name}, "
                           f"torch expected rank {rank}")
    # an MPI error (a message truncated: ranks that passed different sizes) raises in the rank that saw it, as
    # mpi4py's communicators do, instead of aborting the job
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    return MPIProcessGroup(comm, name)


_default = None  # the default group's communicator, which sub-groups are made from


def _tag(ranks):
    """A tag for ``Create_group``, the same on every member (groups made at once by different ranks differ)."""
    return sum((index + 1) * rank for index, rank in enumerate(ranks)) % 32749


def _untraced(comm):
    """*comm* as mpi4py's own class, whose calls are not noted again (a communicator made from a traced one is
    traced too)."""
    from ..tracing.comms import registry

    if registry.installed is None:
        return comm
    kind = registry.installed["names"]["Intracomm"]
    return comm if type(comm) is kind else kind(comm)


def _world():
    """``MPI.COMM_WORLD`` as mpi4py made it: where mpinb traces MPI calls its traced copy stands in that name, and
    a group's calls are noted in the ledger as torch's (``rank/tracing/trace_torch.py``, ``rank/tracing/trace_ddp.py``) rather than
    a second time as MPI's."""
    from mpi4py import MPI

    from ..tracing.comms import registry

    return registry.installed["original"][0] if registry.installed is not None else MPI.COMM_WORLD
