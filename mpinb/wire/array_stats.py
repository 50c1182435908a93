"""One array's statistics as the tensor inspector shows them (shape, dtype, device, norm, min, max, mean, NaN and
Inf counts, a histogram), computed alike on the ranks, in parallel, and in the notebook for the large float arrays
it reads anyway (``notebook/models/scan.py``)."""

import math

import numpy as np

HISTOGRAM_BINS = 30
HISTOGRAM_SAMPLE = 1 << 16  # values a histogram is drawn from at most (an evenly strided sample)


def computable(array):
    """*array* as float32 when numpy cannot compute in its dtype (``ml_dtypes``' bfloat16, float8, int4) or
    would overflow in it (float16: the norm of 70 000 ones); otherwise *array* itself."""
    dtype = array.dtype
    if dtype.type.__module__ == "ml_dtypes" or (dtype.kind == "f" and dtype.itemsize < 4):
        return array.astype(np.float32)
    return array


def leaf_stats(array, dtype, device):
    """Shape, dtype, device, norm, min, max, mean, NaN and Inf counts and a histogram of one array.

    The histogram is of every value up to :data:`HISTOGRAM_SAMPLE` values, of an evenly strided sample beyond
    (``histogram_stride`` says which); everything else is exact.
    """
    stats = {"shape": tuple(array.shape), "dtype": dtype, "device": device, "size": int(array.size)}
    array = computable(array)
    if array.size == 0 or array.dtype.kind not in "biuf":
        return stats
    values = array.astype(np.float64, copy=False) if array.dtype.kind in "biu" else array
    low, high = float(values.min()), float(values.max())  # a NaN anywhere makes both NaN
    if math.isfinite(low) and math.isfinite(high):  # the common case, without a pass to find the non-finite
        stats["nan"] = stats["inf"] = 0
    else:
        finite = np.isfinite(values)
        stats["nan"], stats["inf"] = int(np.isnan(values).sum()), int(np.isinf(values).sum())
        values = values[finite]
        if values.size == 0:
            return stats
        low, high = float(values.min()), float(values.max())
    with np.errstate(over="ignore"):
        # float32's sums overflow for values past 1e19 (a mask filled with float32's lowest value): the mean is
        # summed in float64, and a norm that overflowed is taken again of the values scaled down
        norm = float(np.linalg.norm(values.ravel()))
        if math.isinf(norm):  # the squares overflowed, not the values: scaled down first (a copy, this case only)
            scale = max(abs(low), abs(high))
            norm = scale * float(np.linalg.norm(values.ravel().astype(np.float64) / scale))
        stats.update(min=low, max=high, mean=float(values.mean(dtype=np.float64)), norm=norm)
    if math.isfinite(low) and math.isfinite(high):
        flat = values.ravel()
        stride = -(-flat.size // HISTOGRAM_SAMPLE)
        stats["histogram"] = histogram(flat[::stride], low, high)
        stats["histogram_stride"] = stride
    return stats


def _one_value(sample):
    """The histogram of *sample*, whose values are all the same: np.histogram's of one of them, its count made the
    sample's (np.histogram's general path over the whole sample took 1.8 ms a rank of 32 MB, a fifth of the
    inspector). Where +-0.5 around the value cannot be told from it (np.histogram raises ValueError), bins as wide
    as the value's own precision allows, the values in the middle one."""
    try:
        counts, edges = np.histogram(sample[:1], bins=HISTOGRAM_BINS)
        return (counts * len(sample)).tolist(), edges.tolist()
    except ValueError:
        value = float(sample[0])
        half = abs(value) * 2.0 ** -20
        counts = [0] * HISTOGRAM_BINS
        counts[HISTOGRAM_BINS // 2] = len(sample)
        return counts, np.linspace(value - half, value + half, HISTOGRAM_BINS + 1).tolist()


def histogram(sample, low, high):
    """``(counts, edges)`` of *sample* in :data:`HISTOGRAM_BINS` equal bins from *low* to *high*, the maximum in
    the last; by ``bincount`` on the bin indices (np.histogram's general path took 2x as long)."""
    if high <= low:
        return _one_value(sample)
    index = ((sample.astype(np.float64) - low) * (HISTOGRAM_BINS / (high - low))).astype(np.intp)
    np.clip(index, 0, HISTOGRAM_BINS - 1, out=index)
    counts = np.bincount(index, minlength=HISTOGRAM_BINS)
    return counts.tolist(), np.linspace(low, high, HISTOGRAM_BINS + 1).tolist()
