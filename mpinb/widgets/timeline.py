"""The timeline of a traced cell: one lane per rank, its MPI calls as bars coloured by operation, zoomable.

What is drawn is decimated to the visible range, never the data: after each zoom or pan only the calls in view
are drawn. A lane is cut into ``max_segments // operations`` equal buckets; the calls of one operation starting
in one bucket are drawn as one bar from the first one's start, as long as the time they took together, so
every stretch of a lane keeps its share of colour (communication) and blank (compute). Zoomed in far enough,
each call is its own bar. Each operation is one bqplot ``Lines`` mark holding all its bars, separated by NaN
(bqplot leaves a gap where y is not finite), so a redraw is one comm message per operation.
"""

import html

import bqplot
import ipywidgets as w
import numpy as np

from ..notebook.traces import duration, summarize, summary_html, traced_ranks

# one colour per operation, in order of the time spent in it (ColorBrewer Dark2, Set1, then greys)
OP_PALETTE = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#377eb8",
              "#e41a1c", "#984ea3", "#ff7f00", "#4daf4a", "#f781bf", "#a65628", "#666666", "#999999"]
MIN_WIDTH = 2e-4  # a drawn bar is at least this fraction of the visible range wide (a fraction of a pixel)
BAR = 12  # pixels: a bar's thickness
LANE = 32  # pixels of figure height per rank


class TimelineWidget:
    """A zoomable timeline of a :class:`~mpinb.notebook.traces.Trace` with its summary table under it.

    Parameters
    ----------
    trace : Trace
        The spans (from :func:`mpinb.notebook.traces.frame`); only read here.
    summary : Summary, optional
        From :func:`mpinb.notebook.traces.summarize`; computed when not given.
    max_segments : int, default 2000
        Bars drawn per rank's lane at most; closer calls of one operation are merged into one bar for drawing.

    Attributes
    ----------
    widget : ipywidgets.VBox
        The bqplot figure (scroll to zoom, drag to pan, on the time axis) and the summary table.
    drawn : dict
        ``{rank: bars drawn in its lane}`` at the last redraw.

    Example::

        trace = mpinb.notebook.traces.frame(spans_by_rank)
        display(TimelineWidget(trace).widget)
    """

    def __init__(self, trace, summary=None, *, max_segments=2000):
        self.trace, self.max_segments = trace, max_segments
        self.summary = summarize(trace) if summary is None else summary
        calls = trace[trace["kind"] != "step"]
        spent = (calls["end"] - calls["start"]).groupby(calls["op"]).sum()
        self.ops = sorted(spent.index, key=lambda op: (-spent[op], op))
        self.ranks = traced_ranks(trace)
        self.bars = {}  # (rank, op) -> (starts, ends), sorted by start
        for (rank, op), spans in calls.groupby(["rank", "op"], sort=False):
            starts, ends = spans["start"].to_numpy(dtype=np.float64), spans["end"].to_numpy(dtype=np.float64)
            order = np.argsort(starts, kind="stable")
            self.bars[(int(rank), op)] = (starts[order], ends[order])
        steps = trace[trace["kind"] == "step"]
        self.steps = {int(rank): np.sort(spans["start"].to_numpy(dtype=np.float64))
                      for rank, spans in steps.groupby("rank")}
        end = float(trace["end"].max()) if len(trace) else 0.0
        self.extent = (0.0, end if end > 0 else 1.0)

        self.x_scale = bqplot.LinearScale(min=self.extent[0], max=self.extent[1])
        low, high = (min(self.ranks), max(self.ranks)) if self.ranks else (0, 0)
        self.y_scale = bqplot.LinearScale(min=low - 0.7, max=high + 0.7, reverse=True)
        scales = {"x": self.x_scale, "y": self.y_scale}
        self.colors = {op: OP_PALETTE[i % len(OP_PALETTE)] for i, op in enumerate(self.ops)}
        self.lines = {op: bqplot.Lines(x=np.zeros(0), y=np.zeros(0), scales=scales, labels=[op],
                                       colors=[self.colors[op]], stroke_width=BAR)
                      for op in self.ops}
        self.step_line = None
        if self.steps:
            self.step_line = bqplot.Lines(x=np.zeros(0), y=np.zeros(0), scales=scales, labels=["step"],
                                          colors=["#444444"], stroke_width=1)
        axes = [bqplot.Axis(scale=self.x_scale, label="seconds since the trace began", tick_format=".4~g",
                            grid_lines="none"),
                bqplot.Axis(scale=self.y_scale, side="left", label="rank",
                            tick_values=np.array(self.ranks, dtype=np.float64), tick_format="d",
                            grid_lines="none")]
        marks = [*self.lines.values(), *([self.step_line] if self.step_line else [])]
        self.figure = bqplot.Figure(
            marks=marks, axes=axes, interaction=bqplot.interacts.PanZoom(scales={"x": [self.x_scale]}),
            title="MPI calls by rank (scroll to zoom, drag to pan)",
            fig_margin={"top": 40, "bottom": 45, "left": 55, "right": 20},
            layout=w.Layout(width="100%", height=f"{max(220, 110 + LANE * len(self.ranks))}px"))
        self.drawn = {}
        self.redraws = 0
        self._view = None
        self.redraw()
        self.x_scale.observe(self._zoomed, names=["min", "max"])
        self.legend = w.HTML(self._legend(spent))
        self.table = w.HTML(summary_html(self.summary))
        self.widget = w.VBox([self.figure, self.legend, self.table])

    def _legend(self, spent):
        """One swatch per operation with the time all ranks spent in it (the bars' colours), then the step tick."""
        items = [f"<span style='margin-right:14px;white-space:nowrap'><span style='display:inline-block;width:22px;"
                 f"height:10px;background:{self.colors[op]};vertical-align:middle'></span> {html.escape(op)} "
                 f"<span style='color:#777'>{duration(float(spent[op]))}</span></span>" for op in self.ops]
        if self.step_line is not None:
            items.append("<span style='white-space:nowrap'><span style='display:inline-block;width:1px;height:10px;"
                         "background:#444;vertical-align:middle;margin:0 6px'></span> step "
                         "(<code>mpinb.report</code>)</span>")
        return f"<div style='font-size:12px;margin:0 0 6px 55px'>{''.join(items)}</div>"

    def visible(self):
        """The time range in view, ``(low, high)`` in seconds."""
        low = self.extent[0] if self.x_scale.min is None else float(self.x_scale.min)
        high = self.extent[1] if self.x_scale.max is None else float(self.x_scale.max)
        return (low, high) if high > low else (low, low + 1e-9)

    def _zoomed(self, change):
        if self.visible() != self._view:
            self.redraw()

    def redraw(self):
        """Draw the calls in the visible range (bqplot's PanZoom calls this through the x scale)."""
        self._view = low, high = self.visible()
        width = (high - low) * MIN_WIDTH
        xs = {op: [] for op in self.ops}
        ys = {op: [] for op in self.ops}
        for rank in self.ranks:
            lane = [op for op in self.ops if (rank, op) in self.bars]
            buckets = max(1, self.max_segments // max(1, len(lane)))
            self.drawn[rank] = 0
            for op in lane:
                starts, ends = _bucketed(*self.bars[(rank, op)], low, high, buckets)
                ends = np.minimum(np.maximum(ends, starts + width), high)
                self.drawn[rank] += len(starts)
                xs[op].append(np.column_stack([starts, ends, ends]).ravel())
                ys[op].append(np.tile([rank, rank, np.nan], len(starts)))
        for op, line in self.lines.items():
            x = np.concatenate(xs[op]) if xs[op] else np.zeros(0)
            y = np.concatenate(ys[op]) if ys[op] else np.zeros(0)
            with line.hold_sync():
                line.x, line.y = _finite_end(x, y)
        if self.step_line is not None:
            self._draw_steps(low, high, (high - low) / self.max_segments)
        self.redraws += 1

    def _draw_steps(self, low, high, merge):
        xs, ys = [], []
        for rank, times in self.steps.items():
            times = times[(times >= low) & (times <= high)]
            _, first = np.unique(np.floor((times - low) / merge), return_index=True)
            times = times[first]  # one tick per bucket a lane is cut into
            xs.append(np.repeat(times, 3))
            ys.append(np.tile([rank - 0.45, rank - 0.25, np.nan], len(times)))
        with self.step_line.hold_sync():
            self.step_line.x, self.step_line.y = _finite_end(np.concatenate(xs) if xs else np.zeros(0),
                                                             np.concatenate(ys) if ys else np.zeros(0))


def _finite_end(x, y):
    """*x*, *y* without their trailing separator: bqplot places a line's label at its last point, and a NaN there
    is an 'undefined' transform the browser logs as an error."""
    end = len(y)
    while end and not np.isfinite(y[end - 1]):
        end -= 1
    return x[:end], y[:end]


def _bucketed(starts, ends, low, high, buckets):
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
