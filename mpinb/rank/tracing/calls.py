"""The traced methods: each wraps one of mpi4py's, notes the call in ``ledger.state`` (the ledger of
collectives, the blocking point-to-point call in progress, spans while a cell is traced) and calls it;
:func:`stuck_p2p` reads back the point-to-point call noted, for a roll call.

mpinb's own API marks its calls here too: :func:`api_call` records one span (kind ``"torch"``) around what a
function of ``mpinb.torch`` does, so a trace names the call the user made (``allreduce_gradients``), matched
across ranks like a collective, and the MPI calls inside it count as part of it; :func:`own_check` marks the
collectives of mpinb's own checks (``rank/data_parallel/agreement.py``: one small allgather before each of them)
as kind ``"mpinb"``, which the summary does not blame.
"""

import contextlib

from ...wire.kinds import PointToPoint
from ...wire.mirror import LEFT, MIRROR, RAISED
from .. import faults
from . import comms, ledger
from .arguments import (
    ARRAYS,
    DTYPE_NAMES,
    KEYWORDS,
    ROOTED,
    SAME_SIZE_IN_PLACE,
    TAGS,
    VECTOR,
    argument,
    collective_arguments,
    describe,
    dtype_name,
    object_bytes,
    peer_rank,
    peer_text,
    span_detail,
)
from .comms import adopt, ledger_of, made_counts, world_members

_state = ledger.state
_now = ledger.now_ns
_registry = comms.registry
_arrays, _dtype_names, mirrored = ARRAYS, DTYPE_NAMES, ledger.mirrored
_record, _LEFT, _RAISED = MIRROR.pack_into, LEFT, RAISED  # State.enter and leave, written in place below
_no_bytes = {int, float, type(None)}  # objects whose object_bytes are 0, told without calling it


def buffer_collective(base, name, spec_name, spec, in_place):
    """mpi4py's buffer collective *name* (*spec_name*, or its nonblocking ``I`` form), each call in the ledger
    (*in_place*: ``MPI.IN_PLACE``)."""
    send_at, recv_at, root_at, op_at = spec
    nonblocking, scatter = name != spec_name, spec_name.startswith("Scatter")
    rooted, vector, broadcast = spec_name in ROOTED, spec_name in VECTOR, name in ("Bcast", "Ibcast")
    same_size, own_receive = spec_name in SAME_SIZE_IN_PLACE, recv_at != send_at
    # the last call's (ledger, root, count, dtype, signature, mirror fields, op, span detail): a loop calls the
    # same collective on the same buffers, and then the next call's signature, mirror record and detail are these
    # (replaced whole, so that another thread's call reads one call's or the other's)
    last = (None,) * 8

    def method(self, *args, **kwargs):
        nonlocal last
        try:
            info = self._mpinb
        except AttributeError:
            info = ledger_of(self)
        if kwargs:
            send, receive, root = collective_arguments(args, kwargs, spec)
        else:  # the common call, positional only: no function calls to find the arguments
            n = len(args)
            send = args[send_at] if send_at is not None and send_at < n else None
            receive = args[recv_at] if recv_at is not None and recv_at < n else None
            root = args[root_at] if root_at is not None and root_at < n else None
        spans = _state.spans
        # describe(send), with numpy's arrays described in place (the common buffer)
        if send is in_place or send is None:
            count = dtype = None
            sent = 0
        elif type(send) in _arrays:
            count, sent = send.size, send.nbytes
            try:
                dtype = _dtype_names[send.dtype]
            except KeyError:
                dtype = dtype_name(send.dtype)
        else:
            count, dtype, sent = describe(send)
        received = 0
        if receive is not None and (count is None or scatter or (spans is not None and own_receive)):
            if type(receive) in _arrays and count is not None and not scatter:  # its bytes only
                received = receive.nbytes
            else:
                count_received, dtype_received, received = describe(receive)
                if count is None or scatter:  # a scatter's send buffer holds every part
                    count, dtype = count_received, dtype_received
            if not own_receive:
                received = 0
        if send is in_place:
            sent = received
            if not same_size:  # the receive buffer holds every rank's part
                count = None
        if rooted and root is None:
            root = 0
        known = last
        if known[0] is info and known[1] is root and known[2] == count and known[3] is dtype:
            signature, fields = known[4], known[5]
        else:
            signature = (name, root, None if vector else count, dtype)
            fields = mirrored(info, signature)
            known = last = (info, root, count, dtype, signature, fields, None, None)
        seq = info.count = info.count + 1
        info.recent.append((seq, signature))
        detail = ""
        if spans is not None:  # the op is read for the span only
            op = args[op_at] if op_at is not None and op_at < len(args) else \
                argument(args, kwargs, op_at, KEYWORDS["op"])
            if known[6] is op and known[7] is not None:
                detail = known[7]
            else:
                detail = span_detail(count, dtype, op, _registry.installed)
                last = known[:6] + (op, detail)
            if broadcast and root != self.Get_rank():
                sent, received = 0, sent
        if nonblocking:
            noted = (name, info, root, sent, received, seq, signature, detail)
            return _start_collective(base, self, args, kwargs, noted)
        if faults.active:  # %mpi inject planted one on this rank
            faults.before()
        start = _now()
        _state.current = (info, seq, signature, start)  # _state.enter, in place (the mirror's record: wire/mirror.py)
        mirror = _state.mirror
        if mirror is not None:
            root_field, count_field, op_field, dtype_field, comm_field = fields
            _record(mirror, 0, 0, 1, seq, root_field, count_field, start, op_field, dtype_field, comm_field)
        done = False
        try:
            if kwargs:
                value = base(self, *args, **kwargs)
            elif n == 3:  # Allreduce(send, receive, op): the call itself, not a tuple and a dict built for it
                value = base(self, args[0], args[1], args[2])
            elif n == 2:
                value = base(self, args[0], args[1])
            else:
                value = base(self, *args)
            done = True
            if faults.active:
                faults.after(receive if receive is not None else send)
            return value
        finally:
            end = _now()
            _state.current = None  # _state.leave, in place
            if mirror is not None:
                mirror[8:16] = _LEFT if done else _RAISED
            _state.comm_ns += end - start
            spans = _state.spans
            if spans is not None:  # record_span, in place
                spans.append((name, info.name, root, sent, received, start, end, seq,
                              "collective" if _checking is None else "mpinb", detail))
                _state.recorded += 1

    if spec != (0, 1, None, 2) or nonblocking:
        return named_like(method, name, base)

    def reduction(self, *args, **kwargs):
        """*method*, for the call a training step makes again and again: ``comm.Allreduce(send, receive, op)`` (or
        ``Scan``, ``Exscan``, ``Reduce_scatter_block``) of two numpy arrays, positional. It notes the same, with
        nothing to find out but the arrays' size and type (about 0.3 µs a call less); any other call is *method*'s."""
        nonlocal last
        if kwargs or len(args) != 3:
            return method(self, *args, **kwargs)
        send, receive, op = args
        if type(send) not in _arrays or type(receive) not in _arrays:
            return method(self, *args)
        try:
            info = self._mpinb
        except AttributeError:
            info = ledger_of(self)
        count, sent = send.size, send.nbytes
        try:
            dtype = _dtype_names[send.dtype]
        except KeyError:
            dtype = dtype_name(send.dtype)
        spans = _state.spans
        received = receive.nbytes if spans is not None else 0
        known = last
        if known[0] is info and known[1] is None and known[2] == count and known[3] is dtype:
            signature, fields = known[4], known[5]
        else:
            signature = (name, None, count, dtype)
            fields = mirrored(info, signature)
            known = last = (info, None, count, dtype, signature, fields, None, None)
        seq = info.count = info.count + 1
        info.recent.append((seq, signature))
        detail = ""
        if spans is not None:
            if known[6] is op and known[7] is not None:
                detail = known[7]
            else:
                detail = span_detail(count, dtype, op, _registry.installed)
                last = known[:6] + (op, detail)
        if faults.active:
            faults.before()
        start = _now()
        _state.current = (info, seq, signature, start)
        mirror = _state.mirror
        if mirror is not None:
            root_field, count_field, op_field, dtype_field, comm_field = fields
            _record(mirror, 0, 0, 1, seq, root_field, count_field, start, op_field, dtype_field, comm_field)
        done = False
        try:
            value = base(self, send, receive, op)
            done = True
            if faults.active:
                faults.after(receive)
            return value
        finally:
            end = _now()
            _state.current = None
            if mirror is not None:
                mirror[8:16] = _LEFT if done else _RAISED
            _state.comm_ns += end - start
            spans = _state.spans
            if spans is not None:
                spans.append((name, info.name, None, sent, received, start, end, seq,
                              "collective" if _checking is None else "mpinb", detail))
                _state.recorded += 1

    return named_like(reduction, name, base)


def _start_collective(base, comm, args, kwargs, noted):
    """Start a nonblocking collective; its request carries *noted* (name, ledger, root, bytes sent and received,
    sequence number, signature, detail) for the wait that completes it."""
    name, info, root, sent, received, seq, _, detail = noted
    start = _now()
    request = _traced_request(_installed_request(), base(comm, *args, **kwargs))
    request._mpinb = noted
    if _state.spans is not None:
        record_span(name, info.name, root, sent, received, start, _now(), seq, "collective", detail)
    return request


def object_collective(base, name, spec):
    """mpi4py's pickle-based collective *name*, each call in the ledger."""
    send_at, _, root_at, op_at = spec
    rooted = name in ROOTED
    # the last call's (ledger, root, signature, mirror fields, object's type name, op, span detail), as in
    # buffer_collective
    last = (None,) * 7

    def method(self, *args, **kwargs):
        nonlocal last
        try:
            info = self._mpinb
        except AttributeError:
            info = ledger_of(self)
        if kwargs:
            obj = argument(args, kwargs, send_at, KEYWORDS["send"])
            root = argument(args, kwargs, root_at, KEYWORDS["root"])
        else:
            n = len(args)
            obj = args[send_at] if send_at is not None and send_at < n else None
            root = args[root_at] if root_at is not None and root_at < n else None
        if rooted and root is None:
            root = 0
        known = last
        if known[0] is info and known[1] is root:
            signature, fields = known[2], known[3]
        else:
            signature = (name, root, None, None)
            fields = mirrored(info, signature)
            known = last = (info, root, signature, fields, None, None, None)
        seq = info.count = info.count + 1
        info.recent.append((seq, signature))
        if faults.active:
            faults.before()
        start = _now()
        _state.current = (info, seq, signature, start)  # _state.enter, in place (the mirror's record: wire/mirror.py)
        mirror = _state.mirror
        if mirror is not None:
            root_field, count_field, op_field, dtype_field, comm_field = fields
            _record(mirror, 0, 0, 1, seq, root_field, count_field, start, op_field, dtype_field, comm_field)
        value, done = None, False
        try:
            if kwargs:
                value = base(self, *args, **kwargs)
            elif n == 1:  # allreduce(obj): the call itself, not a tuple and a dict built for it
                value = base(self, args[0])
            else:
                value = base(self, *args)
            done = True
            if faults.active:
                value = faults.after(None, value)
            return value
        finally:
            end = _now()
            _state.current = None  # _state.leave, in place
            if mirror is not None:
                mirror[8:16] = _LEFT if done else _RAISED
            _state.comm_ns += end - start
            spans = _state.spans
            if spans is not None:
                op = argument(args, kwargs, op_at, KEYWORDS["op"]) if op_at is not None else None
                kind = type(obj).__name__
                if op is None:
                    detail = kind
                elif known[5] is op and known[4] == kind:
                    detail = known[6]
                else:
                    detail = span_detail(None, kind, op, _registry.installed)
                    last = known[:4] + (kind, op, detail)
                if _checking is not None:
                    detail = f"mpinb's check before {_checking}"
                spans.append((name, info.name, root, 0 if type(obj) in _no_bytes else object_bytes(obj),
                              0 if type(value) in _no_bytes else object_bytes(value), start, end, seq,
                              "collective" if _checking is None else "mpinb", detail))
                _state.recorded += 1

    return named_like(method, name, base)


def point_to_point(base, name, spec):
    """mpi4py's blocking point-to-point call *name*, noted while it blocks (for :func:`stuck_p2p`)."""
    send_at, recv_at, peer_at, source_at = spec
    objects = name.islower()
    direction, tag_at = TAGS[name]

    def method(self, *args, **kwargs):
        start = _now()
        if _state.note_p2p:  # read only if the rank gets stuck
            _state.p2p = (self, name, direction, args, kwargs, spec, tag_at)
        value = None
        try:
            value = base(self, *args, **kwargs)
            return value
        finally:
            end = _now()
            _state.p2p = None
            _state.comm_ns += end - start
            if _state.spans is not None:
                _p2p_span(self, name, args, kwargs, spec, objects, value, start, end)

    return named_like(method, name, base)


def _p2p_span(comm, name, args, kwargs, spec, objects, value, start, end):
    send_at, recv_at, peer_at, source_at = spec
    send = argument(args, kwargs, send_at, KEYWORDS["send"])
    receive = argument(args, kwargs, recv_at, KEYWORDS["recv"])
    names = KEYWORDS["source"] if name in ("Recv", "recv", "Probe", "probe") else KEYWORDS["peer"]
    peer = argument(args, kwargs, peer_at, names)
    if objects:
        sent, received = object_bytes(send), object_bytes(value)
    else:
        sent = describe(send)[2]
        received = describe(receive)[2]
    detail = ""
    if source_at is not None:
        source = argument(args, kwargs, source_at, KEYWORDS["source"])
        detail = f"from {peer_text(source)}"
    record_span(name, ledger_of(comm).name, peer_rank(peer), sent, received, start, end, None, "p2p", detail)


def stuck_p2p():
    """The blocking point-to-point call the main thread is in, described for the notebook
    (:class:`~mpinb.wire.kinds.PointToPoint`), or ``None``."""
    current = _state.p2p
    if current is None:
        return None
    comm, name, direction, args, kwargs, spec, tag_at = current
    send_at, recv_at, peer_at, source_at = spec
    tag = argument(args, kwargs, tag_at, ("tag", "sendtag"))
    tag = 0 if tag is None else tag
    sends = receives = None
    if direction in ("send", "both"):
        dest = argument(args, kwargs, peer_at, KEYWORDS["peer"])
        data = argument(args, kwargs, send_at, KEYWORDS["send"])
        sends = (dest, tag, None if name.islower() else describe(data)[2])
    if direction in ("recv", "both"):
        at = peer_at if direction == "recv" else source_at
        source = argument(args, kwargs, at, KEYWORDS["source"])
        receive_tag = tag if direction == "recv" else argument(args, kwargs, 5, ("recvtag",))
        data = argument(args, kwargs, recv_at, KEYWORDS["recv"]) if recv_at is not None else None
        receives = (-1 if source is None else source, -1 if receive_tag is None else receive_tag,
                    None if name.islower() or data is None else describe(data)[2])
    return PointToPoint(ledger_of(comm).name, name, sends, receives)


def nonblocking_p2p(base, name, spec):
    """mpi4py's nonblocking point-to-point call *name*: its request carries the call for the wait."""
    send_at, recv_at, peer_at = spec
    objects = name.islower()
    receiving = "ecv" in name

    def method(self, *args, **kwargs):
        start = _now()
        if kwargs:
            made = base(self, *args, **kwargs)
        elif len(args) == 3:  # Isend(buffer, dest, tag): the call itself, not a tuple and a dict built for it
            made = base(self, args[0], args[1], args[2])
        else:
            made = base(self, *args)
        request = _registry.installed["request"](made)  # _traced_request, in place
        request._mpinb_original = made
        end = _now()
        try:
            info = self._mpinb
        except AttributeError:
            info = ledger_of(self)
        if kwargs:
            peer = argument(args, kwargs, peer_at, KEYWORDS["source" if receiving else "peer"])
        else:
            peer = args[peer_at] if peer_at < len(args) else None
        if peer is not None and peer < 0:  # ANY_SOURCE, PROC_NULL
            peer = None
        sent = received = 0
        spans = _state.spans
        if spans is not None:
            if kwargs:
                send = argument(args, kwargs, send_at, KEYWORDS["send"])
                receive = argument(args, kwargs, recv_at, KEYWORDS["recv"])
            else:
                n = len(args)
                send = args[send_at] if send_at is not None and send_at < n else None
                receive = args[recv_at] if recv_at is not None and recv_at < n else None
            if objects:
                sent = object_bytes(send)
            else:  # describe(...)[2], with numpy's arrays read in place
                sent = send.nbytes if type(send) in _arrays else describe(send)[2]
                received = receive.nbytes if type(receive) in _arrays else describe(receive)[2]
            spans.append((name, info.name, peer, sent, received, start, end, None, "p2p", ""))  # record_span
            _state.recorded += 1
        request._mpinb = (name, info, peer, sent, received, None, None, "")
        return request

    return named_like(method, name, base)


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


def _traced_request(kind, request):
    """*request* as a traced one; the original is kept with it, since it holds the call's buffers alive."""
    traced = kind(request)
    traced._mpinb_original = request
    return traced


def _installed_request():
    return _registry.installed["request"]


_checking = None  # while mpinb's own check runs on the main thread: the call it checks for (own_check)


@contextlib.contextmanager
def own_check(what):
    """The collectives inside are mpinb's own check before *what* (``"allreduce_gradients"``): their spans are
    of kind ``"mpinb"`` and say so in their detail. They stay in the ledger like any other collective."""
    global _checking
    before, _checking = _checking, what
    try:
        yield
    finally:
        _checking = before


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
