"""One pass over every rank's copy of a large floating-point leaf, in the notebook: each rank's statistics and its
largest difference to the first rank's, from the gathered values themselves (views of the ranks' shared memory).

The inspector needs both, and both read every value: computed apart (statistics on the ranks, the comparison
here) the 4 × 32 MB of a gather were read twice and the ranks' four reductions once each. Here a block of each rank
is read once, while it is in the cache, for min, max, sum, sum of squares and the difference to the first rank's
block; the blocks are shared out to one thread per core (numpy lets go of the GIL on blocks this large). A rank's
block that holds the first rank's values (replicas in sync, the common case) is read once, for the difference,
and takes the first rank's sums: 3 numpy passes over it instead of 7.
"""

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

BLOCK = 1 << 18  # elements per block (1 MB of float32): every rank's block and the difference stay in the cache
_threads = None


def scan(arrays):
    """``{rank: (sums, difference)}`` for *arrays* (rank → array, the first rank's the reference), or None when
    some rank's values are not all finite (the caller then takes the exact, slower path).

    ``sums`` is ``{"min", "max", "mean", "norm"}``; ``difference`` is ``max |array - first|`` (0.0 for the first).
    The arrays must share shape, dtype and memory order.
    """
    ranks = sorted(arrays)
    flat = [arrays[rank].ravel(order="K") for rank in ranks]  # a view for C and Fortran order alike
    size = flat[0].size
    workers = min(os.cpu_count() or 1, -(-size // BLOCK))
    step = -(-(-(-size // BLOCK)) // workers) * BLOCK  # whole blocks per worker
    parts = [_pool().submit(_scan_range, flat, start, min(size, start + step)) for start in range(0, size, step)]
    parts = [part.result() for part in parts]
    if any(part is None for part in parts):
        return None
    if not all(math.isfinite(part[i][k]) for part in parts for i in range(len(ranks)) for k in (2, 3)):
        return None  # sums past float32's range (values past 1e19): the exact path sums in float64
    out = {}
    for i, rank in enumerate(ranks):
        low = min(part[i][0] for part in parts)
        high = max(part[i][1] for part in parts)
        total = math.fsum(part[i][2] for part in parts)
        squares = math.fsum(part[i][3] for part in parts)
        difference = max(part[i][4] for part in parts)
        out[rank] = ({"min": low, "max": high, "mean": total / size, "norm": math.sqrt(squares)}, difference)
    return out


def _scan_range(flat, start, stop):
    """Per array: ``[min, max, sum, sum of squares, max |x - flat[0]|]`` over ``[start, stop)``; None when a
    value there is not finite."""
    acc = [[math.inf, -math.inf, 0.0, 0.0, 0.0] for _ in flat]
    work = np.empty(min(BLOCK, stop - start), dtype=flat[0].dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is found in the sums (scan), not said
        return _scan_blocks(flat, start, stop, acc, work)


def _scan_blocks(flat, start, stop, acc, work):
    for begin in range(start, stop, BLOCK):
        end = min(stop, begin + BLOCK)
        reference = flat[0][begin:end]
        scratch = work[:end - begin]
        first = None  # the reference block's [min, max, sum, sum of squares]
        for i, array in enumerate(flat):
            block = array[begin:end]
            row = acc[i]
            if i:
                np.subtract(block, reference, out=scratch)
                above, below = float(scratch.max()), -float(scratch.min())
                if above == 0.0 and below == 0.0:  # the same values as the reference's (replicas in sync, the
                    # common case): its sums are this block's, without 4 more passes over it
                    row[0], row[1] = min(row[0], first[0]), max(row[1], first[1])
                    row[2] += first[2]
                    row[3] += first[3]
                    continue
                row[4] = max(row[4], above, below)  # NaN when a value is not finite: then the checks below fail
            low, high = float(block.min()), float(block.max())
            if not (math.isfinite(low) and math.isfinite(high)):  # a NaN makes both NaN, an Inf one of them
                return None
            sums = [low, high, float(block.sum()), float(np.dot(block, block))]
            first = first or sums
            row[0], row[1] = min(row[0], low), max(row[1], high)
            row[2] += sums[2]
            row[3] += sums[3]
    return acc


def _pool():
    global _threads
    if _threads is None:
        _threads = ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="mpinb-scan")
    return _threads
