"""What notebook and ranks agree on about gathered values: the records a rank sends them in (one per transport),
and which leaves a rank leaves undescribed (the rank skips their statistics and the notebook computes them in its
one pass over every rank's copy, ``notebook/models/scan.py``)."""

from dataclasses import dataclass

import numpy as np

SCAN_BYTES = 4 << 20  # leaves this large (float32, float64) are described in the notebook, not on the ranks
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def scannable(array):
    """Whether the notebook's scan takes *array*: float32 or float64, contiguous, at least :data:`SCAN_BYTES`."""
    return (isinstance(array, np.ndarray) and array.dtype in FLOATS and array.nbytes >= SCAN_BYTES
            and (array.flags.c_contiguous or array.flags.f_contiguous))


# What a rank sends back for a GatherRequest: each name's value packed (or why not), and the payload that carries
# them, one type per transport. The values' raw buffers travel as the reply's frames or in a shared-memory segment.

@dataclass(frozen=True)
class Packed:
    """One name's value: its pickle (protocol 5), the byte sizes of its out-of-band buffers in order, and the
    statistics of its leaves (``None`` when not asked)."""

    pickle: bytes
    sizes: tuple
    stats: dict | None


@dataclass(frozen=True)
class Unsent:
    """A name whose value could not be packed, and why (the message names it)."""

    error: str


@dataclass(frozen=True)
class InFrames:
    """The rank's values (``{name: Packed | Unsent}``), their buffers as the reply's frames; *dropped*: leases
    of segments the rank took back; *note*: why shared memory was not used when it was asked for."""

    items: dict
    dropped: tuple = ()
    note: str | None = None


@dataclass(frozen=True)
class InSegment:
    """The rank's values, their buffers in its shared-memory segment *path* under *lease*, at *offsets*."""

    items: dict
    path: str
    lease: int
    offsets: tuple
    dropped: tuple = ()


@dataclass(frozen=True)
class AllRanks:
    """Sent by the root of an MPI gather: every rank's values (``{rank: items}``), their buffers as the reply's
    frames in rank order."""

    by_rank: dict


@dataclass(frozen=True)
class ViaRoot:
    """This rank's values went to rank *root* by an MPI gather: *root*'s reply carries them."""

    root: int
