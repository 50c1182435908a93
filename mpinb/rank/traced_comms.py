"""Which communicators are traced: what ``rank/intercept.py`` installed, and each communicator's name and world-rank
members, under which ``tracing.state`` keeps its ledger."""

import weakref

from . import tracing

_state = tracing.state
# while installed: {"classes": {mpi4py base: traced subclass}, "request", "MPI", "ops": {handle: op name},
# "in_place", "any", "original": mpi4py's own (COMM_WORLD, COMM_SELF, Request)}
installed = None


def _adopt(comm, name, members):
    comm._mpinb = _state.ledger(name, members)
    comm._mpinb_counts = {}  # communicators made from it so far (traced_calls._maker)
    _state.comms[name] = weakref.ref(comm)
    return comm


def _members(comm):
    """World ranks of *comm*'s members, in its rank order (its remote group too, for an intercommunicator)."""
    MPI = installed["MPI"]
    world = MPI.Comm.Get_group(installed["original"][0])
    groups = [comm.Get_group()]
    if comm.Is_inter():
        groups.append(comm.Get_remote_group())
    members = []
    for group in groups:
        members += MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world)
        group.Free()
    world.Free()
    return tuple(members)


def _info(comm):
    info = getattr(comm, "_mpinb", None)
    if info is None:  # made by mpi4py without us (e.g. unpickled): name it by its handle
        info = _adopt(comm, f"comm#{comm.py2f()}", _members(comm))._mpinb
    return info
