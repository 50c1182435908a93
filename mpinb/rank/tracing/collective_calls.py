"""The traced collectives: each method wraps one of mpi4py's, notes the call in the communicator's ledger and in
``ledger.state`` while the main thread waits in it (what a roll call and the mirror file read), and records a span
while a cell is traced. mpinb's own checks mark their collectives here (:func:`own_check`).

A training loop calls the same collective on the same buffers again and again: each method keeps the last call's
signature and mirror fields (and a buffer collective its span detail; the pickle-based ones share the last detail,
which depends only on the object's type and the op), and the next call that matches uses them as they are. The call a
training step makes most, ``Allreduce(send, receive, op)`` of two numpy arrays, has its own method
(:func:`reduction`), which finds out nothing but the arrays' size and type.
"""

import contextlib

from ...wire.mirror import LEFT, MIRROR, RAISED
from .. import faults
from . import comms, ledger
from .arguments import (
    ARRAYS,
    DTYPE_NAMES,
    KEYWORDS,
    ROOTED,
    SAME_SIZE_IN_PLACE,
    VECTOR,
    argument,
    collective_arguments,
    describe,
    dtype_name,
    object_bytes,
    span_detail,
)
from .calls import named_like, record_span, traced_request
from .comms import ledger_of

_state = ledger.state
_now = ledger.now_ns
_registry = comms.registry
_arrays, _dtype_names, _mirrored = ARRAYS, DTYPE_NAMES, ledger.mirrored
_record = MIRROR.pack_into
_no_bytes = {int, float, type(None)}  # objects whose object_bytes are 0, told without calling it
_checking = None  # while mpinb's own check runs on the main thread: the call it checks for (own_check)
_REDUCTION_SPEC = (0, 1, None, 2)  # Allreduce(send, receive, op), Scan, Exscan, Reduce_scatter_block


def buffer_collective(base, name, spec_name, spec, in_place):
    """mpi4py's buffer collective *name* (*spec_name*, or its nonblocking ``I`` form), each call in the ledger
    (*in_place*: ``MPI.IN_PLACE``)."""
    noted = buffer_call(name, spec_name, spec, in_place)
    if name != spec_name:
        return named_like(nonblocking(base, name, noted), name, base)
    method = blocking(base, name, spec, noted)
    if spec == _REDUCTION_SPEC:
        method = reduction(base, name, method)
    return named_like(method, name, base)


def buffer_call(name, spec_name, spec, in_place):
    """What a call of buffer collective *name* is noted as: a function of (communicator, args, kwargs) giving
    (ledger, seq, signature, mirror fields, root, bytes sent and received, span detail, the buffer a planted fault
    acts on), the ledger's count advanced. It keeps the last call's signature, fields and detail for the next call
    on the same buffers."""
    send_at, recv_at, root_at, op_at = spec
    rooted, vector, broadcast = spec_name in ROOTED, spec_name in VECTOR, name in ("Bcast", "Ibcast")
    layout = (in_place, spec_name.startswith("Scatter"), recv_at != send_at, spec_name in SAME_SIZE_IN_PLACE)
    # the last call's (ledger, root, count, dtype, signature, mirror fields, op, span detail), replaced whole, so
    # that another thread's call reads one call's or the other's
    last = (None,) * 8

    def noted(comm, args, kwargs):
        nonlocal last
        try:
            info = comm._mpinb
        except AttributeError:
            info = ledger_of(comm)
        if kwargs:
            send, receive, root = collective_arguments(args, kwargs, spec)
        else:  # the common call, positional only: no function calls to find the arguments
            n = len(args)
            send = args[send_at] if send_at is not None and send_at < n else None
            receive = args[recv_at] if recv_at is not None and recv_at < n else None
            root = args[root_at] if root_at is not None and root_at < n else None
        spans = _state.spans
        if send is None and receive is None:  # a barrier: nothing to describe
            count = dtype = None
            sent = received = 0
        else:
            count, dtype, sent, received = buffer_sizes(send, receive, layout, spans is not None)
        if rooted and root is None:
            root = 0
        known = last
        if known[0] is info and known[1] is root and known[2] == count and known[3] is dtype:
            signature, fields = known[4], known[5]
        else:
            signature = (name, root, None if vector else count, dtype)
            fields = _mirrored(info, signature)
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
            if broadcast and root != comm.Get_rank():
                sent, received = 0, sent
        return info, seq, signature, fields, root, sent, received, detail, receive if receive is not None else send

    return noted


def buffer_sizes(send, receive, layout, spans):
    """(count, dtype, bytes sent, bytes received) of a buffer collective's *send* and *receive*, numpy's arrays
    described in place (the common buffer). *layout*: (``MPI.IN_PLACE``, whether it scatters, whether the receive
    buffer is its own argument, whether an in-place call's buffer is one rank's part); *spans*: whether spans are
    recorded, which count the bytes received."""
    in_place, scatter, own_receive, same_size = layout
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
    if receive is not None and (count is None or scatter or (spans and own_receive)):
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
    return count, dtype, sent, received


def blocking(base, name, spec, noted):
    """mpi4py's blocking buffer collective *base*, the call *noted* in the ledger, the main thread marked as
    waiting in it (and the mirror file written) until it returns, and a span recorded while a cell is traced."""
    def method(self, *args, **kwargs):
        info, seq, signature, fields, root, sent, received, detail, buffer = noted(self, args, kwargs)
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
            value = base(self, *args, **kwargs) if kwargs else base(self, *args)
            done = True
            if faults.active:
                faults.after(buffer)
            return value
        finally:
            end = _now()
            _state.current = None  # _state.leave, in place
            if mirror is not None:
                mirror[8:16] = LEFT if done else RAISED
            _state.comm_ns += end - start
            spans = _state.spans  # read once: another thread may stop the spans meanwhile
            if spans is not None:  # record_span, in place
                spans.append((name, info.name, root, sent, received, start, end, seq,
                              "collective" if _checking is None else "mpinb", detail))
                _state.recorded += 1

    return method


def reduction(base, name, method):
    """*method*, for the call a training step makes again and again: ``comm.Allreduce(send, receive, op)`` (or
    ``Scan``, ``Exscan``, ``Reduce_scatter_block``) of two numpy arrays, positional. It notes the same, with
    nothing to find out but the arrays' size and type (about 0.3 µs a call less); any other call is *method*'s."""
    last = (None,) * 7  # the last call's (ledger, count, dtype, signature, fields, op, span detail)

    def fast(self, *args, **kwargs):
        nonlocal last
        if kwargs or len(args) != 3:
            return method(self, *args, **kwargs)
        send, receive, op = args
        if type(send) not in _arrays or type(receive) not in _arrays:
            return method(self, *args)
        info = self._mpinb if hasattr(self, "_mpinb") else ledger_of(self)
        count, dtype = send.size, _dtype_names.get(send.dtype) or dtype_name(send.dtype)
        known = last
        if known[0] is not info or known[1] != count or known[2] is not dtype:
            signature = (name, None, count, dtype)
            known = last = (info, count, dtype, signature, _mirrored(info, signature), None, None)
        signature, fields = known[3], known[4]
        seq = info.count = info.count + 1
        info.recent.append((seq, signature))
        if faults.active:
            faults.before()
        start = _now()
        _state.current = (info, seq, signature, start)  # _state.enter, in place
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
            _state.current = None  # _state.leave, in place
            if mirror is not None:
                mirror[8:16] = LEFT if done else RAISED
            _state.comm_ns += end - start
            spans = _state.spans  # read once: another thread may stop the spans meanwhile
            if spans is not None:
                if known[5] is not op or known[6] is None:
                    known = last = known[:5] + (op, span_detail(count, dtype, op, _registry.installed))
                spans.append((name, info.name, None, send.nbytes, receive.nbytes, start, end, seq,
                              "collective" if _checking is None else "mpinb", known[6]))
                _state.recorded += 1

    return fast


def nonblocking(base, name, noted):
    """mpi4py's nonblocking buffer collective *base*: the call *noted* in the ledger when it starts; its request
    carries what was noted for the wait that completes it."""
    def method(self, *args, **kwargs):
        info, seq, signature, _, root, sent, received, detail, _ = noted(self, args, kwargs)
        start = _now()
        request = traced_request(_registry.installed["request"], base(self, *args, **kwargs))
        request._mpinb = (name, info, root, sent, received, seq, signature, detail)
        if _state.spans is not None:
            record_span(name, info.name, root, sent, received, start, _now(), seq, "collective", detail)
        return request

    return method


def object_collective(base, name, spec):
    """mpi4py's pickle-based collective *name*, each call in the ledger."""
    root_at, rooted = spec[2], name in ROOTED
    last = (None,) * 4  # the last call's (ledger, root, signature, mirror fields), as in buffer_call

    def method(self, *args, **kwargs):
        nonlocal last
        try:
            info = self._mpinb
        except AttributeError:
            info = ledger_of(self)
        root = None if root_at is None else argument(args, kwargs, root_at, KEYWORDS["root"])
        if rooted and root is None:
            root = 0
        known = last
        if known[0] is info and known[1] is root:
            signature, fields = known[2], known[3]
        else:
            signature = (name, root, None, None)
            last = (info, root, signature, _mirrored(info, signature))
            fields = last[3]
        seq = info.count = info.count + 1
        info.recent.append((seq, signature))
        if faults.active:
            faults.before()
        start = _now()
        _state.current = (info, seq, signature, start)  # _state.enter, in place
        mirror = _state.mirror
        if mirror is not None:
            root_field, count_field, op_field, dtype_field, comm_field = fields
            _record(mirror, 0, 0, 1, seq, root_field, count_field, start, op_field, dtype_field, comm_field)
        value, done = None, False
        try:
            value = base(self, *args, **kwargs) if kwargs else base(self, *args)
            done = True
            if faults.active:
                value = faults.after(None, value)
            return value
        finally:
            end = _now()
            _state.current = None  # _state.leave, in place
            if mirror is not None:
                mirror[8:16] = LEFT if done else RAISED
            _state.comm_ns += end - start
            spans = _state.spans  # read once: another thread may stop the spans meanwhile
            if spans is not None:
                sent, received, detail = object_span(args, kwargs, spec, value)
                spans.append((name, info.name, root, sent, received, start, end, seq,
                              "collective" if _checking is None else "mpinb", detail))
                _state.recorded += 1

    return method


_last_detail = (None, None, "")  # the last pickled call's (object's type name, op, span detail)


def object_span(args, kwargs, spec, value):
    """(bytes sent, bytes received, detail) of a span of a pickle-based collective called with *args* and
    *kwargs* that gave *value*."""
    global _last_detail
    send_at, op_at = spec[0], spec[3]
    obj = argument(args, kwargs, send_at, KEYWORDS["send"])
    op = argument(args, kwargs, op_at, KEYWORDS["op"])
    kind = type(obj).__name__
    if op is None:
        detail = kind
    elif _last_detail[1] is op and _last_detail[0] == kind:
        detail = _last_detail[2]
    else:
        detail = span_detail(None, kind, op, _registry.installed)
        _last_detail = (kind, op, detail)
    if _checking is not None:
        detail = f"mpinb's check before {_checking}"
    return (0 if type(obj) in _no_bytes else object_bytes(obj), 0 if type(value) in _no_bytes else object_bytes(value),
            detail)


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
