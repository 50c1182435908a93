"""The timeline of a traced cell: one lane per rank, its MPI calls as bars coloured by operation, zoomable; and
its static rendering, the same picture as a PNG for a notebook saved or exported.

What is drawn is decimated to the visible range, never the data: after each zoom or pan only the calls in view
are drawn. A lane is cut into ``max_segments // series`` equal buckets; the calls of one series starting in one
bucket are drawn as one bar from the first one's start, as long as the time they took together, so every
stretch of a lane keeps its share of colour (communication) and blank (compute). Zoomed in far enough, each call
is its own bar. Each series is one bqplot ``Lines`` mark holding all its bars, separated by NaN (bqplot leaves a
gap where y is not finite), so a redraw is one comm message per series.

A lane has three layers: the calls the cell made (thick bars: ``allreduce_gradients``, ``Allreduce``), the
calls made inside them (thin bars over them: the ``Allreduce`` pieces of ``allreduce_gradients``, mpinb's own
check), and on top, in :data:`WAIT_COLOR`, where the rank waited in a collective for a later one: a straggler's
lane is the one without. Stretches of the trace in which no rank made any call (a data load, a ``sleep``) are
folded (:class:`Folding`) into a narrow labelled band, so the calls fill the picture; the time axis reads the
seconds since the trace began all the same.
"""

import html
import math

import bqplot
import ipywidgets as w
import numpy as np
import pandas as pd

from .text import duration
from .trace_rows import MPINB, labels, nesting, traced_ranks
from .trace_summary import MUTED, PANEL, summary_html, summary_text, swatch

# one colour per operation, in order of the time spent in it (ColorBrewer Dark2, Set1 less its red, then greys)
OP_PALETTE = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#377eb8",
              "#984ea3", "#ff7f00", "#4daf4a", "#f781bf", "#a65628", "#666666", "#999999"]
WAIT_COLOR = "#b2182b"  # waiting in a collective for a later rank (a red no operation has)
STEP_COLOR = "#808080"  # step ticks: 3.9:1 on white, 4.8:1 on JupyterLab Dark's #111
BAND_COLOR = "#e3e3e3"  # a folded idle stretch in the PNG (on its own white background) ...
BAND_TEXT = "#262626"  # ... and its label, on it (11.8:1)
# in the live figure, the theme's: a band of JupyterLab's third layout colour, its label in the text's colour (10:1
# and more on the band in Light and Dark, and on the page around it)
LIVE_BAND_COLOR = "var(--jp-layout-color2,#eeeeee)"
LIVE_BAND_TEXT = "var(--jp-content-font-color1,#1a1a1a)"
MIN_WIDTH = 2e-4  # a drawn bar is at least this fraction of the visible range wide (a fraction of a pixel)
BAR = 12  # pixels: a bar's thickness
NESTED_BAR = 4  # pixels: a call made inside another
LANE = 32  # pixels of figure height per rank
FOLD_SHARE = 0.25  # a stretch without calls is folded when longer than this share of the rest of the picture
BAND_SHARE = 0.04  # a folded stretch's band: this share of the time left unfolded
MIN_FOLD = 0.05  # seconds: shorter stretches are never folded
WIDGET = "application/vnd.jupyter.widget-view+json"


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


def _js_number(value):
    """*value* as JavaScript's ``String(number)`` writes it: the key bqplot looks a tick label up by."""
    value = float(value)
    if value == 0:
        return "0"
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    if 1e-6 <= abs(value) < 1e21:
        return np.format_float_positional(value, trim="-")
    mantissa, exponent = repr(value).split("e")
    return f"{mantissa}e{int(exponent):+d}".replace("e+-", "e-")


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


class TimelineWidget:
    """A zoomable timeline of a :class:`~mpinb.notebook.models.traces.Trace` with its summary table under it.

    Parameters
    ----------
    trace : Trace
        The spans (from :func:`mpinb.notebook.models.traces.frame`); only read here.
    summary : Summary
        From :func:`mpinb.notebook.models.traces.summarize`: the straggler, the table and the waits drawn in red.
    max_segments : int, default 2000
        Bars drawn per rank's lane at most; closer calls of one operation are merged into one bar for drawing.

    Attributes
    ----------
    widget : ipywidgets.VBox
        The bqplot figure (scroll to zoom, drag to pan, on the time axis) and the summary table.
    drawn : dict
        ``{rank: call bars drawn in its lane}`` at the last redraw (waits not counted).
    lines, nested_lines : dict
        ``{operation: bqplot Lines}`` of the calls the cell made, and of those made inside them.
    wait_line : bqplot.Lines or None
        The waits for a later rank.

    The x scale is in folded positions (:class:`Folding`); the axis's labels say the seconds since the trace
    began.

    Example::

        trace = mpinb.notebook.models.traces.frame(spans_by_rank)
        display(TimelineWidget(trace, mpinb.notebook.models.traces.summarize(trace)).widget)
    """

    def __init__(self, trace, summary, *, max_segments=2000):
        self.trace, self.max_segments = trace, max_segments
        self.drawing = drawing = Drawing(trace, summary)
        self.summary, self.ranks, self.ops, self.colors = drawing.summary, drawing.ranks, drawing.ops, drawing.colors
        self.fold = drawing.fold
        self.steps = drawing.steps
        self.extent = (0.0, self.fold.extent)

        self.x_scale = bqplot.LinearScale(min=self.extent[0], max=self.extent[1])
        low, high = (min(self.ranks), max(self.ranks)) if self.ranks else (0, 0)
        self.y_scale = bqplot.LinearScale(min=low - 0.7, max=high + 0.7, reverse=True)
        scales = {"x": self.x_scale, "y": self.y_scale}
        self.lines, self.nested_lines, self.wait_line = {}, {}, None
        self.marks = []  # (layer, name, Lines, lanes), in drawing order
        for layer, name, color, lanes in drawing.series:
            line = bqplot.Lines(x=np.zeros(0), y=np.zeros(0), scales=scales, labels=[name], colors=[color],
                                stroke_width=NESTED_BAR if layer == "nested" else BAR)
            {"call": self.lines, "nested": self.nested_lines}.get(layer, {})[name] = line
            if layer == "wait":
                self.wait_line = line
            self.marks.append((layer, name, line, lanes))
        self.step_line = None
        if self.steps:
            self.step_line = bqplot.Lines(x=np.zeros(0), y=np.zeros(0), scales=scales, labels=["step"],
                                          colors=[STEP_COLOR], stroke_width=1)
        band_marks = self._bands(scales, low, high)
        y_labels = {}
        if drawing.straggler is not None:
            y_labels = {_js_number(drawing.straggler): drawing.rank_label(drawing.straggler, prefix="")}
        self.x_axis = bqplot.Axis(scale=self.x_scale, label=drawing.axis_label(), grid_lines="none",
                                  label_offset="32px")
        self.y_axis = bqplot.Axis(scale=self.y_scale, side="left", label="rank",
                                  tick_values=np.array(self.ranks, dtype=np.float64), tick_format="d",
                                  tick_labels=y_labels or None, grid_lines="none")
        marks = [*band_marks, *(line for _, _, line, _ in self.marks),
                 *([self.step_line] if self.step_line else [])]
        left = 95 if drawing.straggler is not None else 55
        self.figure = bqplot.Figure(
            marks=marks, axes=[self.x_axis, self.y_axis],
            interaction=bqplot.interacts.PanZoom(scales={"x": [self.x_scale]}),
            title=f"{drawing.title()} · scroll to zoom, drag to pan",
            fig_margin={"top": 40, "bottom": 50, "left": left, "right": 20},
            layout=w.Layout(width="100%", height=f"{max(220, 110 + LANE * len(self.ranks))}px"))
        self.drawn = {}
        self.redraws = 0
        self._view = None
        self.redraw()
        self.x_scale.observe(self._zoomed, names=["min", "max"])
        self.legend = w.HTML(legend_html(drawing))
        self.table = w.HTML(summary_html(self.summary))
        self.widget = w.VBox([self.figure, self.legend, self.table])

    def _bands(self, scales, low, high):
        """The folded stretches: a filled box across the lanes each, with its label written up it."""
        bands = self.fold.bands
        if not bands:
            return []
        top, bottom = low - 0.6, high + 0.6
        xs = np.array([[a, b, b, a, a] for a, b, _ in bands], dtype=np.float64)
        ys = np.tile(np.array([top, top, bottom, bottom, top], dtype=np.float64), (len(bands), 1))
        box = bqplot.Lines(x=xs, y=ys, scales=scales, fill="inside", colors=[LIVE_BAND_COLOR] * len(bands),
                           fill_colors=[LIVE_BAND_COLOR] * len(bands), fill_opacities=[1.0] * len(bands),
                           stroke_width=1, labels=["idle"] * len(bands))
        text = bqplot.Label(x=np.array([(a + b) / 2 for a, b, _ in bands]),
                            y=np.full(len(bands), (low + high) / 2, dtype=np.float64),
                            text=[Folding.label(seconds) for _, _, seconds in bands], scales=scales,
                            colors=[LIVE_BAND_TEXT], rotate_angle=-90, align="middle", default_size=11,
                            font_weight="normal")
        return [box, text]

    def visible(self):
        """The range in view, ``(low, high)``, in folded positions (seconds where nothing is folded)."""
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
        per_lane = {rank: sum(1 for *_, lanes in self.marks if rank in lanes) for rank in self.ranks}
        self.drawn = {rank: 0 for rank in self.ranks}
        self.drawn_waits = {rank: 0 for rank in self.ranks}
        for layer, _, line, lanes in self.marks:
            xs, ys = [], []
            for rank, (starts, ends) in lanes.items():
                buckets = max(1, self.max_segments // max(1, per_lane.get(rank, 1)))
                begin, finish = _bucketed(starts, ends, low, high, buckets)
                finish = np.minimum(np.maximum(finish, begin + width), high)
                counts = self.drawn_waits if layer == "wait" else self.drawn
                counts[rank] = counts.get(rank, 0) + len(begin)
                xs.append(np.column_stack([begin, finish, finish]).ravel())
                ys.append(np.tile([rank, rank, np.nan], len(begin)))
            x = np.concatenate(xs) if xs else np.zeros(0)
            y = np.concatenate(ys) if ys else np.zeros(0)
            with line.hold_sync():
                line.x, line.y = _finite_end(x, y)
        if self.step_line is not None:
            self._draw_steps(low, high, (high - low) / self.max_segments)
        ticks = self.fold.ticks(low, high)
        with self.x_axis.hold_sync():
            self.x_axis.tick_values = np.array([position for position, _ in ticks], dtype=np.float64)
            self.x_axis.tick_labels = {_js_number(position): text for position, text in ticks}
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


def legend_html(drawing):
    """One swatch per operation with the time all ranks spent in it (the bars' colours), then the waits, the step
    tick and the folded stretches; text in JupyterLab's colours."""
    def item(mark, text, note=""):
        note = f" <span style='color:{MUTED}'>{html.escape(note)}</span>" if note else ""
        return f"<span style='margin-right:14px;white-space:nowrap'>{mark}{html.escape(text)}{note}</span>"

    items = [item(swatch(drawing.colors[op], width=22), op, duration(drawing.spent[op])) for op in drawing.ops]
    if any(layer == "wait" for layer, *_ in drawing.series):
        items.append(item(swatch(WAIT_COLOR, width=22), "waiting for a later rank", duration(drawing.waited)))
    if drawing.steps:
        items.append(item(swatch(STEP_COLOR, width=1), "step (mpinb.report)"))
    if drawing.fold.bands:
        items.append(item(swatch(LIVE_BAND_COLOR, width=22), "idle: no rank made a call (folded)"))
    return f"<div style='font-size:12px;padding:0 0 6px 55px;{PANEL}'>{''.join(items)}</div>"


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


# ---------------------------------------------------------------------- the static rendering

BAR_POINTS = 12  # a bar's thickness in the PNG
NESTED_POINTS = 4
INK = "#1a1a1a"  # the PNG's text, on its own white background


def timeline_figure(trace, summary, *, max_segments=2000, width=900):
    """The whole trace as a matplotlib Figure with its own white background: one lane per rank (the straggler's
    named), its calls as bars (merged below a pixel as the live timeline does), the waits for a later rank in
    red over them, step ticks, the idle stretches folded into labelled bands, and a legend."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from . import static

    drawing = Drawing(trace, summary)
    ranks, fold = drawing.ranks, drawing.fold
    left = 130 if drawing.straggler is not None else 60
    fig = static.figure(width, max(200, 110 + LANE * len(ranks)), left=left, right=210)
    fig.set_facecolor("white")
    ax = static.grid(fig, 1, 1)[0]
    ax.set_facecolor("white")
    low, high = (min(ranks), max(ranks)) if ranks else (0, 0)
    for band_low, band_high, seconds in fold.bands:
        ax.axvspan(band_low, band_high, color=BAND_COLOR, zorder=0, linewidth=0)
        ax.text((band_low + band_high) / 2, (low + high) / 2, Folding.label(seconds), rotation=90, ha="center",
                va="center", fontsize=8, color=BAND_TEXT, zorder=1)
    extent = fold.extent
    per_lane = {rank: sum(1 for *_, lanes in drawing.series if rank in lanes) for rank in ranks}
    for order, (layer, _, color, lanes) in enumerate(drawing.series):
        for rank, (starts, ends) in lanes.items():
            buckets = max(1, max_segments // max(1, per_lane.get(rank, 1)))
            begin, finish = _bucketed(starts, ends, 0.0, extent, buckets)
            finish = np.maximum(finish, begin + extent * MIN_WIDTH)  # at least a fraction of a pixel
            # one path of NaN-separated segments per series and lane: a collection of thousands of bars costs
            # ten times as much
            ax.plot(np.column_stack([begin, finish, np.full(len(begin), np.nan)]).ravel(),
                    np.tile([rank, rank, np.nan], len(begin)), color=color, solid_capstyle="butt",
                    linewidth=NESTED_POINTS if layer == "nested" else BAR_POINTS, zorder=2 + order)
    for rank, times in drawing.steps.items():
        ax.vlines(times, rank - 0.45, rank - 0.3, color=STEP_COLOR, linewidth=0.6, zorder=1)
    ax.set_xlim(0.0, extent)
    ax.set_ylim(high + 0.7, low - 0.7)
    ax.set_yticks(ranks, [drawing.rank_label(rank) for rank in ranks], fontsize=8, color=INK)
    for text, rank in zip(ax.get_yticklabels(), ranks):
        if rank == drawing.straggler:
            text.set_color(WAIT_COLOR)
            text.set_fontweight("bold")
    ticks = fold.ticks(0.0, extent, count=10)
    ax.set_xticks([position for position, _ in ticks], [text for _, text in ticks])
    ax.set_xlabel(drawing.axis_label(), fontsize=9, color=INK)
    ax.tick_params(labelsize=8, colors=INK)
    ax.text(0.5, 1.0, drawing.title(), transform=ax.transAxes, ha="center", va="bottom", fontsize=10, color=INK)
    handles = [Patch(color=drawing.colors[op], label=op) for op in drawing.ops[:10]]
    if any(layer == "wait" for layer, *_ in drawing.series):
        handles.append(Patch(color=WAIT_COLOR, label="waiting for a later rank"))
    if drawing.steps:
        handles.append(Line2D([], [], color=STEP_COLOR, marker="|", linestyle="none", markersize=8,
                              label="step (mpinb.report)"))
    if fold.bands:
        handles.append(Patch(color=BAND_COLOR, label="idle, folded"))
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False,
                  labelcolor=INK)
    return fig


def timeline_png(trace, summary, **options):
    """:func:`timeline_figure` as a base64 PNG."""
    from . import static

    return static.png(timeline_figure(trace, summary, **options))


def timeline_bundle(trace, summary):
    """The traced cell's timeline (PNG) and its summary (HTML table, and text) as a MIME bundle."""
    from . import static

    chart = timeline_png(trace, summary)
    return static.bundle(summary_text(summary),
                         [static.img(chart, "timeline of MPI calls by rank"), summary_html(summary)], [chart])


def show(trace, summary):
    """Display the zoomable timeline of *trace* as an output of its own that stays live while the kernel does,
    with :func:`timeline_bundle` in the same output for renderers without the widget's model (nbconvert,
    nbviewer; a notebook reopened with a new kernel shows the widget's model as missing, as views kept with
    ``keep_widgets`` do). Returns the widget."""
    from IPython.display import display

    data = timeline_bundle(trace, summary)
    widget = TimelineWidget(trace, summary).widget
    data[WIDGET] = widget._repr_mimebundle_()[WIDGET]
    display(data, raw=True)
    return widget
