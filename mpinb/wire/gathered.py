"""Which gathered leaves a rank leaves undescribed: both sides must agree, since the rank skips their statistics
and the notebook computes them in its one pass over every rank's copy (``notebook/scan.py``)."""

import numpy as np

SCAN_BYTES = 4 << 20  # leaves this large (float32, float64) are described in the notebook, not on the ranks
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def scannable(array):
    """Whether the notebook's scan takes *array*: float32 or float64, contiguous, at least :data:`SCAN_BYTES`."""
    return (isinstance(array, np.ndarray) and array.dtype in FLOATS and array.nbytes >= SCAN_BYTES
            and (array.flags.c_contiguous or array.flags.f_contiguous))
