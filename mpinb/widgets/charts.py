"""Live charts of a :class:`~mpinb.notebook.models.history.History`: one bqplot figure per metric, one curve per rank,
and the per-rank table under them. Updated in place: each changed curve is one comm message (x and y together,
as binary arrays), so a refresh costs a message per changed curve, whatever the reporting rate.
"""

import html
import math

import bqplot
import ipywidgets as w
import numpy as np
from bqplot.traits import array_dimension_bounds, array_from_json, array_squeeze, array_to_json
from traittypes import Array

from ..wire.kinds import DEFAULT_RUN
from ..wire.ranks import label_ranks
from .colors import TEXT, identical_groups, rank_color, rank_label, stacked_widths
from .decimation import decimate
from .summary import summary_html

LEGEND_TEXT = {"fill": TEXT}  # legend entries in the theme's text colour (bqplot writes them in the curve's)


class MetricsWidget:
    """Charts and table for the runs a cell reports into; call :meth:`refresh` to bring them up to date.

    Each chart is titled with its metric's name; a run other than the default one is named under the title. A
    curve that turns NaN or Inf ends at its last finite point (non-finite points inside it are gaps) and gets a
    cross there, labelled ``NaN from step N``. A "log y" toggle per chart switches its y axis to a log scale
    while every value is positive.

    Parameters
    ----------
    history : History
        The data; only read here.
    max_points : int, default 1000
        Points drawn per curve at most (min/max decimation); the history keeps every value.
    """

    def __init__(self, history, *, max_points=1000):
        self.history, self.max_points = history, max_points
        self.runs = []
        self.figures = {}  # (run, name) -> bqplot.Figure
        self.subtitles = {}  # (run, name) -> ipywidgets.HTML naming a run other than the default one
        self.log_toggles = {}  # (run, name) -> ipywidgets.ToggleButton
        self.scales = {}  # (run, name) -> {"x", "y"} scales shared by the chart's marks
        self.lines = {}  # (run, name, rank) -> bqplot.Lines
        self.nan_marks = {}  # (run, name, rank) -> bqplot.Scatter at the curve's first non-finite step
        self.drawn = {}  # (run, name, rank) -> points of the series when last drawn
        self.lowest = {}  # (run, name, rank) -> smallest finite value (None: none yet)
        self.messages = 0  # comm messages sent by refreshes (curves and tables), for the benchmark
        self.charts = w.Box(layout=w.Layout(display="flex", flex_flow="row wrap"))
        self.tables = w.HTML()
        self.widget = w.VBox([self.charts, self.tables])

    def show(self, run):
        """Draw *run* too (its charts appear at the next refresh)."""
        if run not in self.runs:
            self.runs.append(run)

    def refresh(self, *, now=None, live=True, finished=()):
        """Redraw the curves that grew since the last refresh and the table. *finished*: ranks done with the
        cell (while *live*, a rank that finished is not "silent")."""
        for run in self.runs:
            for name in self.history.names.get(run, []):
                figure = self.figures.get((run, name))
                if figure is None:
                    figure = self._chart(run, name)
                changed = False
                for rank in self.history.ranks(run):
                    changed |= self._draw(figure, run, name, rank)
                if changed:
                    self._allow_log(run, name)
                    self._place_nan_labels(run, name)
        tables = "".join(summary_html(self.history, run, now=now, live=live, finished=finished) for run in self.runs)
        if tables != self.tables.value:
            self.tables.value = tables
            self.messages += 1

    def _chart(self, run, name):
        """A new chart: the figure (titled *name*, always), the run's name under it unless it is the default
        run, and the log-scale toggle."""
        key = (run, name)
        figure = self.figures[key] = _figure(name)
        self.scales[key] = _scales()
        subtitle = self.subtitles[key] = w.HTML("" if run == DEFAULT_RUN else f"<small>run {html.escape(run)}</small>",
                                                layout=w.Layout(width="340px", margin="0 0 0 70px"))
        toggle = self.log_toggles[key] = w.ToggleButton(
            value=False, description="log y", disabled=True, tooltip=LOG_NEEDS_VALUES,
            layout=w.Layout(width="60px", height="22px"))
        toggle.observe(lambda change: self._set_log(run, name, change["new"]), names="value")
        self.charts.children = (*self.charts.children, w.VBox([w.HBox([subtitle, toggle]), figure]))
        self.messages += 1
        return figure

    def _set_log(self, run, name, log):
        """Swap the chart's y scale between linear and log (for every curve and mark, and the axis)."""
        key = (run, name)
        y = bqplot.LogScale() if log else bqplot.LinearScale()
        self.scales[key] = {**self.scales[key], "y": y}
        figure = self.figures[key]
        with figure.hold_sync():
            for mark in figure.marks:
                mark.scales = {**mark.scales, "y": y}
            if figure.axes:
                figure.axes = _axes(self.scales[key], name)

    def _allow_log(self, run, name):
        """A log y scale only for positive values: the toggle is off and disabled (its tooltip says why) while
        some value is zero or negative."""
        toggle = self.log_toggles[(run, name)]
        lowest = [self.lowest.get((run, name, rank)) for rank in self.history.ranks(run)]
        lowest = [value for value in lowest if value is not None]
        positive = bool(lowest) and min(lowest) > 0
        if positive and toggle.disabled:
            toggle.disabled, toggle.tooltip = False, LOG_TOOLTIP
        elif not positive and not toggle.disabled:
            toggle.value = False
            toggle.disabled = True
            toggle.tooltip = LOG_NEEDS_POSITIVE if lowest else LOG_NEEDS_VALUES

    def _place_nan_labels(self, run, name):
        """Each NaN cross's label above or below the cross, wherever the other ranks' curves leave it room."""
        marks = {rank: mark for (r, n, rank), mark in self.nan_marks.items() if (r, n) == (run, name)}
        if not marks:
            return
        series = {rank: self.history.series[(run, rank, name)].arrays() for rank in self.history.ranks(run)
                  if (run, rank, name) in self.history.series}
        log = isinstance(self.scales[(run, name)]["y"], bqplot.LogScale)
        for rank, mark in marks.items():
            others = {r: arrays for r, arrays in series.items() if r != rank}
            offset = nan_label_offset(float(mark.x[0]), float(mark.y[0]), others, series, log=log)
            if mark.label_display_vertical_offset != offset:
                mark.label_display_vertical_offset = offset
                self.messages += 1

    def _draw(self, figure, run, name, rank):
        series = self.history.series.get((run, rank, name))
        key = (run, name, rank)
        if series is None or self.drawn.get(key) == len(series):
            return False
        self.drawn[key] = len(series)
        all_steps, all_values = series.arrays()
        finite = np.isfinite(all_values)
        if finite.any():
            self.lowest[key] = float(all_values[finite].min())
        steps, values = decimate(all_steps, all_values, self.max_points)
        values = np.where(np.isfinite(values), values, np.nan)  # inf would stretch the scale away
        # bqplot places a curve's label at its last point: a NaN there is an "undefined" transform in the browser
        end = int(np.flatnonzero(np.isfinite(values))[-1]) + 1 if np.isfinite(values).any() else 0
        steps, values = steps[:end], values[:end]
        scales = self.scales[(run, name)]
        line = self.lines.get(key)
        if line is None:
            line = self.lines[key] = bqplot.Lines(
                x=steps, y=values, scales=scales, colors=[rank_color(rank)], labels=[f"rank {rank}"],
                display_legend=True, stroke_width=1.5,
            )
            self._place(figure, run, name)
            self.messages += 2
        else:
            with line.hold_sync():
                line.x, line.y = steps, values
            self.messages += 1
        if key not in self.nan_marks and not finite.all():
            self.nan_marks[key] = _nan_mark(all_steps, all_values, finite, rank, scales)
            self._place(figure, run, name)
            self.messages += 1
        return True

    def _place(self, figure, run, name):
        """The chart's marks: the curves by rank, then the NaN crosses; the axes once there is a mark."""
        ranks = self.history.ranks(run)
        marks = [self.lines[(run, name, r)] for r in ranks if (run, name, r) in self.lines]
        marks += [self.nan_marks[(run, name, r)] for r in ranks if (run, name, r) in self.nan_marks]
        with figure.hold_sync():
            figure.marks = marks
            if not figure.axes:
                figure.axes = _axes(self.scales[(run, name)], name)


LOG_TOOLTIP = "log-scale y axis"
LOG_NEEDS_POSITIVE = "a log scale needs positive values: some are zero or negative"
LOG_NEEDS_VALUES = "a log scale needs positive values: none reported yet"


def _nan_mark(steps, values, finite, rank, scales):
    """A cross in the rank's colour where its curve first turns non-finite, at its last finite value before that
    (its first after, when it started non-finite), labelled ``NaN from step N``."""
    first = int(np.argmin(finite))
    before, after = np.flatnonzero(finite[:first]), np.flatnonzero(finite[first:])
    if before.size:
        y = float(values[before[-1]])
    elif after.size:
        y = float(values[first + after[0]])
    else:
        y = 1.0  # nothing finite at all: anywhere visible
    value = float(values[first])
    word = "NaN" if np.isnan(value) else ("inf" if value > 0 else "-inf")
    label = f"{word} from step {int(steps[first])}"
    # the label right of the cross and above it (bqplot: a positive vertical offset is up), clear of the curve that
    # ends there (it runs in from the left); MetricsWidget moves it up or down, clear of the other ranks' curves
    return bqplot.Scatter(x=[int(steps[first])], y=[y], scales=scales, colors=[rank_color(rank)], marker="cross",
                          default_size=80, names=[label], display_names=True, labels=[f"rank {rank}: {label}"],
                          label_display_horizontal_offset=6.0, label_display_vertical_offset=LABEL_OFFSETS[0],
                          display_legend=False, tooltip=bqplot.Tooltip(fields=["name"], labels=[f"rank {rank}"]))


PLOT_WIDTH, PLOT_HEIGHT = 440 - 70 - 20, 290 - 30 - 50  # a chart's plot area in pixels (its layout less margins)
LABEL_WIDTH, LABEL_HEIGHT = 100, 12  # "NaN from step 1234" at bqplot's 11 px
# the label's baseline above (+) or below (-) the cross, in pixels: clear of the cross (about 9 px across) and near
# enough to read as its label, the nearest first
LABEL_OFFSETS = tuple(sorted([float(v) for v in range(8, 25, 2)] + [float(-v) for v in range(13, 29, 2)],
                             key=lambda v: (abs(v) - (4 if v < 0 else 0), -v)))


def nan_label_offset(step, value, others, everyone, *, log=False):
    """The vertical offset (bqplot's, pixels up) for the label of a NaN cross at (*step*, *value*): the nearest of
    :data:`LABEL_OFFSETS` whose label box no curve of *others* (``{rank: (steps, values)}``) crosses (else the one
    crossed least), the chart's scales spanning *everyone*'s finite values over a :data:`PLOT_WIDTH` ×
    :data:`PLOT_HEIGHT` plot."""
    def y(values):
        return np.log10(np.clip(values, 1e-300, None)) if log else values

    steps = [s for s, _ in everyone.values() if len(s)]
    values = [y(v[np.isfinite(v)]) for _, v in everyone.values()]
    values = [v for v in values if len(v)]
    if not steps or not values:
        return LABEL_OFFSETS[0]
    x_low, x_high = min(float(s.min()) for s in steps), max(float(s.max()) for s in steps)
    y_low, y_high = min(float(v.min()) for v in values), max(float(v.max()) for v in values)
    per_step = PLOT_WIDTH / max(x_high - x_low, 1e-12)
    per_unit = PLOT_HEIGHT / max(y_high - y_low, 1e-12)
    window = (step, step + (6 + LABEL_WIDTH) / per_step)
    spans = []  # pixels above the cross (up positive) that each other curve covers under the label
    for s, v in others.values():
        # the points under the label and one either side: the segments that cross it
        first, last = np.searchsorted(s, window[0]), np.searchsorted(s, window[1], side="right")
        part = v[max(0, first - 1):last + 1]
        part = part[np.isfinite(part)]
        if len(part):
            heights = (y(part) - y(np.array([value]))[0]) * per_unit
            spans.append((float(heights.min()) - 1, float(heights.max()) + 1))  # and the line's width

    def crossed(offset):  # pixels of the label's height (its descent to its cap height) that curves cover
        low, high = offset - 3, offset - 3 + LABEL_HEIGHT
        return sum(max(0.0, min(high, top) - max(low, bottom)) for bottom, top in spans)

    return min(LABEL_OFFSETS, key=lambda offset: (crossed(offset), LABEL_OFFSETS.index(offset)))


def _figure(title):
    return bqplot.Figure(title=title, marks=[], axes=[], legend_location="top-right", legend_text=LEGEND_TEXT,
                         fig_margin={"top": 30, "bottom": 50, "left": 70, "right": 20},
                         layout=w.Layout(width="440px", height="290px"))


def _scales():
    return {"x": bqplot.LinearScale(), "y": bqplot.LinearScale()}


def _axes(scales, name):
    # the labels beyond the tick labels: "step" under them, the metric's name left of "0.0001234"
    return [bqplot.Axis(scale=scales["x"], label="step", grid_lines="none", label_offset="36px"),
            bqplot.Axis(scale=scales["y"], side="left", label=name, tick_format=".4~g", label_offset="56px")]


def _nan_as_null(value, widget):
    """A colour array as bqplot sends it, but with NaN as ``null`` (plain JSON lists): bqplot's GridHeatMap draws
    its ``null_color`` only for a null, and a NaN sent as binary float64 came out black."""
    if value is None:
        return None
    array = np.asarray(value, dtype=np.float64)
    if np.isfinite(array).all():
        return array_to_json(array, widget)
    return np.where(np.isfinite(array), array, None).tolist()


class NullColorGridHeatMap(bqplot.GridHeatMap):
    """A :class:`bqplot.GridHeatMap` whose NaN (and infinite) cells are drawn in ``null_color``."""

    color = Array(None, allow_none=True).tag(sync=True, scaled=True, rtype="Color", atype="bqplot.ColorAxis",
                                             to_json=_nan_as_null, from_json=array_from_json) \
        .valid(array_squeeze, array_dimension_bounds(1, 2))


def count_ticks(top, most=5):
    """Integer ticks from 0 for a count axis whose largest count is *top*: steps of 1, 2 or 5 times a power of
    ten, at most *most* ticks, none above *top* (the axis ends a little above it)."""
    top = max(1, int(math.ceil(top)))
    step = 1
    while top // step + 1 > most:
        step = _next_step(step)
    return list(range(0, top + 1, step))


def _next_step(step):
    """1, 2, 5, 10, 20, 50, ..."""
    scale = 10 ** int(math.floor(math.log10(step)))
    lead = step // scale
    return (2 if lead == 1 else 5 if lead == 2 else 10) * scale


X_TICKS = ".2~g"  # a histogram's value ticks: few, compact


def histogram_figure(title, x_label, width):
    """An empty figure for per-rank histograms (the tensor inspector's, ``%mpi grads``'s); see :func:`draw_histograms`.

    Few, compact ticks on the value axis (labels like ``-0.15`` would run into each other) and a right margin for
    the last one; integer ticks on the count axis, its label beyond them; no legend inside the plot, where it would
    cover the peaks: :func:`histogram_legend` is the key.
    """
    x_scale, y_scale = bqplot.LinearScale(), bqplot.LinearScale(min=0.0)
    figure = bqplot.Figure(marks=[], title=title,
                           axes=[bqplot.Axis(scale=x_scale, label=x_label, tick_format=X_TICKS, num_ticks=5,
                                             label_offset="34px"),
                                 bqplot.Axis(scale=y_scale, side="left", label="count", tick_format="~s",
                                             tick_values=np.array(count_ticks(1)), label_offset="44px")],
                           fig_margin={"top": 40, "bottom": 46, "left": 64, "right": 40},
                           layout=w.Layout(width=width, height="300px"))
    figure.base_title = title  # the title without the "nothing finite" note
    return figure


def draw_histograms(figure, histograms, *, legend=None):
    """Draw ``{rank: (counts, edges)}`` into *figure*: one step line per rank, in the rank's colour, both axes
    scaled to these histograms (not to the ones drawn before). Ranks whose histograms are the same are drawn as
    nested bands (the lowest rank widest, underneath), so that each one's colour shows. Without any, the title says
    there is nothing finite to draw. *legend*, an ``ipywidgets.HTML``, gets the ranks' colour key."""
    x_scale, y_scale = figure.axes[0].scale, figure.axes[1].scale
    scales = {"x": x_scale, "y": y_scale}
    title = getattr(figure, "base_title", figure.title)
    widths = stacked_widths(histograms)
    marks = []
    low = high = top = None
    for rank, (counts, edges) in sorted(histograms.items()):
        centres = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
        marks.append(bqplot.Lines(x=centres, y=counts, scales=scales, colors=[rank_color(rank)],
                                  labels=[f"rank {rank}"], display_legend=False, interpolation="step-after",
                                  stroke_width=widths[rank]))
        low = min(edges[0], low) if low is not None else edges[0]
        high = max(edges[-1], high) if high is not None else edges[-1]
        top = max(max(counts, default=0), top or 0)
    with figure.hold_sync():
        if marks:
            if high <= low:  # every value the same: a unit-wide window around it
                low, high = low - 0.5, high + 0.5
            with x_scale.hold_sync():
                x_scale.min, x_scale.max = float(low), float(high)
            middle, x_axis = (low + high) / 2, figure.axes[0]
            if high - low < 1e-3 * abs(middle):  # one value far from 0 (a mask filled with float32's lowest):
                # five ticks that all read -3.4e+38; one, at the value, says it
                x_axis.tick_values, x_axis.tick_format = np.array([float(middle)]), ".4g"
            else:
                x_axis.tick_values, x_axis.tick_format = None, X_TICKS
            y_scale.max = float(top) * 1.05 if top else 1.0
            figure.axes[1].tick_values = np.array(count_ticks(top or 1))
            figure.title = title
        else:
            figure.title = f"{title}: nothing finite to draw"
        figure.marks = marks
    if legend is not None:
        legend.value = histogram_legend(sorted(histograms), identical_groups(histograms))


def histogram_legend(ranks, identical=()):
    """A one-line colour key of *ranks* (HTML), for beside a histogram figure; *identical*: groups of ranks whose
    histograms are the same, said after the key."""
    key = "".join(f"<span style='margin-right:10px;font-size:12px'>{rank_label(rank, f'rank {rank}')}</span>"
                  for rank in ranks)
    same = "".join(f"<span style='font-size:12px;margin-left:4px'>"
                   f"{'every rank' if len(group) == len(ranks) else label_ranks(group)} identical "
                   "(nested bands)</span>" for group in identical)
    return f"<div style='line-height:1.9'>{key}{same}</div>"
