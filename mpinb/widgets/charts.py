"""Live charts of a :class:`~mpinb.widgets.history.History`: one bqplot figure per metric, one curve per rank,
and the per-rank table under them. Updated in place: each changed curve is one comm message (x and y together,
as binary arrays), so a refresh costs a message per changed curve, whatever the reporting rate.
"""

import bqplot
import ipywidgets as w
import numpy as np

from .colors import rank_color
from .history import decimate
from .summary import summary_html


class MetricsWidget:
    """Charts and table for the runs a cell reports into; call :meth:`refresh` to bring them up to date.

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
        self.lines = {}  # (run, name, rank) -> bqplot.Lines
        self.drawn = {}  # (run, name, rank) -> points of the series when last drawn
        self.messages = 0  # comm messages sent by refreshes (curves and tables), for the benchmark
        self.charts = w.Box(layout=w.Layout(display="flex", flex_flow="row wrap"))
        self.tables = w.HTML()
        self.widget = w.VBox([self.charts, self.tables])

    def show(self, run):
        """Draw *run* too (its charts appear at the next refresh)."""
        if run not in self.runs:
            self.runs.append(run)

    def refresh(self, *, now=None, live=True):
        """Redraw the curves that grew since the last refresh and the table."""
        several_runs = len(self.history.runs()) > 1
        for run in self.runs:
            for name in self.history.names.get(run, []):
                figure = self.figures.get((run, name))
                if figure is None:
                    figure = self.figures[(run, name)] = _figure(f"{name} · run {run}" if several_runs else name)
                    self.charts.children = (*self.charts.children, figure)
                    self.messages += 1
                for rank in self.history.ranks(run):
                    self._draw(figure, run, name, rank)
        tables = "".join(summary_html(self.history, run, now=now, live=live) for run in self.runs)
        if tables != self.tables.value:
            self.tables.value = tables
            self.messages += 1

    def _draw(self, figure, run, name, rank):
        series = self.history.series.get((run, rank, name))
        key = (run, name, rank)
        if series is None or self.drawn.get(key) == len(series):
            return
        self.drawn[key] = len(series)
        steps, values = decimate(*series.arrays(), self.max_points)
        values = np.where(np.isfinite(values), values, np.nan)  # inf would stretch the scale away
        line = self.lines.get(key)
        if line is None:
            line = self.lines[key] = bqplot.Lines(
                x=steps, y=values, scales=figure.marks[0].scales if figure.marks else _scales(),
                colors=[rank_color(rank)], labels=[f"rank {rank}"], display_legend=True, stroke_width=1.5,
            )
            figure.marks = sorted([*figure.marks, line], key=lambda mark: int(mark.labels[0].split()[-1]))
            if len(figure.marks) == 1:
                figure.axes = _axes(line.scales, name)
            self.messages += 2
        else:
            with line.hold_sync():
                line.x, line.y = steps, values
            self.messages += 1


def _figure(title):
    return bqplot.Figure(title=title, marks=[], axes=[], legend_location="top-right",
                         fig_margin={"top": 40, "bottom": 40, "left": 70, "right": 20},
                         layout=w.Layout(width="440px", height="280px"))


def _scales():
    return {"x": bqplot.LinearScale(), "y": bqplot.LinearScale()}


def _axes(scales, name):
    return [bqplot.Axis(scale=scales["x"], label="step", grid_lines="none"),
            bqplot.Axis(scale=scales["y"], side="left", label=name, tick_format=".4~g")]


def histogram_figure(title, x_label, width):
    """An empty figure for per-rank histograms (the tensor inspector's, ``%mpi grads``'s); see :func:`draw_histograms`."""
    x_scale, y_scale = bqplot.LinearScale(), bqplot.LinearScale()
    return bqplot.Figure(marks=[], title=title, legend_location="top-right",
                         axes=[bqplot.Axis(scale=x_scale, label=x_label, tick_format=".3~g"),
                               bqplot.Axis(scale=y_scale, side="left", label="count")],
                         fig_margin={"top": 40, "bottom": 40, "left": 60, "right": 20},
                         layout=w.Layout(width=width, height="300px"))


def draw_histograms(figure, histograms):
    """Draw ``{rank: (counts, edges)}`` into *figure*: one step line per rank, in the rank's colour."""
    scales = {"x": figure.axes[0].scale, "y": figure.axes[1].scale}
    marks = []
    for rank, (counts, edges) in sorted(histograms.items()):
        centres = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
        marks.append(bqplot.Lines(x=centres, y=counts, scales=scales, colors=[rank_color(rank)],
                                  labels=[f"rank {rank}"], display_legend=True, interpolation="step-after"))
    figure.marks = marks
