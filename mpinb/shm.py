"""Shared-memory arenas: how a rank on the notebook's host hands gathered bytes over with one copy on each side.

Each rank keeps one arena, a file in ``/dev/shm`` mapped with its pages already allocated, grown when a gather
needs more and reused afterwards (allocating fresh shared pages costs more than copying into them). The rank
copies its buffers in; the notebook copies them out into ordinary (numpy) memory before the next cell can
reuse the arena. The notebook unlinks the file's name as soon as it has it open, so nothing is left in
``/dev/shm`` whatever happens to either side later.
"""

import mmap
import os
import secrets
import tempfile

import numpy as np

ALIGN = 64
GROWTH = 1.25
PAGE = 2 << 20


def shm_dir():
    """``/dev/shm`` where it exists and is writable, else the temporary directory (still one copy each side)."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def layout(sizes):
    """Offsets (aligned to 64 bytes) of buffers of *sizes* laid end to end, and the total size."""
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // ALIGN) * ALIGN
    return offsets, end


class Arena:
    """The rank's end: a shared file it writes gathered buffers into."""

    def __init__(self, directory=None):
        self.path = os.path.join(directory or shm_dir(), f"mpinb-{os.getpid()}-{secrets.token_hex(6)}")
        self.fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        self.size, self.map = 0, None

    def write(self, buffers):
        """Copy *buffers* in; return their offsets. ``OSError`` (no space) leaves the arena as it was."""
        offsets, total = layout([b.nbytes for b in buffers])
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
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass  # the notebook already unlinked it


PARALLEL_COPY = 8 << 20  # bytes from which a copy is split across threads (numpy releases the GIL)
_pool = None


def _copy(source):
    """A fresh copy of a byte array; big ones copied by several threads (1.5× on 2 cores, measured)."""
    global _pool
    workers = min(4, os.cpu_count() or 1)
    if source.nbytes < PARALLEL_COPY or workers == 1:
        return source.copy()
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(workers, thread_name_prefix="mpinb-copy")
    target = np.empty_like(source)
    step = -(-source.nbytes // workers)
    parts = [slice(start, start + step) for start in range(0, source.nbytes, step)]
    for done in [_pool.submit(np.copyto, target[part], source[part]) for part in parts]:
        done.result()
    return target


class ArenaReader:
    """The notebook's end of one rank's arena."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDONLY)
        os.unlink(path)

    def read(self, offsets, sizes):
        """Copies of the buffers at *offsets* as fresh, writable numpy byte arrays.

        The arena is mapped only while it is read: a mapping kept between gathers held the notebook's share of
        every arena's pages besides the copies (a 1 GiB gather from 2 ranks grew the kernel by 4 GB, not 2).
        """
        size = os.fstat(self.fd).st_size
        if size == 0:
            return [np.empty(0, dtype=np.uint8) for _ in sizes]
        mapped = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                           prot=mmap.PROT_READ)
        try:
            source = np.frombuffer(mapped, dtype=np.uint8)
            copies = [_copy(source[offset:offset + n]) for offset, n in zip(offsets, sizes)]
            del source
        finally:
            mapped.close()
        return copies

    def close(self):
        os.close(self.fd)
