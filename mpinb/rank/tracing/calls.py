"""What the traced methods share, and the calls that are neither collectives nor point-to-point: the methods
themselves are in ``collective_calls.py`` and ``p2p_calls.py``; here :func:`maker` traces a communicator made from
a traced one, :func:`record_span` appends a span, :func:`named_like` gives a method mpi4py's name, and a traced
request keeps the original (:func:`traced_request`).

mpinb's own API marks its calls here too: :func:`api_call` records one span (kind ``"torch"``) around what a
function of ``mpinb.torch`` does, so a trace names the call the user made (``allreduce_gradients``), matched
across ranks like a collective, and the MPI calls inside it count as part of it.
"""

import contextlib

from .. import faults
from . import comms, ledger
from .comms import adopt, ledger_of, made_counts, world_members

_state = ledger.state
_now = ledger.now_ns
_registry = comms.registry


def maker(base, name):
    """mpi4py's *name* that makes a communicator: the one made is traced, named alike on every rank."""
    def method(self, *args, **kwargs):
        made = base(self, *args, **kwargs)
        if made is None or not hasattr(made, "py2f"):
            return made
        kind = _registry.installed["classes"].get(type(made))
        if kind is not None:  # mpi4py's own class: its traced one (a subclass, pkl5's or a user's, stays itself)
            made = kind(made)
        # the communicators made next must have the same name on every rank that holds them: a call collective
        # over the parent is counted on every member, also where it gave COMM_NULL (a Split's MPI.UNDEFINED
        # colour); Create_group, collective over the group alone, is counted per group
        if name == "Create_group":
            key = ("Create_group", world_members(made)) if made != _registry.installed["MPI"].COMM_NULL else None
        else:
            key = "made"
        counts = made_counts(self)
        counts[key] = counts.get(key, 0) + 1
        if made == _registry.installed["MPI"].COMM_NULL:
            return made
        parent = self._mpinb if hasattr(self, "_mpinb") else ledger_of(self)
        try:
            return adopt(made, f"{parent.name}.{name}#{counts[key]}", world_members(made))
        except AttributeError:  # a class whose objects take no attributes: its calls are noted by handle
            return made

    return named_like(method, name, base)


def traced_request(kind, request):
    """*request* as a traced one; the original is kept with it, since it holds the call's buffers alive."""
    traced = kind(request)
    traced._mpinb_original = request
    return traced


@contextlib.contextmanager
def api_call(name, comm, detail=""):
    """One span (kind ``"torch"``) named *name* around the block, a call of mpinb's API collective over *comm*,
    while a cell is traced. Its sequence number is that of the first collective the block makes on *comm*, so the
    same call is matched on every rank, and the calls inside are nested in it (the summary matches only the
    outermost calls, and counts their time and bytes once). A fault ``%mpi inject`` planted acts on the call as
    one collective, before its span starts (so a straggler arrives late at it), not on each call inside."""
    if faults.active:
        faults.before()
    faults.nested += 1
    try:
        if _state.spans is None:
            yield
            return
        try:
            info = ledger_of(comm)
            where, seq = info.name, info.count + 1
        except Exception:  # noqa: BLE001 - not a communicator mpinb traces (its calls are not traced either)
            where, seq = "", None
        start = _now()
        try:
            yield
        finally:
            if _state.spans is not None:
                record_span(name, where, None, 0, 0, start, _now(), seq, "torch", detail)
    finally:
        faults.nested -= 1


def record_span(op, comm, peer, sent, received, start, end, seq, kind, detail):
    """Append one span to the ring (only while spans are recorded)."""
    _state.spans.append((op, comm, peer, sent, received, start, end, seq, kind, detail))
    _state.recorded += 1


def named_like(method, name, base):
    """*method* under *base*'s name and docstring, as mpi4py's own method it stands in for."""
    method.__name__ = method.__qualname__ = name
    method.__doc__ = getattr(base, "__doc__", None)
    method.__wrapped__ = base
    return method
