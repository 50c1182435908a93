"""The ids a rank's visual debugger hands out (threads, frames, variable references), in a range of their own.

The kernel's own debugger (debugpy) numbers its threads, frames and variables from 1; a rank's ids start at
:data:`OFFSET` and carry the rank, so that the kernel routes each request by the id it names and the panel
never mistakes a rank's frame for one of the kernel's. Ids stay below 2**53 (JavaScript's exact integers)."""

OFFSET = 1 << 40
_BITS = 20  # ids a rank hands out per stop, at most


def thread_id(rank):
    """The panel's thread for *rank* (each rank is one thread of the debugged program)."""
    return OFFSET + (rank << _BITS)


def encode(rank, local):
    """A rank's *local* id (1, 2, ...), as the panel sees it."""
    if not 0 < local < 1 << _BITS:
        raise ValueError(f"a rank's debugger id must be in 1..{(1 << _BITS) - 1}, not {local}")
    return OFFSET + (rank << _BITS) + local


def rank_of(value):
    """The rank an id belongs to, or ``None`` for an id of the kernel's own debugger (or no id)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < OFFSET:
        return None
    return (value - OFFSET) >> _BITS


def local(value):
    return (value - OFFSET) & ((1 << _BITS) - 1)
