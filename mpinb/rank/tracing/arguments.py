"""What a traced MPI call was given: where each call kind keeps its buffers, root or peer and op among its
arguments, and a buffer's count, dtype and bytes as far as they can be told cheaply."""

# name: (kind, send buffer, receive buffer, root or peer, reduction op) — argument positions, None for absent
BUFFER_COLLECTIVES = {
    "Barrier": (None, None, None, None), "Bcast": (0, 0, 1, None),
    "Gather": (0, 1, 2, None), "Gatherv": (0, 1, 2, None), "Scatter": (0, 1, 2, None), "Scatterv": (0, 1, 2, None),
    "Allgather": (0, 1, None, None), "Allgatherv": (0, 1, None, None), "Alltoall": (0, 1, None, None),
    "Alltoallv": (0, 1, None, None), "Alltoallw": (0, 1, None, None),
    "Reduce": (0, 1, 3, 2), "Allreduce": (0, 1, None, 2), "Reduce_scatter_block": (0, 1, None, 2),
    "Reduce_scatter": (0, 1, None, 3), "Scan": (0, 1, None, 2), "Exscan": (0, 1, None, 2),
}
OBJECT_COLLECTIVES = {
    "barrier": (None, None, None, None), "bcast": (0, None, 1, None), "gather": (0, None, 1, None),
    "scatter": (0, None, 1, None), "allgather": (0, None, None, None), "alltoall": (0, None, None, None),
    "reduce": (0, None, 2, 1), "allreduce": (0, None, None, 1), "scan": (0, None, None, 1),
    "exscan": (0, None, None, 1),
}
ROOTED = {"Bcast", "Gather", "Gatherv", "Scatter", "Scatterv", "Reduce", "bcast", "gather", "scatter", "reduce"}
SAME_SIZE_IN_PLACE = {"Allreduce", "Reduce", "Scan", "Exscan", "Bcast"}
VECTOR = {"Gatherv", "Scatterv", "Allgatherv", "Alltoallv", "Alltoallw", "Reduce_scatter"}  # counts may differ
# name: (send buffer, receive buffer, peer, second peer (a source))
POINT_TO_POINT = {
    "Send": (0, None, 1, None), "Ssend": (0, None, 1, None), "Bsend": (0, None, 1, None),
    "Rsend": (0, None, 1, None), "Recv": (None, 0, 1, None), "Sendrecv": (0, 3, 1, 4),
    "Sendrecv_replace": (0, 0, 1, 3), "Probe": (None, None, 0, None),
    "send": (0, None, 1, None), "ssend": (0, None, 1, None), "recv": (None, None, 1, None),
    "sendrecv": (0, None, 1, 4), "probe": (None, None, 0, None),
}
NONBLOCKING_P2P = {
    "Isend": (0, None, 1), "Issend": (0, None, 1), "Ibsend": (0, None, 1), "Irsend": (0, None, 1),
    "Irecv": (None, 0, 1), "isend": (0, None, 1), "issend": (0, None, 1), "irecv": (None, None, 1),
}
# where a blocking point-to-point call's tag is, and whether it sends, receives or both: for settling a rank
# stuck in one (``rank/settle.py``)
TAGS = {"Send": ("send", 2), "Ssend": ("send", 2), "Bsend": ("send", 2), "Rsend": ("send", 2),
        "send": ("send", 2), "ssend": ("send", 2), "Recv": ("recv", 2), "recv": ("recv", 2),
        "Probe": ("recv", 1), "probe": ("recv", 1), "Sendrecv": ("both", 2), "sendrecv": ("both", 2),
        "Sendrecv_replace": ("both", 2)}
KEYWORDS = {  # what the positions above are called, for calls that pass them by keyword
    "send": ("buf", "sendbuf", "obj", "sendobj"), "recv": ("recvbuf", "buf"), "root": ("root",),
    "peer": ("dest",), "source": ("source",), "op": ("op",),
}
_FORMATS = {"d": "float64", "f": "float32", "e": "float16", "b": "int8", "B": "uint8", "h": "int16",
            "H": "uint16", "?": "bool", "Zd": "complex128", "Zf": "complex64", "c": "char"}


def argument(args, kwargs, position, names):
    """The argument at *position*, or passed under one of *names*; ``None`` if the call left it out."""
    if position is None:
        return None
    if position < len(args):
        return args[position]
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return None


def collective_arguments(args, kwargs, spec):
    """A collective's ``(send, receive, root)`` from a call that passes some by keyword (*spec*: positions)."""
    send_at, recv_at, root_at, _ = spec
    return (argument(args, kwargs, send_at, KEYWORDS["send"]), argument(args, kwargs, recv_at, KEYWORDS["recv"]),
            argument(args, kwargs, root_at, KEYWORDS["root"]))


def describe(buffer):
    """``(count, dtype name, bytes)`` of an mpi4py buffer argument, as far as it can be told cheaply.

    A buffer given with its datatype (``[data, count, MPI.FLOAT]``, ``[data, MPI.DOUBLE]``) is described by that
    datatype and count, not by the memory holding it: ``mpinb.torch`` passes a tensor's memory as bytes (a uint8
    view, since numpy has no bfloat16) with the tensor's count and MPI type, and the span says ``68 x float32``.
    """
    if buffer is None:
        return None, None, 0
    if type(buffer) in (list, tuple) and buffer:  # [data, MPI.DOUBLE], [data, count, MPI.DOUBLE], ...
        return _described_spec(buffer)
    size = getattr(buffer, "nbytes", None)
    dtype = getattr(buffer, "dtype", None)
    if size is not None and dtype is not None:  # numpy and friends
        kind = type(buffer)
        if kind not in ARRAYS and kind.__name__ == "ndarray" and kind.__module__ == "numpy":
            ARRAYS.add(kind)
        return getattr(buffer, "size", None), dtype_name(dtype), int(size)
    numel = getattr(buffer, "numel", None)
    if numel is not None and dtype is not None:  # torch
        count = numel()
        return count, dtype_name(dtype), count * buffer.element_size()
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


def _described_spec(spec):
    """``(count, dtype name, bytes)`` of a buffer given as a list: ``[data, datatype]``, ``[data, count,
    datatype]``, ``[data, (count, displacement), datatype]``, ``[data, counts, displacements, datatype]`` (a
    datatype may be a type character, ``"d"``) or ``[data, counts]``; the data's own when the list says less."""
    count, dtype, size = describe(spec[0])
    if len(spec) < 2:
        return count, dtype, size
    datatype = spec[-1]
    known = _KNOWN.get(id(datatype))  # a predefined datatype seen before (the common call: a few hundred ns)
    named = known[1] if known is not None and known[0] is datatype else _datatype(datatype)
    if named is None:  # [data, counts]: the data's type
        return count, dtype, size
    name, itemsize = named
    given = _count(spec[1]) if len(spec) > 2 else None
    if given is None:
        given = size // itemsize if itemsize else count
    return given, name, given * itemsize if itemsize else size


def _count(value):
    """The count of a buffer list's count entry: an int, ``(count, displacement)``, or counts (summed)."""
    if type(value) is int:
        return value
    try:
        if type(value) is tuple and len(value) == 2 and not isinstance(value[0], int):  # (counts, displacements)
            value = value[0]
        elif type(value) is tuple and len(value) == 2:  # (count, displacement)
            return int(value[0])
        return int(sum(value)) if not isinstance(value, int) else int(value)
    except (TypeError, ValueError):
        return None


_DATATYPES = {}  # MPI datatype handle or type character -> (name, bytes per element)
_KNOWN = {}  # id of a predefined datatype object -> (the object, (name, bytes per element))
_DATATYPE_NAMES = {"MPI_BYTE": "byte", "MPI_PACKED": "packed", "MPI_CHAR": "char"}


def _datatype(datatype):
    """``(name, bytes per element)`` of an MPI datatype or type character, or ``None`` for anything else."""
    if type(datatype) is str:
        key = datatype
    else:
        py2f = getattr(datatype, "py2f", None)
        if py2f is None or not hasattr(datatype, "Get_size"):
            return None
        key = py2f()
    try:
        return _DATATYPES[key]
    except KeyError:
        pass
    import numpy

    try:
        if type(datatype) is str:
            kind = numpy.dtype(datatype)
            named = (_FORMATS.get(datatype) or kind.name, kind.itemsize)
        else:
            mpi_name = datatype.Get_name()
            typestr = getattr(datatype, "typestr", "")
            if mpi_name in _DATATYPE_NAMES:
                name = _DATATYPE_NAMES[mpi_name]
            elif typestr and not typestr.startswith("V"):
                name = numpy.dtype(typestr).name
            else:  # a derived type: its MPI name if it has one, else its size
                name = mpi_name or f"{datatype.Get_size()}-byte type"
            named = (name, datatype.Get_size())
    except Exception:  # noqa: BLE001 - a datatype this MPI cannot describe (null, freed): the data's own type
        return None
    if type(datatype) is str or getattr(datatype, "is_predefined", False):  # a derived one's handle is reused
        _DATATYPES[key] = named
        _KNOWN[id(datatype)] = (datatype, named)  # kept, so its id is never another object's
    return named


# numpy's ndarray, once describe() met one: an array of it is described by three attributes (its size, dtype and
# nbytes, all plain), which collective_calls.py and p2p_calls.py read in place, sparing a call of describe() per buffer
ARRAYS = set()
DTYPE_NAMES = {}  # dtype -> its name, as dtype_name() gives it


def dtype_name(dtype):
    """``float64``, ``float32``, ... (``str()`` of a numpy dtype costs microseconds: they are kept)."""
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        name = DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
        return name
    except TypeError:  # not hashable
        return str(dtype)


def object_bytes(obj):
    """Bytes of a pickled call's object as far as they can be told without pickling it (0 if not)."""
    kind = type(obj)
    if kind is int or kind is float or obj is None:
        return 0
    if kind is bytes or kind is bytearray:
        return len(obj)
    size = getattr(obj, "nbytes", None)
    return int(size) if size is not None else 0


def peer_rank(peer):
    """*peer* as a rank for a span, or ``None`` for ``ANY_SOURCE`` and ``PROC_NULL``."""
    if peer is None or peer < 0:  # ANY_SOURCE, PROC_NULL
        return None
    return int(peer)


def peer_text(peer):
    """*peer* as a span's detail says it: a rank, or ``any``."""
    return "any" if peer is None or peer < 0 else str(peer)


def span_detail(count, dtype, op, installed):
    """A collective span's detail: ``SUM, 68 x float32`` (*installed*: what ``intercept.install`` put in place,
    which names the predefined ops)."""
    parts = []
    if op is not None:
        parts.append(installed["ops"].get(op.py2f(), "user op") if hasattr(op, "py2f") else
                     getattr(op, "__name__", "function"))
    if count is not None:
        parts.append(f"{count} x {dtype}")
    elif dtype:
        parts.append(dtype)
    return ", ".join(parts)


def op_names(MPI):
    """``{handle: name}`` of *MPI*'s predefined reduction ops, to name them in spans."""
    names = {}
    for name in ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR", "MAXLOC", "MINLOC",
                 "REPLACE", "NO_OP"):
        op = getattr(MPI, name, None)
        if op is not None:
            names[op.py2f()] = name
    return names
