"""Live charts of a :class:`~mpinb.notebook.history.History`: one bqplot figure per metric, one curve per rank,
and the per-rank table under them. Updated in place: each changed curve is one comm message (x and y together,
as binary arrays), so a refresh costs a message per changed curve, whatever the reporting rate.
"""

import html

import bqplot
import ipywidgets as w
import numpy as np

from ..notebook.history import decimate
from ..rank.report import DEFAULT_RUN
from .colors import rank_color
from .summary import summary_html


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
    return bqplot.Scatter(x=[int(steps[first])], y=[y], scales=scales, colors=[rank_color(rank)], marker="cross",
                          default_size=80, names=[label], display_names=True, labels=[f"rank {rank}: {label}"],
                          display_legend=False, tooltip=bqplot.Tooltip(fields=["name"], labels=[f"rank {rank}"]))


def _figure(title):
    return bqplot.Figure(title=title, marks=[], axes=[], legend_location="top-right",
                         fig_margin={"top": 30, "bottom": 40, "left": 70, "right": 20},
                         layout=w.Layout(width="440px", height="280px"))


def _scales():
    return {"x": bqplot.LinearScale(), "y": bqplot.LinearScale()}


def _axes(scales, name):
    return [bqplot.Axis(scale=scales["x"], label="step", grid_lines="none"),
            bqplot.Axis(scale=scales["y"], side="left", label=name, tick_format=".4~g")]


def histogram_figure(title, x_label, width):
    """An empty figure for per-rank histograms (the tensor inspector's, ``%mpi grads``'s); see :func:`draw_histograms`.

    Few, compact ticks on the value axis (labels like ``-0.15`` would run into each other) and a right margin for
    the last one; no legend inside the plot, where it would cover the peaks: :func:`histogram_legend` is the key.
    """
    x_scale, y_scale = bqplot.LinearScale(), bqplot.LinearScale(min=0.0)
    figure = bqplot.Figure(marks=[], title=title,
                           axes=[bqplot.Axis(scale=x_scale, label=x_label, tick_format=".2~g", num_ticks=5),
                                 bqplot.Axis(scale=y_scale, side="left", label="count", tick_format="~s",
                                             num_ticks=5)],
                           fig_margin={"top": 40, "bottom": 40, "left": 60, "right": 40},
                           layout=w.Layout(width=width, height="300px"))
    figure.base_title = title  # the title without the "nothing finite" note
    return figure


def draw_histograms(figure, histograms, *, legend=None):
    """Draw ``{rank: (counts, edges)}`` into *figure*: one step line per rank, in the rank's colour, both axes
    scaled to these histograms (not to the ones drawn before). Without any, the title says there is nothing finite
    to draw. *legend*, an ``ipywidgets.HTML``, gets the ranks' colour key."""
    x_scale, y_scale = figure.axes[0].scale, figure.axes[1].scale
    scales = {"x": x_scale, "y": y_scale}
    title = getattr(figure, "base_title", figure.title)
    marks = []
    low = high = top = None
    for rank, (counts, edges) in sorted(histograms.items()):
        centres = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
        marks.append(bqplot.Lines(x=centres, y=counts, scales=scales, colors=[rank_color(rank)],
                                  labels=[f"rank {rank}"], display_legend=False, interpolation="step-after"))
        low = min(edges[0], low) if low is not None else edges[0]
        high = max(edges[-1], high) if high is not None else edges[-1]
        top = max(max(counts, default=0), top or 0)
    with figure.hold_sync():
        if marks:
            if high <= low:  # every value the same: a unit-wide window around it
                low, high = low - 0.5, high + 0.5
            with x_scale.hold_sync():
                x_scale.min, x_scale.max = float(low), float(high)
            y_scale.max = float(top) * 1.05 if top else 1.0
            figure.title = title
        else:
            figure.title = f"{title}: nothing finite to draw"
        figure.marks = marks
    if legend is not None:
        legend.value = histogram_legend(sorted(histograms))


def histogram_legend(ranks):
    """A one-line colour key of *ranks* (HTML), for beside a histogram figure."""
    return "".join(f"<span style='color:{rank_color(rank)};margin-right:8px;font-size:12px'>&#9632; rank {rank}</span>"
                   for rank in ranks)
