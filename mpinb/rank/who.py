"""``%mpi who``, rank side: every user name on this rank with its type, shape, dtype, a short content hash and a
short summary, as plain picklable data the notebook compares across ranks.

The cost is bounded: an array, tensor or model is hashed over its first *limit* bytes at most (64 MB by
default, said in its ``note``), one call hashes *total* bytes at most, a container is hashed through a pickle
cut off after *pickle_limit* bytes, and a tensor on a GPU is copied to the host to be hashed only while the
call has copied less than *device_limit* (16 MB): a large one is left unhashed, never moved. The hash is
SHA-1 used as a fingerprint, not for security: through OpenSSL it runs at about 2 GB/s where blake2b runs at
0.35 GB/s (measured here), so a 100 MB array costs about 35 ms.
"""

import hashlib
import pickle
import reprlib
import sys
import types

import numpy as np

MB = 1 << 20
LIMIT = 64 * MB  # bytes of one array, tensor or model hashed at most
TOTAL = 512 * MB  # bytes hashed in one call at most
PICKLE_LIMIT = 4 * MB  # bytes of a pickled container hashed at most
DEVICE_LIMIT = 16 * MB  # a GPU tensor (or model) larger than this is not copied to the host to be hashed
SUMMARY = 40  # characters of a summary at most
HIDDEN = frozenset({"In", "Out", "get_ipython", "exit", "quit", "MPI"})  # IPython's own names, and mpinb's MPI
_TYPE_ONLY = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)


def who(namespace=None, *, limit=LIMIT, total=TOTAL, pickle_limit=PICKLE_LIMIT, device_limit=DEVICE_LIMIT):
    """Describe the user's names in *namespace*: ``{name: {"type", "shape", "dtype", "hash", "summary", "note"}}``.

    Args:
        namespace (dict or None, default None): the names to describe; ``None`` means where cells run (the
            engine's IPython user namespace, else ``__main__``'s globals).
        limit (int, default 64 MB): bytes of one array, tensor or model's state hashed at most; the hash of a
            larger one covers its first *limit* bytes and its ``note`` says so: ``"first 64 MB"``.
        total (int, default 512 MB): bytes hashed in this call at most; names met after it is spent are hashed
            over what is left, or not at all.
        pickle_limit (int, default 4 MB): bytes of a pickled container or object hashed at most.
        device_limit (int, default 16 MB): bytes copied from GPUs to the host to be hashed in this call at
            most; a GPU tensor (or model) that does not fit is never copied: its hash is ``None``, its ``note``
            says why.

    Names starting with ``_``, modules, IPython's own names (``In``, ``Out``, ``get_ipython``, ``exit``,
    ``quit``, and whatever IPython put in the namespace itself) and mpinb's ``MPI`` are left out; ``comm``,
    ``rank`` and ``size`` stay (they show that ranks differ by design). ``"type"`` is the class name
    (``"Tensor"``, ``"ndarray"``, ``"Linear"``), ``"shape"`` a tuple or ``None``, ``"dtype"`` a name such as
    ``"float32"`` or ``None``, ``"hash"`` 8 hex digits or ``None`` (cannot be hashed cheaply: ``"note"`` says
    why), ``"summary"`` at most 40 characters. Functions, classes and optimizers get their type only (no hash);
    a ``torch.nn.Module`` its parameter count (``"parameters"``) and a hash over its ``state_dict()``.
    Never raises for a value: one that cannot be described says why in its ``note``.

    Example::

        >>> import numpy as np
        >>> who({"w": np.zeros(3, "float32"), "n": 5})["w"]["shape"]
        (3,)
    """
    hidden = {}
    if namespace is None:
        from .runner import _shell, user_namespace

        shell = _shell()
        namespace = user_namespace(shell)
        hidden = getattr(shell, "user_ns_hidden", None) or {}
    budget = _Budget(limit, total, pickle_limit, device_limit)
    described = {}
    for name, value in list(namespace.items()):
        if (not isinstance(name, str) or name.startswith("_") or name in HIDDEN
                or issubclass(type(value), types.ModuleType) or (name in hidden and hidden[name] is value)):
            continue
        described[name] = describe(value, budget)
    return described


def describe(value, budget=None):
    """One value's entry of :func:`who` (*budget*, shared by the values of one call, says what may be hashed)."""
    budget = budget or _Budget()
    budget.start()
    entry = {"type": type(value).__name__, "shape": None, "dtype": None, "hash": None, "summary": "", "note": None}
    try:
        torch = sys.modules.get("torch")
        if isinstance(value, np.ndarray):
            _describe_array(value, entry, budget)
        elif torch is not None and isinstance(value, torch.Tensor):
            _describe_tensor(value, entry, budget)
        elif torch is not None and isinstance(value, torch.nn.Module):
            _describe_module(value, entry, budget)
        elif torch is not None and isinstance(value, torch.optim.Optimizer):
            groups = len(value.param_groups)
            entry["summary"] = f"{groups} parameter group{'s' if groups != 1 else ''}"
        elif _is_comm(value):
            _describe_comm(value, entry)
        elif isinstance(value, _TYPE_ONLY):
            entry["summary"] = _signature(value)
        else:
            entry["shape"], entry["dtype"], entry["summary"] = _shape(value), _dtype(value), _summary(value)
            _hash_object(value, entry, budget)
    except Exception as exc:  # noqa: BLE001 - a user object may fail in any way: say so, describe the rest
        entry["hash"] = None
        try:
            why = _clip(str(exc))
        except Exception:  # noqa: BLE001 - its message too
            why = "(no message)"
        entry["note"] = f"could not be described: {type(exc).__name__}: {why}"
    if not entry["summary"]:
        entry["summary"] = f"<{entry['type']}>"
    return entry


class _Budget:
    """What one call of :func:`who` may still hash and copy from GPUs; *partial*: the current hash was cut off."""

    def __init__(self, limit=LIMIT, total=TOTAL, pickle_limit=PICKLE_LIMIT, device_limit=DEVICE_LIMIT):
        self.limit, self.left, self.pickle_limit, self.device_left = limit, total, pickle_limit, device_limit
        self.start()

    def start(self):
        """A new name: it may hash its own limit, or what is left of the call's total."""
        self.allowed = self.room = min(self.limit, self.left)
        self.partial = False

    def take(self, nbytes):
        """How many of *nbytes* may be hashed now (the rest is cut off, and that is noted)."""
        taken = max(0, min(nbytes, self.room))
        self.room -= taken
        self.left -= taken
        if taken < nbytes:
            self.partial = True
        return taken

    def cut_note(self):
        if not self.partial:
            return None
        return f"first {_size(self.allowed)}" if self.allowed else "not hashed: who's total spent"


def _hasher(*header):
    """A hash that starts with *header* (type, shape, dtype): equal bytes of other shapes hash apart."""
    return hashlib.sha1(repr(header).encode(), usedforsecurity=False)


def _short(digest):
    return digest.hexdigest()[:8]


# ---------------------------------------------------------------- numpy


def _describe_array(array, entry, budget):
    entry["shape"], entry["dtype"] = tuple(array.shape), str(array.dtype)
    entry["summary"] = _clip(_values(_first(array, 6), array.size > 6, array.ndim))
    if array.dtype.hasobject:  # pointers: hash the objects themselves, through pickle
        _hash_object(array, entry, budget)
        return
    digest = _hasher(entry["type"], entry["shape"], entry["dtype"])
    _feed_array(digest, array, budget)
    entry["hash"], entry["note"] = _short(digest), budget.cut_note()
    if entry["note"] == "not hashed: who's total spent":
        entry["hash"] = None


def _feed_array(digest, array, budget):
    """Hash *array*'s bytes in C order, as many as *budget* allows (a prefix copied when not contiguous)."""
    room = budget.take(array.nbytes)
    if room > 0:
        digest.update(_head(array, room).reshape(-1).view(np.uint8)[:room])


def _head(array, nbytes):
    """A C-contiguous array holding at least the first *nbytes* of *array* in C order (and not much more)."""
    if array.flags.c_contiguous:
        return array.reshape(-1)[: -(-nbytes // array.itemsize)]
    if array.nbytes <= nbytes or array.ndim == 0:
        return np.ascontiguousarray(array)
    row = array.nbytes // array.shape[0]
    if row <= nbytes:
        return np.ascontiguousarray(array[: -(-nbytes // row)])
    return _head(array[0], nbytes)


def _first(array, count):
    """The first *count* elements of *array* in C order, flat, without touching the rest."""
    if array.size == 0:
        return array.reshape(-1)
    while array.ndim > 1 and array[0].size >= count:
        array = array[0]
    if array.ndim > 1:
        array = array[: -(-count // array[0].size)]
    return array.reshape(-1)[:count]


def _values(flat, more, ndim=1):
    if ndim == 0:
        return str(flat[0])
    with np.printoptions(precision=4, threshold=100, linewidth=10_000):
        text = np.array2string(np.asarray(flat), separator=" ")
    return text[:-1] + " …]" if more else text


# ---------------------------------------------------------------- torch


def _describe_tensor(tensor, entry, budget):
    entry["shape"] = tuple(tensor.shape)
    entry["dtype"] = str(tensor.dtype).replace("torch.", "")
    digest = _hasher(entry["type"], entry["shape"], entry["dtype"])
    why = _feed_tensor(digest, tensor, budget)
    where = "" if tensor.device.type == "cpu" else f"{tensor.device} "
    if why:
        entry["note"] = why
        entry["summary"] = _clip(f"{where}{_size(_nbytes(tensor))}")
        return
    entry["hash"], entry["note"] = _short(digest), budget.cut_note()
    if entry["note"] == "not hashed: who's total spent":
        entry["hash"] = None
    entry["summary"] = _clip(where + _values(_first_tensor(tensor, 6), tensor.numel() > 6, tensor.dim()))


def _feed_tensor(digest, tensor, budget):
    """Hash *tensor*'s bytes as *budget* allows; return why it cannot be hashed, or ``None``."""
    torch = sys.modules["torch"]
    tensor = tensor.detach()
    if tensor.layout != torch.strided or tensor.is_quantized:
        kind = "quantized" if tensor.is_quantized else str(tensor.layout).replace("torch.", "")
        return f"not hashed: {kind} tensor"
    if tensor.device.type == "meta":
        return "not hashed: no data (meta tensor)"
    nbytes = _nbytes(tensor)
    on_device = tensor.device.type != "cpu"
    if on_device and budget.room > 0 and nbytes > budget.device_left:
        return f"not hashed: {_size(nbytes)} on {tensor.device}, not copied to the host"
    room = budget.take(nbytes)
    if room <= 0:
        return None
    head = _head_tensor(tensor, room)
    if on_device:
        budget.device_left -= _nbytes(head)
        head = head.cpu()
    raw = head.resolve_conj().resolve_neg().reshape(-1).view(torch.uint8)
    digest.update(raw.numpy()[:room])
    return None


def _nbytes(tensor):
    return tensor.numel() * tensor.element_size()


def _head_tensor(tensor, nbytes):
    if tensor.is_contiguous():
        return tensor.reshape(-1)[: -(-nbytes // tensor.element_size())]
    if _nbytes(tensor) <= nbytes or tensor.dim() == 0:
        return tensor.contiguous()
    row = _nbytes(tensor) // tensor.shape[0]
    if row <= nbytes:
        return tensor[: -(-nbytes // row)].contiguous()
    return _head_tensor(tensor[0], nbytes)


def _first_tensor(tensor, count):
    tensor = tensor.detach()
    if tensor.numel() == 0:
        return np.zeros(0)
    while tensor.dim() > 1 and tensor[0].numel() >= count:
        tensor = tensor[0]
    if tensor.dim() > 1:
        tensor = tensor[: -(-count // tensor[0].numel())]
    flat = tensor.reshape(-1)[:count].cpu().resolve_conj().resolve_neg()
    if flat.dtype.is_floating_point and flat.element_size() < 4:
        flat = flat.float()  # bfloat16, float16 and float8 print through float32
    try:
        return flat.numpy()
    except (TypeError, RuntimeError):
        return np.array(flat.tolist())


def _describe_module(module, entry, budget):
    parameters = sum(p.numel() for p in module.parameters())
    entry["parameters"] = parameters
    devices = sorted({str(t.device) for t in module.state_dict().values() if hasattr(t, "device")})
    where = "" if devices in ([], ["cpu"]) else f", {', '.join(devices)}"
    entry["summary"] = _clip(f"{parameters:,} parameters{where}")
    digest, why = _module_digest(module, budget)
    entry["hash"] = None if why else _short(digest)
    entry["note"] = why or budget.cut_note()
    if entry["note"] == "not hashed: who's total spent":
        entry["hash"] = None


def _module_digest(module, budget):
    """A hash over *module*'s ``state_dict()`` (names, shapes, dtypes, bytes), and why not when it cannot be."""
    state = module.state_dict()
    on_device = [t for t in state.values() if hasattr(t, "device") and t.device.type != "cpu"]
    device_bytes = sum(_nbytes(t) for t in on_device)
    if device_bytes > budget.device_left:
        where = ", ".join(sorted({str(t.device) for t in on_device}))
        return None, f"not hashed: {_size(device_bytes)} of state on {where}, not copied to the host"
    digest = _hasher(type(module).__name__)
    for key, tensor in state.items():
        if hasattr(tensor, "detach"):
            digest.update(repr((key, tuple(tensor.shape), str(tensor.dtype))).encode())
            why = _feed_tensor(digest, tensor, budget)
            if why:
                return None, f"not hashed: {key} is {why.removeprefix('not hashed: ')}"
        else:
            digest.update(repr((key, tensor)).encode())  # extra state: whatever the module keeps
    return digest, None


# ---------------------------------------------------------------- mpi4py


def _is_comm(value):
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and isinstance(value, mpi.Comm)


def _describe_comm(comm, entry):
    """A communicator by its name and size (a handle does not pickle, and its address means nothing elsewhere)."""
    mpi = sys.modules["mpi4py.MPI"]
    if comm == mpi.COMM_NULL:
        entry["summary"], entry["hash"] = "COMM_NULL", _short(_hasher(entry["type"], "COMM_NULL"))
        return
    name, size = comm.Get_name(), comm.Get_size()
    entry["summary"] = _clip(f"{name or 'unnamed'}, size {size}")
    entry["hash"] = _short(_hasher(entry["type"], name, size))


# ---------------------------------------------------------------- anything else


def _hash_object(value, entry, budget):
    """Hash *value* through pickle, cut off after *budget.pickle_limit* bytes."""
    digest = _hasher(entry["type"], entry["shape"], entry["dtype"])
    pickler = _Pickler(digest, budget)
    try:
        pickler.dump(value)
    except _Stop:
        entry["hash"] = _short(digest)
        entry["note"] = f"first {_size(budget.pickle_limit)} pickled"
        return
    except _Unhashable as exc:
        entry["note"] = str(exc)
        return
    except Exception as exc:  # noqa: BLE001 - unpicklable objects raise TypeError, PicklingError, anything else
        entry["note"] = f"not hashed: cannot be pickled ({type(exc).__name__})"
        return
    entry["hash"], entry["note"] = _short(digest), budget.cut_note()


class _Stop(Exception):
    """A pickle reached its limit: the hash covers what was written so far."""


class _Unhashable(Exception):
    """Something inside cannot be hashed (a large tensor on a GPU): the message says what."""


class _Sink:
    """Where a pickle goes: into the hash, until *limit* bytes were written."""

    def __init__(self, digest, limit):
        self.digest, self.left = digest, limit

    def write(self, data):
        self.digest.update(data[: max(self.left, 0)])
        self.left -= len(data)
        if self.left < 0:
            raise _Stop
        return len(data)


class _Pickler(pickle.Pickler):
    """Pickles into a hash; arrays, tensors, models, long strings and sets are hashed their own way instead:
    contents within the budget, no GPU tensor copied whole, sets in an order that does not depend on the
    process's string hash seed (which differs from rank to rank)."""

    def __init__(self, digest, budget):
        super().__init__(_Sink(digest, budget.pickle_limit), protocol=5)
        self.budget = budget

    def persistent_id(self, obj):
        cls = type(obj)
        if cls in _PLAIN or (cls is str or cls is bytes) and len(obj) <= 65536:
            return None  # the common case first: a Python call per object is most of the cost
        torch = sys.modules.get("torch")
        if isinstance(obj, np.ndarray) and not obj.dtype.hasobject:
            digest = _hasher(obj.shape, str(obj.dtype))
            _feed_array(digest, obj, self.budget)
            return "ndarray:" + digest.hexdigest()
        if torch is not None and isinstance(obj, torch.Tensor):
            digest = _hasher(tuple(obj.shape), str(obj.dtype))
            why = _feed_tensor(digest, obj, self.budget)
            if why:
                raise _Unhashable(why)
            return "tensor:" + digest.hexdigest()
        if torch is not None and isinstance(obj, torch.nn.Module):
            digest, why = _module_digest(obj, self.budget)
            if why:
                raise _Unhashable(why)
            return "module:" + digest.hexdigest()
        if isinstance(obj, (bytes, bytearray)):
            digest = _hasher(type(obj).__name__, len(obj))
            digest.update(memoryview(obj)[: self.budget.take(len(obj))])
            return f"{type(obj).__name__}:{digest.hexdigest()}"
        if isinstance(obj, str):  # a long one, encoded a MB at a time until the budget is spent
            digest = _hasher("str", len(obj))
            for start in range(0, len(obj), MB):
                chunk = obj[start:start + MB].encode("utf-8", "surrogatepass")
                taken = self.budget.take(len(chunk))
                digest.update(chunk[:taken])
                if taken < len(chunk):
                    break
            return f"str:{digest.hexdigest()}"
        if isinstance(obj, (set, frozenset)):
            return type(obj).__name__, self._members(obj)
        if _is_comm(obj):
            entry = {"type": type(obj).__name__}
            _describe_comm(obj, entry)
            return "comm:" + entry["hash"]
        return None

    def _members(self, members):
        """A set's members in an order every process agrees on: sorted when all are str, bytes, int or float,
        else sorted by their own hashes; at most :data:`SET_MEMBERS` members."""
        if len(members) > SET_MEMBERS:
            raise _Unhashable(f"not hashed: a set of {len(members):,} members (sorting them costs too much)")
        kinds = {type(member) for member in members}
        if len(kinds) <= 1 and kinds <= {str, bytes, int, float}:
            return tuple(sorted(members))  # pickled as it is (no persistent ids): plain members only
        digests = []
        for member in members:
            digest = _hasher()
            _Pickler(digest, self.budget).dump(member)
            digests.append(digest.hexdigest())
        return tuple(sorted(digests))


_PLAIN = frozenset({int, float, complex, bool, type(None), tuple, list, dict})
SET_MEMBERS = 100_000  # members of a set hashed at most (they are sorted first)


def _shape(value):
    try:
        shape = getattr(value, "shape", None)
    except Exception:  # noqa: BLE001 - a property of a user object may raise
        return None
    if isinstance(shape, tuple) and all(isinstance(n, (int, np.integer)) for n in shape):
        return tuple(int(n) for n in shape)
    return None


def _dtype(value):
    if isinstance(value, (np.generic,)):
        return str(value.dtype)
    try:
        dtype = getattr(value, "dtype", None)
    except Exception:  # noqa: BLE001
        return None
    if dtype is None or not isinstance(dtype, (np.dtype, type)) and type(dtype).__module__.split(".")[0] not in (
            "torch", "numpy", "jax", "jaxlib", "tensorflow", "pandas", "ml_dtypes"):
        return None
    return str(dtype).replace("torch.", "")


class _Repr(reprlib.Repr):
    def repr_instance(self, value, level):
        try:
            return repr(value)
        except Exception as exc:  # noqa: BLE001 - a user type's __repr__ may raise
            return f"<{type(value).__name__}: repr() raised {type(exc).__name__}>"


_repr = _Repr()
_repr.maxstring = _repr.maxother = SUMMARY
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = _repr.maxfrozenset = 6


def _summary(value):
    if isinstance(value, (bytes, bytearray)) and len(value) > SUMMARY:
        return _clip(f"{len(value):,} bytes: {value[:SUMMARY]!r}")
    try:
        text = _repr.repr(value)
    except Exception as exc:  # noqa: BLE001 - a user type's __repr__ may raise
        return f"<{type(value).__name__}: repr() raised {type(exc).__name__}>"
    if isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > 6:
        text = f"{len(value):,} items: {text}"
    return _clip(" ".join(text.split()))


def _signature(value):
    if isinstance(value, type):
        return _clip(f"class {value.__qualname__}")
    try:
        import inspect

        return _clip(f"def {value.__name__}{inspect.signature(value)}")
    except (TypeError, ValueError, AttributeError):
        return _clip(f"def {getattr(value, '__name__', type(value).__name__)}(…)")


def _clip(text, width=SUMMARY):
    return text if len(text) <= width else text[: width - 1] + "…"


def _size(nbytes):
    for unit, scale in (("GB", 1 << 30), ("MB", MB), ("kB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} bytes"
