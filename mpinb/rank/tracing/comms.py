"""Which communicators are traced: what ``rank/tracing/intercept.py`` installed, and each communicator's name and
world-rank members, under which ``ledger.state`` keeps its ledger."""

import weakref

from . import ledger

_state = ledger.state


class Registry:
    """What :func:`~mpinb.rank.tracing.intercept.install` put in place and the traced communicators known so far;
    one instance, :data:`registry`, so that installing and uninstalling change one object that every module sees."""

    def __init__(self):
        # while installed: {"classes": {mpi4py base: traced subclass}, "request", "MPI", "ops": {handle: op name},
        # "in_place", "any", "original": mpi4py's own (COMM_WORLD, COMM_SELF, Request)}
        self.installed = None
        self.live = {}  # handle (py2f) -> weak reference to the named communicator that holds it
        self.loose_counts = {}  # ledger name -> made_counts of mpi4py's own objects that have no named copy


registry = Registry()


def adopt(comm, name, members):
    """Name *comm* and give it the ledger of that name (*members*: its world ranks)."""
    comm._mpinb = _state.ledger(name, members)
    comm._mpinb_counts = {}  # communicators made from it so far (calls.maker)
    _state.comms[name] = weakref.ref(comm)
    registry.live[comm.py2f()] = weakref.ref(comm)
    return comm


def world_members(comm):
    """World ranks of *comm*'s members, in its rank order (its remote group too, for an intercommunicator)."""
    MPI = registry.installed["MPI"]
    world = MPI.Comm.Get_group(registry.installed["original"][0])
    groups = [comm.Get_group()]
    if comm.Is_inter():
        groups.append(comm.Get_remote_group())
    members = []
    for group in groups:
        members += MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world)
        group.Free()
    world.Free()
    return tuple(members)


def ledger_of(comm):
    """*comm*'s ledger: its own, a named copy's, or one named by its handle."""
    info = getattr(comm, "_mpinb", None)
    if info is None:  # a copy (MPI.Comm.f2py, MPI.Intracomm(comm), unpickled) or made by mpi4py without us
        handle, members = comm.py2f(), world_members(comm)
        reference = registry.live.get(handle)
        named = reference() if reference is not None else None
        same = named is not None and named == comm and named._mpinb.members == members
        try:
            if same:  # a copy: its ledger
                info = comm._mpinb = named._mpinb
                comm._mpinb_counts = named._mpinb_counts
            else:  # named by its handle
                info = adopt(comm, f"comm#{handle}", members)._mpinb
        except AttributeError:  # mpi4py's own object (it takes no attributes) in a traced class's method
            info = named._mpinb if same else _state.ledger(f"comm#{handle}", members)
    return info


def made_counts(comm):
    """How many communicators have been made from *comm* so far, by kind (``calls.maker``)."""
    counts = getattr(comm, "_mpinb_counts", None)
    if counts is None:
        try:
            counts = comm._mpinb_counts = {}
        except AttributeError:  # mpi4py's own object: kept with its named copy's, or by its ledger's name
            info = ledger_of(comm)
            reference = registry.live.get(comm.py2f())
            named = reference() if reference is not None else None
            counts = named._mpinb_counts if named is not None and getattr(named, "_mpinb", None) is info else \
                registry.loose_counts.setdefault(info.name, {})
    return counts
