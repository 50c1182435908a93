"""Any other value for ``%mpi who``: its words from its ``shape``, ``dtype`` and a short ``repr``, a function or
class by its signature, and a digest through its pickle, cut off after a limit, with arrays, tensors, models,
communicators, long strings and sets inside hashed their own way."""

import inspect
import pickle
import reprlib
import sys

import numpy as np

from .arrays import feed_array
from .comms import describe_comm, is_comm
from .digests import hasher, short
from .tensors import feed_tensor, module_digest
from .text import MB, SUMMARY, clip, size_text

SET_MEMBERS = 100_000  # members of a set hashed at most (they are sorted first)


def describe_object(value, entry, budget):
    """*entry* for *value*: its shape and dtype when it has them, a short ``repr``, and its pickle's digest."""
    entry["shape"], entry["dtype"], entry["summary"] = shape_of(value), dtype_of(value), summary_of(value)
    hash_object(value, entry, budget)


def describe_callable(value, entry):
    """*entry* for a function or class: its signature, no digest."""
    entry["summary"] = signature_of(value)


# ---------------------------------------------------------------- words


def shape_of(value):
    try:
        shape = getattr(value, "shape", None)
    except Exception:  # noqa: BLE001 - a property of a user object may raise
        return None
    if isinstance(shape, tuple) and all(isinstance(n, (int, np.integer)) for n in shape):
        return tuple(int(n) for n in shape)
    return None


def dtype_of(value):
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


def summary_of(value):
    if isinstance(value, (bytes, bytearray)) and len(value) > SUMMARY:
        return clip(f"{len(value):,} bytes: {value[:SUMMARY]!r}")
    try:
        text = _repr.repr(value)
    except Exception as exc:  # noqa: BLE001 - a user type's __repr__ may raise
        return f"<{type(value).__name__}: repr() raised {type(exc).__name__}>"
    if isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > 6:
        text = f"{len(value):,} items: {text}"
    return clip(" ".join(text.split()))


def signature_of(value):
    if isinstance(value, type):
        return clip(f"class {value.__qualname__}")
    try:
        return clip(f"def {value.__name__}{inspect.signature(value)}")
    except (TypeError, ValueError, AttributeError):
        return clip(f"def {getattr(value, '__name__', type(value).__name__)}(…)")


# ---------------------------------------------------------------- the digest, through pickle


def hash_object(value, entry, budget):
    """Hash *value* through pickle, cut off after *budget.pickle_limit* bytes."""
    digest = hasher(entry["type"], entry["shape"], entry["dtype"])
    pickler = _Pickler(digest, budget)
    try:
        pickler.dump(value)
    except _Stop:
        entry["hash"] = short(digest)
        entry["note"] = f"first {size_text(budget.pickle_limit)} pickled"
        return
    except _Unhashable as exc:
        entry["note"] = str(exc)
        return
    except Exception as exc:  # noqa: BLE001 - unpicklable objects raise TypeError, PicklingError, anything else
        entry["note"] = f"not hashed: cannot be pickled ({type(exc).__name__})"
        return
    entry["hash"], entry["note"] = short(digest), budget.cut_note()


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


_PLAIN = frozenset({int, float, complex, bool, type(None), tuple, list, dict})


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
            digest = hasher(obj.shape, str(obj.dtype))
            feed_array(digest, obj, self.budget)
            return "ndarray:" + digest.hexdigest()
        if torch is not None and isinstance(obj, torch.Tensor):
            digest = hasher(tuple(obj.shape), str(obj.dtype))
            why = feed_tensor(digest, obj, self.budget)
            if why:
                raise _Unhashable(why)
            return "tensor:" + digest.hexdigest()
        if torch is not None and isinstance(obj, torch.nn.Module):
            digest, why = module_digest(obj, self.budget)
            if why:
                raise _Unhashable(why)
            return "module:" + digest.hexdigest()
        if isinstance(obj, (bytes, bytearray)):
            digest = hasher(type(obj).__name__, len(obj))
            digest.update(memoryview(obj)[: self.budget.take(len(obj))])
            return f"{type(obj).__name__}:{digest.hexdigest()}"
        if isinstance(obj, str):  # a long one, encoded a MB at a time until the budget is spent
            digest = hasher("str", len(obj))
            for start in range(0, len(obj), MB):
                chunk = obj[start:start + MB].encode("utf-8", "surrogatepass")
                taken = self.budget.take(len(chunk))
                digest.update(chunk[:taken])
                if taken < len(chunk):
                    break
            return f"str:{digest.hexdigest()}"
        if isinstance(obj, (set, frozenset)):
            return type(obj).__name__, self._members(obj)
        if is_comm(obj):
            entry = {"type": type(obj).__name__}
            describe_comm(obj, entry)
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
            digest = hasher()
            _Pickler(digest, self.budget).dump(member)
            digests.append(digest.hexdigest())
        return tuple(sorted(digests))
