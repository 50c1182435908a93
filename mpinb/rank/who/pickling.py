"""Hashing any other value for ``%mpi who``: through its pickle, cut off after a limit, with arrays, tensors,
models, long strings and sets inside hashed their own way."""

import pickle
import sys

import numpy as np

from .hashing import (
    describe_comm,
    feed_array,
    feed_tensor,
    hasher,
    is_comm,
    module_digest,
    short,
)
from .text import MB, size_text


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


_PLAIN = frozenset({int, float, complex, bool, type(None), tuple, list, dict})
SET_MEMBERS = 100_000  # members of a set hashed at most (they are sorted first)
