"""Every MPI call through mpi4py, seen: subclasses of mpi4py's communicators and requests that note each call in
``rank/tracing.py`` and then call mpi4py's own method.

mpi4py's types are immutable, so their methods cannot be replaced. Instead :func:`install` puts instances of
these subclasses where user code finds communicators: ``MPI.COMM_WORLD`` and ``MPI.COMM_SELF`` (and so the
``comm`` a notebook's ranks predefine), and every communicator made from one (``Dup``, ``Split``, ``Create``,
``Create_cart``, ...) is one too; ``MPI.Request`` becomes a subclass that still answers ``isinstance`` for every
request, so ``MPI.Request.Waitall(...)`` is seen as well. A communicator made before :func:`install`, or by a
library from a raw handle, is not seen. Python-level interception was measured against the MPI profiling
interface: see docs/traces.md.
"""

import weakref

from . import tracing

_state = tracing.state
_now = tracing.now_ns
_installed = None

# name: (kind, send buffer, receive buffer, root or peer, reduction op) — argument positions, None for absent
_BUFFER_COLLECTIVES = {
    "Barrier": (None, None, None, None), "Bcast": (0, 0, 1, None),
    "Gather": (0, 1, 2, None), "Gatherv": (0, 1, 2, None), "Scatter": (0, 1, 2, None), "Scatterv": (0, 1, 2, None),
    "Allgather": (0, 1, None, None), "Allgatherv": (0, 1, None, None), "Alltoall": (0, 1, None, None),
    "Alltoallv": (0, 1, None, None), "Alltoallw": (0, 1, None, None),
    "Reduce": (0, 1, 3, 2), "Allreduce": (0, 1, None, 2), "Reduce_scatter_block": (0, 1, None, 2),
    "Reduce_scatter": (0, 1, None, 3), "Scan": (0, 1, None, 2), "Exscan": (0, 1, None, 2),
}
_OBJECT_COLLECTIVES = {
    "barrier": (None, None, None, None), "bcast": (0, None, 1, None), "gather": (0, None, 1, None),
    "scatter": (0, None, 1, None), "allgather": (0, None, None, None), "alltoall": (0, None, None, None),
    "reduce": (0, None, 2, 1), "allreduce": (0, None, None, 1), "scan": (0, None, None, 1),
    "exscan": (0, None, None, 1),
}
_ROOTED = {"Bcast", "Gather", "Gatherv", "Scatter", "Scatterv", "Reduce", "bcast", "gather", "scatter", "reduce"}
_SAME_SIZE_IN_PLACE = {"Allreduce", "Reduce", "Scan", "Exscan", "Bcast"}
_VECTOR = {"Gatherv", "Scatterv", "Allgatherv", "Alltoallv", "Alltoallw", "Reduce_scatter"}  # counts may differ
# name: (send buffer, receive buffer, peer, second peer (a source))
_POINT_TO_POINT = {
    "Send": (0, None, 1, None), "Ssend": (0, None, 1, None), "Bsend": (0, None, 1, None),
    "Rsend": (0, None, 1, None), "Recv": (None, 0, 1, None), "Sendrecv": (0, 3, 1, 4),
    "Sendrecv_replace": (0, 0, 1, 3), "Probe": (None, None, 0, None),
    "send": (0, None, 1, None), "ssend": (0, None, 1, None), "recv": (None, None, 1, None),
    "sendrecv": (0, None, 1, 4), "probe": (None, None, 0, None),
}
_NONBLOCKING_P2P = {
    "Isend": (0, None, 1), "Issend": (0, None, 1), "Ibsend": (0, None, 1), "Irsend": (0, None, 1),
    "Irecv": (None, 0, 1), "isend": (0, None, 1), "issend": (0, None, 1), "irecv": (None, None, 1),
}
_KEYWORDS = {  # what the positions above are called, for calls that pass them by keyword
    "send": ("buf", "sendbuf", "obj", "sendobj"), "recv": ("recvbuf", "buf"), "root": ("root",),
    "peer": ("dest",), "source": ("source",), "op": ("op",),
}
_MAKERS = ("Dup", "Clone", "Split", "Split_type", "Create", "Create_group", "Create_cart", "Create_graph",
           "Create_dist_graph", "Create_dist_graph_adjacent", "Create_intercomm", "Merge", "Dup_with_info", "Idup")
_FORMATS = {"d": "float64", "f": "float32", "e": "float16", "b": "int8", "B": "uint8", "h": "int16",
            "H": "uint16", "?": "bool", "Zd": "complex128", "Zf": "complex64", "c": "char"}


def install(MPI):
    """Make ``MPI.COMM_WORLD``, ``MPI.COMM_SELF`` and ``MPI.Request`` the traced kinds (idempotent)."""
    global _installed
    if _installed is not None:
        return
    classes = {base: _traced_class(MPI, base) for base in
               (MPI.Comm, MPI.Intracomm, MPI.Intercomm, MPI.Topocomm, MPI.Cartcomm, MPI.Graphcomm,
                MPI.Distgraphcomm)}
    request = _request_class(MPI)
    _installed = {"classes": classes, "request": request, "MPI": MPI, "ops": _op_names(MPI),
                  "in_place": MPI.IN_PLACE, "any": MPI.ANY_SOURCE, "original": (MPI.COMM_WORLD, MPI.COMM_SELF,
                                                                                   MPI.Request)}
    world = classes[MPI.Intracomm](MPI.COMM_WORLD)
    _adopt(world, "COMM_WORLD", tuple(range(MPI.COMM_WORLD.size)))
    self_comm = classes[MPI.Intracomm](MPI.COMM_SELF)
    _adopt(self_comm, "COMM_SELF", (MPI.COMM_WORLD.rank,))
    MPI.COMM_WORLD, MPI.COMM_SELF, MPI.Request = world, self_comm, request


def uninstall():
    """Put mpi4py's own objects back (for measuring the untraced cost beside the traced one)."""
    global _installed
    if _installed is not None:
        MPI = _installed["MPI"]
        MPI.COMM_WORLD, MPI.COMM_SELF, MPI.Request = _installed["original"]
        _installed = None


def traced(comm, name=None):
    """*comm* (an mpi4py communicator made before :func:`install`, or by a library) as a traced one."""
    classes = _installed["classes"]
    base = next(base for base in type(comm).__mro__ if base in classes)
    copy = classes[base](comm)
    _adopt(copy, name or f"comm#{comm.py2f()}", _members(comm))
    return copy


def _adopt(comm, name, members):
    comm._mpinb = _state.ledger(name, members)
    comm._mpinb_made = 0
    _state.comms[name] = weakref.ref(comm)
    return comm


def stuck_p2p():
    """The blocking point-to-point call the main thread is in, described for the notebook, or ``None``:
    ``{"comm", "op", "sends": (dest, tag, bytes) or None, "receives": (source, tag, bytes) or None}``."""
    current = _state.p2p
    if current is None:
        return None
    comm, name, direction, args, kwargs, spec, tag_at = current
    send_at, recv_at, peer_at, source_at = spec
    tag = _argument(args, kwargs, tag_at, ("tag", "sendtag"))
    tag = 0 if tag is None else tag
    sends = receives = None
    if direction in ("send", "both"):
        dest = _argument(args, kwargs, peer_at, _KEYWORDS["peer"])
        data = _argument(args, kwargs, send_at, _KEYWORDS["send"])
        sends = (dest, tag, None if name.islower() else describe(data)[2])
    if direction in ("recv", "both"):
        at = peer_at if direction == "recv" else source_at
        source = _argument(args, kwargs, at, _KEYWORDS["source"])
        receive_tag = tag if direction == "recv" else _argument(args, kwargs, 5, ("recvtag",))
        data = _argument(args, kwargs, recv_at, _KEYWORDS["recv"]) if recv_at is not None else None
        receives = (-1 if source is None else source, -1 if receive_tag is None else receive_tag,
                    None if name.islower() or data is None else describe(data)[2])
    return {"comm": _info(comm).name, "op": name, "sends": sends, "receives": receives}


def _members(comm):
    """World ranks of *comm*'s members, in its rank order (its remote group too, for an intercommunicator)."""
    MPI = _installed["MPI"]
    world = MPI.Comm.Get_group(_installed["original"][0])
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


def _argument(args, kwargs, position, names):
    if position is None:
        return None
    if position < len(args):
        return args[position]
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return None


def describe(buffer):
    """``(count, dtype name, bytes)`` of an mpi4py buffer argument, as far as it can be told cheaply."""
    if buffer is None:
        return None, None, 0
    if type(buffer) in (list, tuple) and buffer:  # [data, MPI.DOUBLE], [data, count, MPI.DOUBLE], ...
        buffer = buffer[0]
    size = getattr(buffer, "nbytes", None)
    dtype = getattr(buffer, "dtype", None)
    if size is not None and dtype is not None:  # numpy and friends
        return getattr(buffer, "size", None), _dtype_name(dtype), int(size)
    numel = getattr(buffer, "numel", None)
    if numel is not None and dtype is not None:  # torch
        count = numel()
        return count, _dtype_name(dtype), count * buffer.element_size()
    try:
        view = memoryview(buffer)
    except TypeError:
        return None, None, 0
    itemsize = view.itemsize or 1
    name = _FORMATS.get(view.format.lstrip("@=<>!"), None)
    if name is None:
        name = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}.get(itemsize, view.format)
        if view.format.lstrip("@=<>!").isupper():
            name = "u" + name
    return view.nbytes // itemsize, name, view.nbytes


_DTYPE_NAMES = {}


def _dtype_name(dtype):
    """``float64``, ``float32``, ... (``str()`` of a numpy dtype costs microseconds: they are kept)."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
        return name
    except TypeError:  # not hashable
        return str(dtype)


def _object_bytes(obj):
    kind = type(obj)
    if kind is int or kind is float or obj is None:
        return 0
    if kind is bytes or kind is bytearray:
        return len(obj)
    size = getattr(obj, "nbytes", None)
    return int(size) if size is not None else 0


def _buffer_collective(base, name, spec_name, spec):
    send_at, recv_at, root_at, op_at = spec
    nonblocking = name != spec_name
    scatter = spec_name.startswith("Scatter")
    rooted, vector = spec_name in _ROOTED, spec_name in _VECTOR
    broadcast = name in ("Bcast", "Ibcast")
    request_class = _installed_request

    def method(self, *args, **kwargs):
        try:
            info = self._mpinb
        except AttributeError:
            info = _info(self)
        installed = _installed
        if kwargs:
            send = _argument(args, kwargs, send_at, _KEYWORDS["send"])
            receive = _argument(args, kwargs, recv_at, _KEYWORDS["recv"])
            root = _argument(args, kwargs, root_at, _KEYWORDS["root"])
            op = _argument(args, kwargs, op_at, _KEYWORDS["op"])
        else:  # the common call, positional only: no function calls to find the arguments
            n = len(args)
            send = args[send_at] if send_at is not None and send_at < n else None
            receive = args[recv_at] if recv_at is not None and recv_at < n else None
            root = args[root_at] if root_at is not None and root_at < n else None
            op = args[op_at] if op_at is not None and op_at < n else None
        in_place = send is installed["in_place"]
        if in_place:
            send = None
        count, dtype, sent = describe(send)
        received = 0
        if receive is not None and ((count is None or scatter) or (_state.spans is not None and recv_at != send_at)):
            count_received, dtype_received, received = describe(receive)
            if count is None or scatter:  # a scatter's send buffer holds every part
                count, dtype = count_received, dtype_received
            if recv_at == send_at:
                received = 0
        if in_place:
            sent = received
            if spec_name not in _SAME_SIZE_IN_PLACE:  # the receive buffer holds every rank's part
                count = None
        if rooted and root is None:
            root = 0
        signature = (name, root, None if vector else count, dtype)
        info.count += 1
        seq = info.count
        info.recent.append((seq, signature))
        detail = ""
        if _state.spans is not None:
            detail = _detail(count, dtype, op, installed)
            if broadcast and root != self.Get_rank():
                sent, received = 0, sent
        if nonblocking:
            start = _now()
            request = _traced_request(request_class(), base(self, *args, **kwargs))
            request._mpinb = (name, info, root, sent, received, seq, signature, detail)
            if _state.spans is not None:
                _span(name, info.name, root, sent, received, start, _now(), seq, "collective", detail)
            return request
        start = _now()
        _state.enter(info, seq, signature, start)
        done = False
        try:
            value = base(self, *args, **kwargs)
            done = True
            return value
        finally:
            end = _now()
            _state.leave(done)
            _state.comm_ns += end - start
            if _state.spans is not None:
                _span(name, info.name, root, sent, received, start, end, seq, "collective", detail)

    return _named(method, name, base)


def _object_collective(base, name, spec):
    send_at, _, root_at, op_at = spec
    rooted = name in _ROOTED

    def method(self, *args, **kwargs):
        try:
            info = self._mpinb
        except AttributeError:
            info = _info(self)
        if kwargs:
            obj = _argument(args, kwargs, send_at, _KEYWORDS["send"])
            root = _argument(args, kwargs, root_at, _KEYWORDS["root"])
        else:
            n = len(args)
            obj = args[send_at] if send_at is not None and send_at < n else None
            root = args[root_at] if root_at is not None and root_at < n else None
        if rooted and root is None:
            root = 0
        signature = (name, root, None, None)
        info.count += 1
        seq = info.count
        info.recent.append((seq, signature))
        start = _now()
        _state.enter(info, seq, signature, start)
        value, done = None, False
        try:
            value = base(self, *args, **kwargs)
            done = True
            return value
        finally:
            end = _now()
            _state.leave(done)
            _state.comm_ns += end - start
            if _state.spans is not None:
                op = _argument(args, kwargs, op_at, _KEYWORDS["op"]) if op_at is not None else None
                _span(name, info.name, root, _object_bytes(obj), _object_bytes(value), start, end, seq,
                      "collective", type(obj).__name__ if op is None else _detail(None, type(obj).__name__, op,
                                                                                     _installed))

    return _named(method, name, base)


# where a blocking point-to-point call's tag is, and whether it sends, receives or both: for settling a rank
# stuck in one (``rank/settle.py``)
_TAGS = {"Send": ("send", 2), "Ssend": ("send", 2), "Bsend": ("send", 2), "Rsend": ("send", 2),
         "send": ("send", 2), "ssend": ("send", 2), "Recv": ("recv", 2), "recv": ("recv", 2),
         "Probe": ("recv", 1), "probe": ("recv", 1), "Sendrecv": ("both", 2), "sendrecv": ("both", 2),
         "Sendrecv_replace": ("both", 2)}


def _point_to_point(base, name, spec):
    send_at, recv_at, peer_at, source_at = spec
    objects = name.islower()
    direction, tag_at = _TAGS[name]

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

    return _named(method, name, base)


def _p2p_span(comm, name, args, kwargs, spec, objects, value, start, end):
    send_at, recv_at, peer_at, source_at = spec
    send = _argument(args, kwargs, send_at, _KEYWORDS["send"])
    receive = _argument(args, kwargs, recv_at, _KEYWORDS["recv"])
    names = _KEYWORDS["source"] if name in ("Recv", "recv", "Probe", "probe") else _KEYWORDS["peer"]
    peer = _argument(args, kwargs, peer_at, names)
    if objects:
        sent, received = _object_bytes(send), _object_bytes(value)
    else:
        sent = describe(send)[2]
        received = describe(receive)[2]
    detail = ""
    if source_at is not None:
        source = _argument(args, kwargs, source_at, _KEYWORDS["source"])
        detail = f"from {_peer_text(source)}"
    _span(name, _info(comm).name, _peer(peer), sent, received, start, end, None, "p2p", detail)


def _nonblocking(base, name, spec):
    send_at, recv_at, peer_at = spec
    objects = name.islower()
    request_class = _installed_request
    receiving = "ecv" in name

    def method(self, *args, **kwargs):
        start = _now()
        request = _traced_request(request_class(), base(self, *args, **kwargs))
        end = _now()
        try:
            info = self._mpinb
        except AttributeError:
            info = _info(self)
        if kwargs:
            peer = _argument(args, kwargs, peer_at, _KEYWORDS["source" if receiving else "peer"])
        else:
            peer = args[peer_at] if peer_at < len(args) else None
        if peer is not None and peer < 0:  # ANY_SOURCE, PROC_NULL
            peer = None
        sent = received = 0
        if _state.spans is not None:
            send = _argument(args, kwargs, send_at, _KEYWORDS["send"])
            sent = _object_bytes(send) if objects else describe(send)[2]
            received = 0 if objects else describe(_argument(args, kwargs, recv_at, _KEYWORDS["recv"]))[2]
            _span(name, info.name, peer, sent, received, start, end, None, "p2p", "")
        request._mpinb = (name, info, peer, sent, received, None, None, "")
        return request

    return _named(method, name, base)


def _maker(base, name):
    def method(self, *args, **kwargs):
        made = base(self, *args, **kwargs)
        if made is None or not hasattr(made, "py2f"):
            return made
        classes = _installed["classes"]
        if type(made) not in classes.values():
            kind = next((b for b in type(made).__mro__ if b in classes), None)
            if kind is None:
                return made
            made = classes[kind](made)
        if made == _installed["MPI"].COMM_NULL:
            return made
        parent = self._mpinb if hasattr(self, "_mpinb") else _info(self)
        self._mpinb_made = getattr(self, "_mpinb_made", 0) + 1
        return _adopt(made, f"{parent.name}.{name}#{self._mpinb_made}", _members(made))

    return _named(method, name, base)


def _traced_class(MPI, base):
    namespace = {"__module__": __name__, "__doc__": f"mpi4py's {base.__name__}, every call noted (mpinb)."}
    for name, spec in _BUFFER_COLLECTIVES.items():
        for variant in (name, "I" + name[0].lower() + name[1:]):
            if hasattr(base, variant):
                namespace[variant] = _buffer_collective(getattr(base, variant), variant, name, spec)
    for name, spec in _OBJECT_COLLECTIVES.items():
        if hasattr(base, name):
            namespace[name] = _object_collective(getattr(base, name), name, spec)
    for name, spec in _POINT_TO_POINT.items():
        if hasattr(base, name):
            namespace[name] = _point_to_point(getattr(base, name), name, spec)
    for name, spec in _NONBLOCKING_P2P.items():
        if hasattr(base, name):
            namespace[name] = _nonblocking(getattr(base, name), name, spec)
    for name in _MAKERS:
        if hasattr(base, name):
            namespace[name] = _maker(getattr(base, name), name)
    return type(base.__name__, (base,), namespace)


def _request_class(MPI):
    Request = MPI.Request

    class _Any(type):
        """``isinstance(r, MPI.Request)`` stays true for every request, traced or not."""

        def __instancecheck__(cls, obj):
            return isinstance(obj, Request)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, Request)

    def waiting(name, requests, call, *args, **kwargs):
        collective = None  # a nonblocking collective among the requests: the ranks wait in it
        for request in requests:
            info = getattr(request, "_mpinb", None)
            if info is not None and info[5] is not None:
                collective = info
                break
        start = _now()
        if collective is not None:
            _state.enter(collective[1], collective[5], collective[6], start)
        try:
            return call(*args, **kwargs)
        finally:
            end = _now()
            _state.leave()
            _state.comm_ns += end - start
            infos = [r._mpinb for r in requests if getattr(r, "_mpinb", None) is not None] \
                if _state.spans is not None else ()
            if infos:
                first = infos[0]
                peer = first[2] if len(infos) == 1 else None
                what = ", ".join(f"{info[0]}{'→' if 'send' in info[0].lower() else '←'}"
                                 f"{_peer_text(info[2])}" if info[5] is None else f"{info[0]} #{info[5]}"
                                 for info in infos[:8]) + (", ..." if len(infos) > 8 else "")
                _span(name, first[1].name, peer, 0, 0, start, end, collective[5] if collective else None, "wait",
                      what)

    def on_one(name):
        def wait(self, *args, **kwargs):
            return waiting(name, (self,), getattr(Request, name), self, *args, **kwargs)
        return _named(wait, name, getattr(Request, name))

    def on_many(name):
        def wait(cls, requests, *args, **kwargs):
            return waiting(name, requests, getattr(Request, name), requests, *args, **kwargs)
        return classmethod(_named(wait, name, getattr(Request, name)))

    namespace = {"__doc__": "mpi4py's Request; waiting on it is noted (mpinb).", "__module__": __name__}
    namespace.update({name: on_one(name) for name in ("Wait", "wait")})
    namespace.update({name: on_many(name) for name in ("Waitall", "waitall", "Waitany", "waitany", "Waitsome")})
    TracedRequest = _Any("TracedRequest", (Request,), namespace)
    TracedRequest.__name__ = TracedRequest.__qualname__ = "Request"
    return TracedRequest


def _traced_request(kind, request):
    """*request* as a traced one; the original is kept with it, since it holds the call's buffers alive."""
    traced = kind(request)
    traced._mpinb_original = request
    return traced


def _installed_request():
    return _installed["request"]


def _span(op, comm, peer, sent, received, start, end, seq, kind, detail):
    _state.spans.append((op, comm, peer, sent, received, start, end, seq, kind, detail))
    _state.recorded += 1


def _peer(peer):
    if peer is None or peer < 0:  # ANY_SOURCE, PROC_NULL
        return None
    return int(peer)


def _peer_text(peer):
    return "any" if peer is None or peer < 0 else str(peer)


def _detail(count, dtype, op, installed):
    parts = []
    if op is not None:
        parts.append(installed["ops"].get(op.py2f(), "user op") if hasattr(op, "py2f") else
                     getattr(op, "__name__", "function"))
    if count is not None:
        parts.append(f"{count} x {dtype}")
    elif dtype:
        parts.append(dtype)
    return ", ".join(parts)


def _op_names(MPI):
    names = {}
    for name in ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR", "MAXLOC", "MINLOC",
                 "REPLACE", "NO_OP"):
        op = getattr(MPI, name, None)
        if op is not None:
            names[op.py2f()] = name
    return names


def _named(method, name, base):
    method.__name__ = method.__qualname__ = name
    method.__doc__ = getattr(base, "__doc__", None)
    method.__wrapped__ = base
    return method
