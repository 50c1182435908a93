"""Few enough points of a long curve to draw: the live charts and their static images redraw every reported value's
curve from here, and nothing is decimated in the data they read (``notebook/models/history.py`` keeps every value)."""

import numpy as np


def decimate(steps, values, max_points):
    """At most about *max_points* points of a curve for drawing, keeping each bucket's minimum and maximum
    (spikes and NaNs stay visible) and the first and last points."""
    n = len(steps)
    if n <= max_points:
        return steps, values
    buckets = max(1, max_points // 2)
    size = -(-n // buckets)
    padded = np.concatenate([values, np.full(buckets * size - n, values[-1])]).reshape(buckets, size)
    offsets = np.arange(buckets) * size
    with np.errstate(invalid="ignore"):
        low, high = padded.argmin(axis=1) + offsets, padded.argmax(axis=1) + offsets
    keep = np.unique(np.minimum(np.concatenate([low, high, [0, n - 1]]), n - 1))
    return steps[keep], values[keep]
