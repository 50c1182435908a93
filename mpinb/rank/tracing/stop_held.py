"""Stop (SIGINT) held on the main thread while a DDP step's backward reduces its gradients, and raised once it is
over: raised in between (in any Python the backward runs: a gradient hook, the process group's own code), it would
leave this rank out of the buckets the other ranks reduce, and they would wait in MPI for ever."""

import _signal
import signal
import threading


class Hold:
    """SIGINT held from now on, until :meth:`release`, which raises it then (through the handler it replaced).
    Made on the main thread only (``Hold.here()``), where Python runs signal handlers."""

    __slots__ = ("previous", "held", "released", "handler")

    def __init__(self):
        self.held = None
        self.released = False
        self.handler = self._handle  # one object, to tell whether it is still the one installed
        self.previous = _signal.signal(signal.SIGINT, self.handler)

    @classmethod
    def here(cls):
        """A hold, on the main thread; ``None`` on another (a backward on a GPU runs on torch's device threads)."""
        return cls() if threading.current_thread() is threading.main_thread() else None

    def _handle(self, number, frame):
        if self.released:  # handed on after the release (a process group's own hold, raised late): raise it now
            self._raise(frame)
        elif self.held is None:
            self.held = frame

    def release(self):
        """Put the replaced handler back and raise a Stop held meanwhile; a handler installed over this one since
        (a new cell's) is left as it is, and a Stop held for an earlier cell dropped."""
        if self.released:
            return
        self.released = True
        if _signal.getsignal(signal.SIGINT) is not self.handler:
            return
        _signal.signal(signal.SIGINT, self.previous)
        if self.held is not None:
            self._raise(self.held)

    def _raise(self, frame):
        if callable(self.previous):
            self.previous(signal.SIGINT, frame)
