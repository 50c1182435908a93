"""``%%mpi --gather``, notebook side: rebuild every rank's values from shared memory or frames; say what is missing."""

import pickle

from ...wire.gathered import AllRanks, InFrames, InSegment, Packed, Unsent, ViaRoot
from ...wire.ranks import format_ranks, label_ranks


def unpack(segments, rank, gathered, buffers):
    """``{rank: {name: ("value", value, stats) | ("error", message, None)}}`` from one rank's reply (one of
    ``wire/gathered.py``'s payloads), rebuilt on the channel's *segments* (``shm.py``) where they came through
    them: its own values, those of every rank when it gathered them over MPI, none when another rank did. Values
    gathered through a segment are views of it, and the segment stays lent until they are dropped."""
    if isinstance(gathered, ViaRoot):
        return {}
    if isinstance(gathered, AllRanks):
        out, position = {}, 0
        for owner, items in gathered.by_rank.items():
            count = sum(len(item.sizes) for item in items.values() if isinstance(item, Packed))
            out[owner] = _unpack_items(segments, owner, InFrames(items), buffers[position:position + count])
            position += count
        return out
    return {rank: _unpack_items(segments, rank, gathered, buffers)}


def _unpack_items(segments, rank, gathered, buffers):
    items = gathered.items
    sizes = [size for item in items.values() if isinstance(item, Packed) for size in item.sizes]
    segments.forget(rank, gathered.dropped)
    if isinstance(gathered, InSegment):
        buffers = segments.views(rank, gathered.path, gathered.lease, gathered.offsets, sizes)
    elif buffers:
        # zmq's frames are zmq's memory: copied into arrays the values can own; a message opened from sealed
        # chunks (wire/bulk.py) is already in arrays of its own, which the values keep as they are
        import numpy as np

        buffers = [buffer if isinstance(buffer, np.ndarray) else np.frombuffer(buffer, dtype=np.uint8).copy()
                   for buffer in buffers]
    out, position = {}, 0
    for name, item in items.items():
        if isinstance(item, Unsent):
            out[name] = ("error", item.error, None)
            continue
        own = buffers[position:position + len(item.sizes)]
        position += len(item.sizes)
        try:
            out[name] = ("value", pickle.loads(item.pickle, buffers=own), item.stats)
        except Exception as exc:  # noqa: BLE001 - e.g. a module the rank has and the notebook lacks
            out[name] = ("error", f"{name}: arrived but cannot be rebuilt in the notebook "
                                  f"({type(exc).__name__}: {exc})", None)
    return out


def missing_message(name, errors, have):
    """One line per kind of failure, naming ranks, and where the values that did arrive are."""
    by_message = {}
    for rank, message in sorted(errors.items()):
        by_message.setdefault(message, []).append(rank)
    lines = [f"{label_ranks(ranks)}: {message}" for message, ranks in by_message.items()]
    if have:
        lines.append(f"{name} holds the values of ranks {format_ranks(sorted(have))}")
    return f"--gather {name}: " + "\n".join(lines)
