"""The Stop button (SIGINT) while mpinb itself works: counted and acted on at safe points, instead of a
``KeyboardInterrupt`` raised wherever it lands (half-way through stopping a world, inside ipyparallel's start).

Outside mpinb's own work a Stop raises ``KeyboardInterrupt`` as usual. Inside :func:`deferred` it is only
counted; the code that deferred it looks at :func:`presses` where it is safe to act (a start rolls back, a cell
escalates), and :func:`raising` re-opens a block where raising is safe (a prompt waiting for the user).
Signal handlers can only be set in the main thread; elsewhere nothing is deferred."""

import contextlib
import signal
import threading

_RAISE, _DEFER = "raise", "defer"


class _Watch:
    """The SIGINT handler mpinb installs for the outermost deferred block."""

    def __init__(self):
        self.presses = 0
        self.modes = []

    def handler(self, signum, frame):
        self.presses += 1
        if self.modes and self.modes[-1] == _RAISE:
            raise KeyboardInterrupt


_watch = None


def presses():
    """How many times Stop was pressed since the outermost deferred block began (0 outside one)."""
    return _watch.presses if _watch is not None else 0


def active():
    """Whether Stops are being deferred right now."""
    return _watch is not None and bool(_watch.modes) and _watch.modes[-1] == _DEFER


@contextlib.contextmanager
def _mode(mode):
    global _watch
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outermost = _watch is None
    if outermost:
        if mode == _RAISE:  # nothing deferred around it: the default handler raises already
            yield
            return
        _watch = _Watch()
        try:
            previous = signal.signal(signal.SIGINT, _watch.handler)
        except (ValueError, OSError):  # no signals here (an embedded interpreter)
            _watch = None
            yield
            return
    _watch.modes.append(mode)
    try:
        yield
    finally:
        _watch.modes.pop()
        if outermost:  # a handler set from C reads as None, and cannot be set back: Python's default then
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
            _watch = None


def deferred():
    """A block in which Stop is counted (:func:`presses`), not raised."""
    return _mode(_DEFER)


def raising():
    """Inside a deferred block, a block in which Stop raises ``KeyboardInterrupt`` again (a wait that is safe to cut,
    such as a prompt)."""
    return _mode(_RAISE)
