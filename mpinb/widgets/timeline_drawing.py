"""What both renderings of a traced cell's timeline draw (the live widget, ``timeline.py``, and the PNG,
``timeline_static.py``): one lane per rank, its MPI calls as bars coloured by operation, in folded positions
(``idle_folding.py``), and how the bars are merged for drawing.

A lane has three layers: the calls the cell made (thick bars: ``allreduce_gradients``, ``Allreduce``), the
calls made inside them (thin bars over them: the ``Allreduce`` pieces of ``allreduce_gradients``, mpinb's own
check), and on top, in :data:`WAIT_COLOR`, where the rank waited in a collective for a later one: a straggler's
lane is the one without. What is drawn is decimated, never the data: a lane is cut into equal buckets, and the
calls of one series starting in one bucket are drawn as one bar (:func:`bucketed`).
"""

import numpy as np
import pandas as pd

from .idle_folding import Folding
from .trace_rows import MPINB, labels, nesting, traced_ranks

# one colour per operation, in order of the time spent in it (ColorBrewer Dark2, Set1 less its red, then greys)
OP_PALETTE = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#377eb8",
              "#984ea3", "#ff7f00", "#4daf4a", "#f781bf", "#a65628", "#666666", "#999999"]
WAIT_COLOR = "#b2182b"  # waiting in a collective for a later rank (a red no operation has)
STEP_COLOR = "#808080"  # step ticks: 3.9:1 on white, 4.8:1 on JupyterLab Dark's #111
MIN_WIDTH = 2e-4  # a drawn bar is at least this fraction of the visible range wide (a fraction of a pixel)
LANE = 32  # pixels of figure height per rank


class Drawing:
    """What both renderings draw, in folded positions: the series of bars per lane, the waits, the step ticks,
    the bands, the colours and the legend's order.

    Attributes
    ----------
    series : list of tuple
        ``(layer, name, colour, {rank: (starts, ends)})`` in drawing order: layer ``"call"`` (the calls the cell
        made), ``"nested"`` (calls made inside them) and ``"wait"`` (waits for a later rank), each sorted by
        start.
    spent : dict
        ``{operation: seconds all ranks spent in it}``, operations as shown (``mpinb check (allgather)``).
    ops : list
        The operations in the legend's order, which gives their colours: the most time first, mpinb's own
        checks after the cell's calls.
    """

    def __init__(self, trace, summary):
        self.trace = trace
        self.summary = summary
        self.ranks = traced_ranks(trace)
        self.straggler = self.summary.straggler
        self.fold = Folding.of(trace)
        calls = trace[trace["kind"] != "step"]
        names = labels(calls)
        nested = np.zeros(len(calls), dtype=bool)
        rank_of = calls["rank"].to_numpy()
        starts, ends = calls["start"].to_numpy(dtype=np.float64), calls["end"].to_numpy(dtype=np.float64)
        for rank in np.unique(rank_of):
            mine = np.flatnonzero(rank_of == rank)
            nested[mine] = nesting(starts[mine], ends[mine])[0]
        spent = pd.Series(ends - starts).groupby(names).sum() if len(calls) else pd.Series(dtype=np.float64)
        own = set(names[(calls["kind"] == MPINB).to_numpy()]) if len(calls) else set()
        self.ops = sorted(spent.index, key=lambda op: (op in own, -spent[op], op))  # the cell's calls first
        self.spent = {op: float(spent[op]) for op in self.ops}
        self.colors = {op: OP_PALETTE[i % len(OP_PALETTE)] for i, op in enumerate(self.ops)}
        frame = pd.DataFrame({"rank": rank_of, "op": names, "nested": nested,
                              "start": self.fold.fold(starts), "end": self.fold.fold(ends)})
        self.series = []
        for layer, inside in (("call", False), ("nested", True)):
            rows = frame[frame["nested"] == inside]
            for op in self.ops:
                of_op = rows[rows["op"] == op]
                if len(of_op):
                    self.series.append((layer, op, self.colors[op], _lanes(of_op)))
        waited = summary.waits if summary.waits is not None else pd.DataFrame({"rank": [], "start": [], "end": []})
        self.waited = float((waited["end"] - waited["start"]).sum()) if len(waited) else 0.0
        if len(waited):
            waited = waited.assign(start=self.fold.fold(waited["start"].to_numpy()),
                                   end=self.fold.fold(waited["end"].to_numpy()))
            self.series.append(("wait", "waiting for a later rank", WAIT_COLOR, _lanes(waited)))
        steps = trace[trace["kind"] == "step"]
        self.steps = {int(rank): np.sort(self.fold.fold(spans["start"].to_numpy(dtype=np.float64)))
                      for rank, spans in steps.groupby("rank")}

    def rank_label(self, rank, *, prefix="rank "):
        return f"{prefix}{rank} (straggler)" if rank == self.straggler else f"{prefix}{rank}"

    def title(self):
        if self.straggler is None:
            return "MPI calls by rank"
        return f"MPI calls by rank: rank {self.straggler} is the straggler, the others wait for it (red)"

    def axis_label(self):
        folded = " (idle stretches folded)" if self.fold.bands else ""
        return f"seconds since the trace began{folded}"


def _lanes(rows):
    """``{rank: (starts, ends)}`` of *rows* (columns rank, start, end), each lane sorted by start."""
    out = {}
    for rank, spans in rows.groupby("rank", sort=True):
        starts, ends = spans["start"].to_numpy(dtype=np.float64), spans["end"].to_numpy(dtype=np.float64)
        order = np.argsort(starts, kind="stable")
        out[int(rank)] = (starts[order], ends[order])
    return out


def bucketed(starts, ends, low, high, buckets):
    """The bars to draw for one operation of one lane in ``[low, high]`` cut into *buckets*: ``(starts, ends)``.

    The calls starting in one bucket become one bar from the first one's start, as long as their busy time (the
    sum of their durations, at most first start to last end); a lone call is drawn as it is.
    """
    stop = np.searchsorted(starts, high, side="right")
    starts, ends = starts[:stop], ends[:stop]
    keep = ends >= low
    starts, ends = np.maximum(starts[keep], low), np.minimum(ends[keep], high)
    if not len(starts):
        return starts, ends
    bucket = np.minimum(((starts - low) * (buckets / (high - low))).astype(np.int64), buckets - 1)
    first = np.flatnonzero(np.concatenate([[True], bucket[1:] != bucket[:-1]]))
    begin = starts[first]
    busy = np.minimum(np.add.reduceat(ends - starts, first), np.maximum.reduceat(ends, first) - begin)
    return begin, begin + busy
