"""The live timeline of a traced cell: one lane per rank, its MPI calls as bars coloured by operation
(``timeline_drawing.py``), zoomable, with its legend and the trace's summary table under it; shown with its
static rendering (``timeline_static.py``) in the same output, for renderers without the widget.

What is drawn is decimated to the visible range, never the data: after each zoom or pan only the calls in view
are drawn. A lane is cut into ``max_segments // series`` equal buckets; the calls of one series starting in one
bucket are drawn as one bar from the first one's start, as long as the time they took together, so every
stretch of a lane keeps its share of colour (communication) and blank (compute). Zoomed in far enough, each call
is its own bar. Each series is one bqplot ``Lines`` mark holding all its bars, separated by NaN (bqplot leaves a
gap where y is not finite), so a redraw is one comm message per series. Idle stretches are folded into labelled
bands (``idle_folding.py``); the time axis reads the seconds since the trace began all the same.
"""

import html

import bqplot
import ipywidgets as w
import numpy as np

from .idle_folding import Folding
from .text import duration
from .timeline_drawing import LANE, MIN_WIDTH, STEP_COLOR, WAIT_COLOR, Drawing, bucketed
from .timeline_static import timeline_bundle
from .trace_summary import MUTED, PANEL, summary_html, swatch

# in the live figure, the theme's: a band of JupyterLab's third layout colour, its label in the text's colour (10:1
# and more on the band in Light and Dark, and on the page around it)
LIVE_BAND_COLOR = "var(--jp-layout-color2,#eeeeee)"
LIVE_BAND_TEXT = "var(--jp-content-font-color1,#1a1a1a)"
BAR = 12  # pixels: a bar's thickness
NESTED_BAR = 4  # pixels: a call made inside another
WIDGET = "application/vnd.jupyter.widget-view+json"


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
                begin, finish = bucketed(starts, ends, low, high, buckets)
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
