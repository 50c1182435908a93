"""The time axis of a traced cell's timeline with its idle stretches folded: stretches of the trace in which no rank
made any call (a data load, a ``sleep``) are drawn as a narrow labelled band, so the calls fill the picture; the
time axis reads the seconds since the trace began all the same, its ticks at round numbers of them."""

import math

import numpy as np

from .text import duration

FOLD_SHARE = 0.25  # a stretch without calls is folded when longer than this share of the rest of the picture
BAND_SHARE = 0.04  # a folded stretch's band: this share of the time left unfolded
MIN_FOLD = 0.05  # seconds: shorter stretches are never folded


class Folding:
    """The trace's time axis with its idle stretches folded: where no rank has a span (a call or a step) for
    longer than :data:`FOLD_SHARE` of the rest of the picture (and :data:`MIN_FOLD`), the stretch is drawn as a
    band :data:`BAND_SHARE` of the unfolded time wide. Folded positions keep true distances within the stretches
    left as they are, so a bar is as long as its call took.

    Parameters
    ----------
    starts, ends : array-like
        Every span's start and end, in seconds since the trace began.

    Attributes
    ----------
    bands : list of tuple
        ``(low, high, seconds)`` per folded stretch: where its band is drawn (folded positions) and how long it
        was.
    extent : float
        The folded position of the trace's end.

    Example::

        fold = Folding.of(trace)
        x = fold.fold(trace["start"].to_numpy())  # where each span starts in the picture
    """

    def __init__(self, starts, ends, *, share=FOLD_SHARE, band=BAND_SHARE, minimum=MIN_FOLD):
        starts = np.asarray(starts, dtype=np.float64)
        ends = np.maximum(np.asarray(ends, dtype=np.float64), starts)
        end = float(ends.max()) if len(ends) else 0.0
        self.end = end if end > 0 else 1.0
        gaps = _gaps(starts, ends)
        kept, chosen = self.end, []
        for low, high in sorted(gaps, key=lambda gap: gap[0] - gap[1]):  # the longest first
            length = high - low
            if length < minimum or length <= share * (kept - length):
                break
            chosen.append((low, high))
            kept -= length
        width = band * kept
        real, folded = [0.0], [0.0]
        for low, high in sorted(chosen):
            folded.append(folded[-1] + (low - real[-1]))
            real.append(low)
            folded.append(folded[-1] + width)
            real.append(high)
        folded.append(folded[-1] + (self.end - real[-1]))
        real.append(self.end)
        self.real, self.folded = np.array(real), np.array(folded)
        self.bands = [(folded[i], folded[i + 1], real[i + 1] - real[i]) for i in range(1, len(real) - 1, 2)]
        self.extent = float(folded[-1])

    @classmethod
    def of(cls, trace, **options):
        """The folding of a :class:`~mpinb.notebook.models.traces.Trace`'s spans."""
        return cls(trace["start"].to_numpy(dtype=np.float64), trace["end"].to_numpy(dtype=np.float64), **options)

    def fold(self, seconds):
        """Folded positions of times in seconds since the trace began."""
        return np.interp(seconds, self.real, self.folded)

    def unfold(self, positions):
        """Seconds since the trace began at folded *positions* (within a band: the stretch, linearly)."""
        return np.interp(positions, self.folded, self.real)

    @staticmethod
    def label(seconds):
        """A band's text: ``idle 20.1 s``."""
        return f"idle {seconds:.1f} s" if seconds >= 1 else f"idle {duration(seconds)}"

    def ticks(self, low, high, count=8):
        """``[(folded position, text)]``: ticks for an axis showing folded ``[low, high]``, at round numbers of
        seconds within each unfolded stretch in view (none in a band), about *count* in all."""
        span = high - low
        if span <= 0:
            return []
        out = []
        for index in range(0, len(self.real), 2):  # unfolded stretches: real[i] .. real[i + 1]
            if index + 1 >= len(self.real):
                break
            f0, f1, r0 = self.folded[index], self.folded[index + 1], self.real[index]
            lo, hi = max(f0, low), min(f1, high)
            if hi < lo:
                continue
            share = (hi - lo) / span
            wanted = max(1, round(count * share))
            r_lo, r_hi = r0 + (lo - f0), r0 + (hi - f0)
            step = _nice(max((r_hi - r_lo) / wanted, 1e-9))
            decimals = max(0, math.ceil(-math.log10(step) - 1e-9))
            first = math.ceil(r_lo / step - 1e-9)
            last = math.floor(r_hi / step + 1e-9)
            for k in range(first, last + 1):
                value = k * step
                text = f"{value:.{decimals}f}"
                out.append((f0 + (value - r0), text.rstrip("0").rstrip(".") if "." in text else text))
        out.sort()
        kept = []
        for position, text in out:  # no two closer than a tick label's room
            if not kept or position - kept[-1][0] >= span / (count * 1.6):
                kept.append((position, text))
        return kept


def _gaps(starts, ends):
    """The stretches between the union of intervals ``[starts[i], ends[i]]``: ``[(low, high)]`` in order."""
    if not len(starts):
        return []
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    breaks = np.flatnonzero(starts[1:] > reach[:-1])
    return [(float(reach[i]), float(starts[i + 1])) for i in breaks]


def _nice(step):
    """The round step (1, 2 or 5 times a power of ten) at or above *step*."""
    power = 10.0 ** math.floor(math.log10(step))
    for factor in (1, 2, 5, 10):
        if step <= factor * power * (1 + 1e-9):
            return factor * power
    return 10 * power
