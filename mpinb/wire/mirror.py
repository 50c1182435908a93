"""The collective a rank's main thread waits in, mirrored in a small file: written by the rank's ledger
(``rank/tracing/ledger.py``) as it enters and leaves each collective, read by the notebook
(``notebook/diagnosis/mismatch.py``) when the rank cannot answer a roll call (a pickle-based collective holds the GIL while
it waits) or has died (MPI ended the job over a count or type mismatch)."""

import struct
from dataclasses import dataclass

# whether the rank is in a collective (0 no, 1 yes, 2 it raised there), seq, root, count (-1: none), start, then
# operation, type and communicator names. The first field (0) is kept for a version, should the record change.
MIRROR = struct.Struct("<qqqqqq24s16s48s")
LEFT, RAISED = (0).to_bytes(8, "little"), (2).to_bytes(8, "little")  # the second field, once the wait is over
_ENCODED = {}


def encode(text):
    """*text* (an operation or type name) as the record holds it; kept, since the same few recur."""
    if text is None:
        return b""
    encoded = _ENCODED.get(text)
    if encoded is None:
        encoded = _ENCODED[text] = str(text).encode()[:24]
    return encoded


@dataclass(frozen=True)
class Mirrored:
    """What a mirror file says: collective *seq* on *comm* with *signature* ``(op, root, count, dtype)``, entered
    at *start_ns* (``time.perf_counter_ns``); *raised*: the rank left it by an exception (its last words)."""

    comm: str
    seq: int
    signature: tuple
    start_ns: int
    raised: bool


def read_mirror(path):
    """:class:`Mirrored`: the collective the rank of mirror file *path* is in, or the last one that raised there
    (its last words, if MPI then ended the job); or ``None``."""
    try:
        with open(path, "rb") as file:
            data = file.read(MIRROR.size)
        version, active, seq, root, count, start, op, dtype, comm = MIRROR.unpack(data)
    except (OSError, struct.error):
        return None
    if version != 0 or not active:
        return None
    text = [value.rstrip(b"\0").decode(errors="replace") for value in (op, dtype, comm)]
    return Mirrored(text[2], seq, (text[0], None if root < 0 else root, None if count < 0 else count, text[1] or None),
                    start, active == 2)
