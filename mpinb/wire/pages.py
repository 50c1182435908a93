"""New memory for large values the notebook keeps, faulted in 2 MB at a time instead of 4 KB.

A value received into new memory pays a page fault for each 4 KB page it is written into: on the 2-core test VM
about 2.2 us a page, so 18 ms of every 32 MB, more than the link took to carry them. Linux backs anonymous memory
with 2 MB pages where it is asked to (``MADV_HUGEPAGE``; transparent huge pages in their common ``madvise`` mode)
and where a whole 2 MB of it lies on a 2 MB boundary. numpy asks for large arrays, but ``malloc`` places them on no
such boundary: writing 32 MB into ``np.empty`` took 21.3 ms here, into memory from :func:`empty` 5.1 ms, into
memory written before 2.7 ms. Where huge pages are off, :func:`empty` is ordinary new memory.
"""

import mmap

import numpy as np

HUGE = 1 << 21  # bytes of a huge page on x86-64 and arm64 (with 4 KB base pages)
LARGE = 4 << 20  # arrays of at least this many bytes come from here; smaller ones are np.empty's


def empty(nbytes):
    """A new, writable ``uint8`` array of *nbytes*, not zero-filled by the caller's time: large ones on their own
    2 MB-aligned mapping advised to use huge pages. The mapping is unmapped when the last view of it goes."""
    if nbytes < LARGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.empty(nbytes, dtype=np.uint8)
    region = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(region, dtype=np.uint8)
    offset = -whole.ctypes.data % HUGE
    # only the whole 2 MB pages: the tail stays in 4 KB pages, so a value never holds up to 2 MB it does not use
    try:
        region.madvise(mmap.MADV_HUGEPAGE, offset, nbytes // HUGE * HUGE)
    except OSError:  # a kernel without transparent huge pages: small pages, as np.empty's
        pass
    return whole[offset:offset + nbytes]


def copy(buffer):
    """A copy of *buffer* (any object with the buffer protocol) in memory of its own, from :func:`empty`."""
    source = np.frombuffer(buffer, dtype=np.uint8)
    target = empty(source.nbytes)
    np.copyto(target, source)
    return target
