"""Every MPI call through mpi4py, seen: subclasses of mpi4py's communicators and requests that note each call in
the rank's ledger (``ledger.py``) and then call mpi4py's own method.

mpi4py's types are immutable, so their methods cannot be replaced. Instead :func:`install` puts instances of
these subclasses where user code finds communicators: ``MPI.COMM_WORLD`` and ``MPI.COMM_SELF`` (and so the
``comm`` a notebook's ranks predefine), and every communicator made from one (``Dup``, ``Split``, ``Create``,
``Create_cart``, ...) is one too. ``MPI.Request`` and the communicator classes (``MPI.Comm``, ``MPI.Intracomm``,
...) become the traced subclasses, which still answer ``isinstance`` and ``issubclass`` for mpi4py's own objects
and classes, so ``MPI.Request.Waitall(...)``, ``MPI.Intracomm(comm)`` and ``MPI.Comm.f2py(handle)`` are seen as
well. The traced classes keep mpi4py's names, module and docstrings, and ``MPI.COMM_WORLD`` and ``MPI.COMM_SELF``
stay constants: they pickle by name (``loads(dumps(MPI.COMM_WORLD)) is MPI.COMM_WORLD``) and ``free()`` leaves
them usable, as in mpi4py. A communicator made before :func:`install`, or by a library through mpi4py's C API,
is not seen. Python-level interception was measured against the MPI profiling interface: see docs/traces.md.

Here the traced classes are built and installed; the methods they hold are in ``collective_calls.py``,
``p2p_calls.py`` and ``calls.py``, where each call keeps its arguments in ``arguments.py``, and which
communicators are traced in ``comms.py``.
"""

import copyreg

from . import comms, ledger
from .arguments import BUFFER_COLLECTIVES, NONBLOCKING_P2P, OBJECT_COLLECTIVES, POINT_TO_POINT, op_names, peer_text
from .calls import maker, named_like, record_span
from .collective_calls import buffer_collective, object_collective
from .p2p_calls import nonblocking_p2p, point_to_point, stuck_p2p
from .comms import adopt, world_members

_state = ledger.state
_now = ledger.now_ns
_registry = comms.registry
_COMMS = ("Comm", "Intracomm", "Intercomm", "Topocomm", "Cartcomm", "Graphcomm", "Distgraphcomm")
_CONSTANTS = ("COMM_WORLD", "COMM_SELF")
_FROM_HANDLE = ("fromhandle", "fromint", "f2py")
_MAKERS = ("Dup", "Clone", "Split", "Split_type", "Create", "Create_group", "Create_cart", "Create_graph",
           "Create_dist_graph", "Create_dist_graph_adjacent", "Create_intercomm", "Merge", "Dup_with_info", "Idup")


def install(MPI):
    """Make ``MPI.COMM_WORLD``, ``MPI.COMM_SELF``, ``MPI.Request`` and the communicator classes the traced kinds
    (idempotent)."""
    if _registry.installed is not None:
        return
    classes = {getattr(MPI, name): _traced_class(MPI, getattr(MPI, name)) for name in _COMMS}
    request = _request_class(MPI)
    original = {name: getattr(MPI, name) for name in _COMMS + _CONSTANTS + ("Request",)}
    _registry.installed = {"classes": classes, "request": request, "MPI": MPI, "ops": op_names(MPI),
                          "in_place": MPI.IN_PLACE, "any": MPI.ANY_SOURCE,
                          "original": (MPI.COMM_WORLD, MPI.COMM_SELF, MPI.Request), "names": original,
                          # mpi4py's own constants (id) -> their names, which now name the traced ones
                          "constants": {id(original[name]): name for name in _CONSTANTS}}
    world = classes[MPI.Intracomm](MPI.COMM_WORLD)
    adopt(world, "COMM_WORLD", tuple(range(MPI.COMM_WORLD.size)))
    self_comm = classes[MPI.Intracomm](MPI.COMM_SELF)
    adopt(self_comm, "COMM_SELF", (MPI.COMM_WORLD.rank,))
    world._mpinb_constant, self_comm._mpinb_constant = "COMM_WORLD", "COMM_SELF"
    _state.describe_p2p = stuck_p2p  # a roll call says which point-to-point call a stuck rank is in
    for name in _COMMS:
        setattr(MPI, name, classes[original[name]])
    MPI.COMM_WORLD, MPI.COMM_SELF, MPI.Request = world, self_comm, request


def uninstall():
    """Put mpi4py's own objects back (for measuring the untraced cost beside the traced one)."""
    installed = _registry.installed
    if installed is not None:
        MPI = installed["MPI"]
        for name, value in installed["names"].items():
            setattr(MPI, name, value)
        _registry.installed = None


def traced(comm, name=None):
    """*comm* (an mpi4py communicator made before :func:`install`, or by a library) as a traced one."""
    classes = _registry.installed["classes"]
    base = next(base for base in type(comm).__mro__ if base in classes)
    copy = classes[base](comm)
    adopt(copy, name or f"comm#{comm.py2f()}", world_members(comm))
    return copy


_WAITED = {}  # (call, peer) -> how a wait span's detail names a point-to-point request: Isend→1, Irecv←any


def _waited(info):
    """How a wait span's detail names the request of *info* (what the call that made it noted)."""
    if info[5] is not None:  # a nonblocking collective
        return f"{info[0]} #{info[5]}"
    key = (info[0], info[2])
    text = _WAITED.get(key)
    if text is None:
        if len(_WAITED) > 4096:
            _WAITED.clear()
        text = _WAITED[key] = f"{info[0]}{'→' if 'send' in info[0].lower() else '←'}{peer_text(info[2])}"
    return text


class _StandIn(type):
    """A traced class under mpi4py's name: ``isinstance`` and ``issubclass`` hold for mpi4py's own objects and
    classes of that kind too, as they did before it took the name (a subclass of it is checked as usual)."""

    def __instancecheck__(cls, obj):
        original = cls.__dict__.get("_mpinb_original")
        return isinstance(obj, original) if original is not None else type.__instancecheck__(cls, obj)

    def __subclasscheck__(cls, sub):
        original = cls.__dict__.get("_mpinb_original")
        return issubclass(sub, original) if original is not None else type.__subclasscheck__(cls, sub)


def _traced_class(MPI, base):
    namespace = {"__module__": base.__module__, "__qualname__": base.__qualname__, "_mpinb_original": base,
                 "__doc__": base.__doc__}  # mpi4py's, as help() and mpi4py's own doc checks expect
    for name, spec in BUFFER_COLLECTIVES.items():
        for variant in (name, "I" + name[0].lower() + name[1:]):
            if hasattr(base, variant):
                namespace[variant] = buffer_collective(getattr(base, variant), variant, name, spec, MPI.IN_PLACE)
    for name, spec in OBJECT_COLLECTIVES.items():
        if hasattr(base, name):
            namespace[name] = object_collective(getattr(base, name), name, spec)
    for name, spec in POINT_TO_POINT.items():
        if hasattr(base, name):
            namespace[name] = point_to_point(getattr(base, name), name, spec)
    for name, spec in NONBLOCKING_P2P.items():
        if hasattr(base, name):
            namespace[name] = nonblocking_p2p(getattr(base, name), name, spec)
    for name in _MAKERS:
        if hasattr(base, name):
            namespace[name] = maker(getattr(base, name), name)
    namespace.update(_from_handle(base, lambda: _registry.installed["classes"]))
    namespace["__init__"] = named_like(_copy_ledger, "__init__", base.__init__)
    namespace["__reduce__"] = named_like(_reduce_comm(base), "__reduce__", base.__reduce__)
    namespace["free"] = named_like(_free_comm(base), "free", base.free)
    return _StandIn(base.__name__, (base,), namespace)


def _copy_ledger(self, comm=None, *args, **kwargs):
    """A copy of a communicator (``MPI.Intracomm(comm)``, ``pkl5.Intercomm(comm)``) counts its collectives in its
    ledger, under the same name on every rank (a name by handle would differ from rank to rank)."""
    info = getattr(comm, "_mpinb", None)
    if info is not None and comm == self:
        self._mpinb, self._mpinb_counts = info, comm._mpinb_counts


def _from_handle(base, classes):
    """``fromhandle``, ``fromint`` and ``f2py``, giving the traced kind of what mpi4py's give (``classes()``: mpi4py's
    class -> its traced one), so that ``type(MPI.Comm.f2py(comm.py2f())) is type(comm)`` as without tracing."""

    def converting(name):
        function = getattr(base, name)

        def convert(cls, *args, **kwargs):
            made = function(*args, **kwargs)
            kind = classes().get(type(made))
            return made if kind is None else kind(made)

        return classmethod(named_like(convert, name, function))

    return {name: converting(name) for name in _FROM_HANDLE if hasattr(base, name)}


def _reduce_comm(base):
    """Pickle as mpi4py does, by name: ``MPI.COMM_WORLD`` and ``MPI.COMM_SELF`` as themselves, a copy of one
    (``MPI.Intracomm(MPI.COMM_WORLD)``) as a new object of its class over that constant; any other communicator
    raises mpi4py's ``ValueError``."""

    def reduce(self):
        installed = _registry.installed
        MPI = installed["MPI"] if installed is not None else None
        name = self.__dict__.get("_mpinb_constant")
        if name is not None and MPI is not None and getattr(MPI, name, None) is self:
            return name
        reduced = base.__reduce__(self)
        if MPI is not None and isinstance(reduced, tuple) and reduced[0] is copyreg.__newobj__:
            cls, named = reduced[1]
            name = installed["constants"].get(id(named))
            if name is not None:  # mpi4py's own constant: its name now holds the traced one
                return copyreg.__newobj__, (cls, getattr(MPI, name))
        return reduced

    return reduce


def _free_comm(base):
    """``free()``: mpi4py leaves its constants alone (``COMM_WORLD.free()`` does nothing), so do the traced ones."""

    def free(self):
        if "_mpinb_constant" not in self.__dict__:
            base.free(self)

    return free


def _request_class(MPI):
    Request = MPI.Request

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
                what = ", ".join([_waited(info) for info in infos[:8]]) + (", ..." if len(infos) > 8 else "")
                record_span(name, first[1].name, peer, 0, 0, start, end, collective[5] if collective else None,
                            "wait", what)

    def on_one(name):
        call = getattr(Request, name)

        def wait(self, *args, **kwargs):
            return waiting(name, (self,), call, self, *args, **kwargs)
        return named_like(wait, name, call)

    def on_many(name):
        call = getattr(Request, name)

        def wait(cls, requests, *args, **kwargs):
            return waiting(name, requests, call, requests, *args, **kwargs)
        return classmethod(named_like(wait, name, call))

    namespace = {"__doc__": Request.__doc__, "__module__": Request.__module__,
                 "__qualname__": Request.__qualname__, "_mpinb_original": Request}
    namespace.update({name: on_one(name) for name in ("Wait", "wait")})
    namespace.update({name: on_many(name) for name in ("Waitall", "waitall", "Waitany", "waitany", "Waitsome")})
    namespace.update(_from_handle(Request, lambda: {Request: TracedRequest}))
    TracedRequest = _StandIn(Request.__name__, (Request,), namespace)
    return TracedRequest

