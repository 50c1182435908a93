"""A numpy array for ``%mpi who``: its shape and dtype, its first values in words, and a digest of its bytes in C
order (a prefix copied when it is not contiguous). An array of objects holds pointers: its digest is the
objects' pickle (``objects.py``), which the describer adds."""

import numpy as np

from .digests import hasher, short
from .text import clip


def describe_array(array, entry, budget):
    """*entry* for *array*: shape, dtype, its first values, and its digest unless it holds objects."""
    entry["shape"], entry["dtype"] = tuple(array.shape), str(array.dtype)
    entry["summary"] = clip(values_text(first_elements(array, 6), array.size > 6, array.ndim))
    if array.dtype.hasobject:
        return
    digest = hasher(entry["type"], entry["shape"], entry["dtype"])
    feed_array(digest, array, budget)
    entry["hash"], entry["note"] = short(digest), budget.cut_note()
    if entry["note"] == "not hashed: who's total spent":
        entry["hash"] = None


def feed_array(digest, array, budget):
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


def first_elements(array, count):
    """The first *count* elements of *array* in C order, flat, without touching the rest."""
    if array.size == 0:
        return array.reshape(-1)
    while array.ndim > 1 and array[0].size >= count:
        array = array[0]
    if array.ndim > 1:
        array = array[: -(-count // array[0].size)]
    return array.reshape(-1)[:count]


def values_text(flat, more, ndim=1):
    """*flat*'s values as numpy prints them, `` …]`` when there are *more* (a tensor's too, copied to numpy)."""
    if ndim == 0:
        return str(flat[0])
    with np.printoptions(precision=4, threshold=100, linewidth=10_000):
        text = np.array2string(np.asarray(flat), separator=" ")
    return text[:-1] + " …]" if more else text
