"""Shared-memory segments: how a rank on the notebook's host hands gathered bytes over with one copy, its own.

A rank writes a gather's buffers into a segment, a file in ``/dev/shm`` mapped with its pages already
allocated. The notebook maps the same file copy-on-write and rebuilds the values on it: the arrays and tensors
it gives the user *are* views of the segment (writable; what the user writes stays in the notebook). A segment
is lent to the notebook until every value on it is dropped; the notebook then says so with the next cell and
the rank may write a later gather there. Until then later gathers go to other segments, so a value never
changes behind the user's back. The rank keeps a few free segments warm (fresh shared pages cost more to touch
than to copy into) and drops the rest, telling the notebook, which closes its handle so their memory goes back.

The notebook unlinks a segment's name as soon as it has it open, so nothing is left in ``/dev/shm`` whatever
happens to either side later.
"""

import collections
import itertools
import mmap
import os
import secrets
import tempfile
import weakref
from pathlib import Path

import numpy as np

ALIGN = 64
GROWTH = 1.25
PAGE = 2 << 20
KEEP_FREE = 2  # free segments a rank keeps for later gathers


def shm_dir():
    """``/dev/shm`` where it exists and is writable, else the temporary directory (still one copy)."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def layout(sizes):
    """Offsets (aligned to 64 bytes) of buffers of *sizes* laid end to end, and the total size."""
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // ALIGN) * ALIGN
    return offsets, end


class Segment:
    """The rank's end of one shared file it writes gathered buffers into."""

    def __init__(self, directory=None):
        self.path = os.path.join(directory or shm_dir(), f"mpinb-{os.getpid()}-{secrets.token_hex(6)}")
        self.fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        self.size, self.map = 0, None

    def write(self, buffers):
        """Copy *buffers* in; return their offsets. ``OSError`` (no space) leaves the segment as it was."""
        offsets, total = layout([b.nbytes for b in buffers])
        if total == 0:  # empty arrays only: nothing to map (mmap refuses a length of 0)
            return offsets
        if total > self.size:
            self._grow(total)
        target = np.frombuffer(self.map, dtype=np.uint8)
        for buffer, offset in zip(buffers, offsets):
            target[offset:offset + buffer.nbytes] = np.frombuffer(buffer, dtype=np.uint8)
        return offsets

    def _grow(self, needed):
        size = -(-max(needed, int(self.size * GROWTH)) // PAGE) * PAGE
        os.posix_fallocate(self.fd, 0, size)  # ENOSPC here, not SIGBUS on a later write
        if self.map is not None:
            self.map.close()
        self.map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        self.size = size

    def close(self):
        if self.map is not None:
            self.map.close()
            self.map = None
        os.close(self.fd)
        Path(self.path).unlink(missing_ok=True)  # the notebook has usually unlinked it already


class Pool:
    """A rank's segments: those lent to the notebook (by lease number) and those free for the next gather."""

    def __init__(self, directory=None):
        self.directory = directory
        self.free, self.lent = [], {}
        self.dropped = []  # paths of segments closed since the last gather, for the notebook to let go of
        self._leases = itertools.count(1)

    def write(self, buffers):
        """Write *buffers* into a free segment (or a new one) and lend it: ``(lease, path, offsets)``."""
        total = layout([b.nbytes for b in buffers])[1]
        fitting = [segment for segment in self.free if segment.size >= total]
        segment = min(fitting, key=lambda s: s.size) if fitting else \
            max(self.free, key=lambda s: s.size, default=None)  # the largest grows least
        if segment is None:
            segment = Segment(self.directory)
        else:
            self.free.remove(segment)
        try:
            offsets = segment.write(buffers)
        except OSError:
            self._drop(segment)
            raise
        lease = next(self._leases)
        self.lent[lease] = segment
        return lease, segment.path, offsets

    def release(self, leases):
        """The notebook let go of the values on these leases' segments: free them, keeping ``KEEP_FREE``."""
        for lease in leases:
            segment = self.lent.pop(lease, None)
            if segment is not None:
                self.free.append(segment)
        self.free.sort(key=lambda s: s.size, reverse=True)
        while len(self.free) > KEEP_FREE:
            self._drop(self.free.pop())

    def take_dropped(self):
        dropped, self.dropped = self.dropped, []
        return dropped

    def _drop(self, segment):
        segment.close()
        self.dropped.append(segment.path)

    def close(self):
        for segment in [*self.free, *self.lent.values()]:
            segment.close()
        self.free, self.lent = [], {}


class Segments:
    """The notebook's end of one world's segments: a handle on each (its name unlinked at once), and the values
    rebuilt on them; ``released`` collects ``(rank, lease)`` of segments whose values were all dropped."""

    def __init__(self):
        self.files = {}  # (rank, path) -> fd
        self.released = collections.deque()

    def views(self, rank, path, lease, offsets, sizes):
        """Writable (copy-on-write) byte arrays on the segment at *path*, one per buffer. When the last array
        on this mapping (or anything built on one) is dropped, ``(rank, lease)`` joins ``released``."""
        fd = self.files.get((rank, path))
        if fd is None:
            fd = self.files[(rank, path)] = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            Path(path).unlink(missing_ok=True)
        size = os.fstat(fd).st_size
        if size == 0 or not sizes:
            self.released.append((rank, lease))
            return [np.empty(0, dtype=np.uint8) for _ in sizes]
        mapped = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        whole = np.frombuffer(mapped, dtype=np.uint8)
        del mapped  # the array keeps the mapping; it is unmapped when the array goes
        weakref.finalize(whole, self.released.append, (rank, lease))
        return [whole[offset:offset + n] for offset, n in zip(offsets, sizes)]

    def take_released(self):
        """``{rank: [lease, ...]}`` released since the last call."""
        by_rank = {}
        while self.released:
            rank, lease = self.released.popleft()
            by_rank.setdefault(rank, []).append(lease)
        return by_rank

    def forget(self, rank, paths):
        """The rank closed the segments at *paths*: close the handles that kept their memory."""
        for path in paths:
            fd = self.files.pop((rank, path), None)
            if fd is not None:
                os.close(fd)

    def close(self):
        for fd in self.files.values():
            os.close(fd)
        self.files.clear()
