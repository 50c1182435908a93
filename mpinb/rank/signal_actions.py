"""What a signal's handler is now, as the C library sees it: ``signal.getsignal`` cannot see handlers set in C
(faulthandler's), so whether user code took those away can only be read with ``sigaction``."""

import ctypes
import ctypes.util
import sys

_BUFFER = 512  # larger than any platform's struct sigaction
_libc = None


def _sigaction():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        _libc.sigaction.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    return _libc.sigaction


def handler(signum):
    """The address of *signum*'s handler (0 for the default action, 1 for ignored), or ``None`` where it cannot
    be read (not Linux, or a libc whose ``struct sigaction`` does not begin with the handler)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        action = ctypes.create_string_buffer(_BUFFER)
        if _sigaction()(signum, None, action) != 0:
            return None
        return ctypes.c_size_t.from_buffer(action).value
    except (OSError, AttributeError):
        return None
