"""What a rank writes below Python, to its file descriptors 1 and 2 (C extensions, subprocesses, the MPI library,
torch's C++ warnings, gloo's and NCCL's logs), sent to the notebook as the rank's output, as its prints are.

Both descriptors point at files of the rank's (``stacks.keep_native_output``): a file keeps every byte at once,
also what a rank wrote just before it died, which the notebook reads from it then. This forwarder reads what is
new in them, every :data:`INTERVAL` seconds on a thread of its own, before each write of the rank's Python
output (so a line C wrote before a ``print`` comes before it), and at the end of each cell after flushing C's
``stdio`` buffers (so a cell's output is all there when its reply comes).
"""

import codecs
import ctypes
import os
import threading

INTERVAL = 0.05  # s between reads while nothing else asks for one
CHUNK = 1 << 20  # bytes read at most at once

_libc = ctypes.CDLL(None)


class NativeOutput:
    """Forward what is written to the files *paths* (``{"stdout": path, "stderr": path}``) from now on to
    ``emit(name, text)``, text decoded as UTF-8 (what is not shown as U+FFFD)."""

    def __init__(self, paths, emit):
        self.emit = emit
        self.lock = threading.Lock()
        self.files = {}
        for name, path in paths.items():
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            self.files[name] = [fd, os.fstat(fd).st_size, codecs.getincrementaldecoder("utf-8")(errors="replace")]
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._run, name="mpinb-native-output", daemon=True)
        self.thread.start()

    def drain(self, *, flush=False):
        """Forward what was written since the last call (after C's buffered output, with *flush*)."""
        if flush:
            _libc.fflush(None)
        with self.lock:
            for name, entry in self.files.items():
                fd, offset, decoder = entry
                try:
                    size = os.fstat(fd).st_size
                    while size > offset:
                        data = os.pread(fd, min(size - offset, CHUNK), offset)
                        if not data:
                            break
                        offset += len(data)
                        entry[1] = offset
                        text = decoder.decode(data)
                        if text:
                            self.emit(name, text)
                except OSError:  # closed under us: the rank is ending
                    return

    def _run(self):
        while not self.closed.wait(INTERVAL):
            self.drain()

    def close(self):
        self.closed.set()
        self.thread.join(timeout=1)
        self.drain(flush=True)
        with self.lock:
            for fd, _, _ in self.files.values():
                os.close(fd)
            self.files = {}
