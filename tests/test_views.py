"""The views' data models and widget traits where they used to mislead: NaN in gradients, gathered tensors and
live curves; histogram scales and legends; shared flags; finished ranks; chart titles and log scales."""

import math

import bqplot
import numpy as np
import pytest

from mpinb.notebook.models.history import History
from mpinb.widgets.grads import grads_table_html, grads_widget
from mpinb.notebook.models.leaf_reports import inspect_gathered
from mpinb.widgets.inspector import (
    inspector_text,
    inspector_widget,
    rows,
)
from mpinb.widgets.summary import summary_html

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]


NAN_TRAINING = """
import torch
from mpi4py import MPI
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
if rank == 2:
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")  # one rank's bad value ...
torch.manual_seed(100 + rank)
model(torch.randn(16, 6)).pow(2).mean().backward()
for p in model.parameters():
    comm.Allreduce(MPI.IN_PLACE, p.grad.numpy())  # ... spread to every rank's gradients by the allreduce
    p.grad /= size
with torch.no_grad():
    for p in model.parameters():
        p -= 0.1 * p.grad  # and from there into every rank's weights
half = torch.nn.Linear(3, 3)  # the same on every rank but rank 1, which holds a NaN
with torch.no_grad():
    half.weight.fill_(0.5)
    half.bias.fill_(0.0)
    if rank == 1:
        half.weight[1, 1] = float("nan")
"""


def test_nan_spread_by_an_allreduce_is_called_nan_not_different_weights(world_of, magics, mpi, capsys):
    world_of(4)
    mpi(NAN_TRAINING)
    capsys.readouterr()
    reports = {r.layer: r for r in magics.show_grads("model")}
    text = capsys.readouterr().out
    for layer in ("0.weight", "0.bias", "2.weight", "2.bias"):
        assert reports[layer].flags == ["NaN weights on ranks 0-3", "NaN gradient on ranks 0-3"], layer
        assert reports[layer].param_ranks == [] and reports[layer].grad_ranks == []  # identical, all NaN
    assert "different initial seeds" not in text and "skipped the allreduce" not in text
    assert text.startswith("NaN or Inf in 4 of 4 layers")
    half = {r.layer: r for r in magics.show_grads("half")}
    assert half["weight"].flags == ["NaN weights on rank 1"]  # NaN on one rank: still about NaN, and only that
    assert half["weight"].nan == {0: 0, 1: 1, 2: 0, 3: 0} and half["bias"].flags == []


def test_heatmap_shows_nan_norms_grey_with_a_colour_bar(world_of, magics, mpi, capsys):
    world_of(4)
    mpi(NAN_TRAINING)
    reports = magics.show_grads("model")
    widget = grads_widget(reports)
    grid = widget.heatmap.marks[0]
    assert np.isnan(grid.color).all()  # every norm is NaN ...
    assert grid.null_color == "#9e9e9e"  # ... and drawn grey, not black
    (legend,) = [axis for axis in widget.heatmap.axes if isinstance(axis, bqplot.ColorAxis)]
    assert legend.scale is grid.scales["color"] and legend.label == "1 white, less red, more blue; NaN grey"
    assert widget.heatmap.title == "grad norm ÷ median rank"  # fits over the heatmap
    assert widget.histogram.marks == () or list(widget.histogram.marks) == []
    assert widget.histogram.title.endswith("nothing finite to draw")


def test_an_all_nan_tensor_says_nan_and_all_nan(world_of, magics, mpi, ip, capsys):
    world_of(2)
    mpi("import torch\nallnan = torch.full((50,), float('nan'))", line="--gather allnan")
    text = capsys.readouterr().out
    result = magics.last
    (report,) = inspect_gathered({"allnan": ip.user_ns["allnan"]}, result.gather_stats)
    assert report.verdict == "all NaN on every rank" and report.identical
    assert "allnan: all NaN on every rank" in text
    for cells in rows(report).values():
        assert cells[3:7] == ["nan", "nan", "nan", "nan"]  # norm, min, max, mean
        assert cells[7] == "50 (all NaN)"
    assert "50 (all NaN)" in inspector_text([report])
    widget = inspector_widget([report])
    assert list(widget.histogram.marks) == []
    assert widget.histogram.title == "histogram per rank: nothing finite to draw"
    assert "all NaN" in widget.table.value


def test_a_live_curve_turning_nan_ends_at_its_last_finite_point_with_a_marker(magics, mpi, fresh, monkeypatch):
    fresh(2)
    monkeypatch.setattr(magics, "live_view", "widgets")
    mpi("""
import math, mpinb
for step in range(60):
    mpinb.report(step=step, loss=math.nan if rank == 1 and step >= 30 else 2.0 + rank + step / 100)
""")
    view = magics.live.view
    line = view.lines[("main", "loss", 1)]
    assert np.isfinite(line.y).all() and line.x[-1] == 29  # no NaN for bqplot to place a label at
    assert view.lines[("main", "loss", 0)].x[-1] == 59
    mark = view.nan_marks[("main", "loss", 1)]
    assert isinstance(mark, bqplot.Scatter) and list(mark.x) == [30] and mark.names == ["NaN from step 30"]
    assert np.isfinite(mark.y).all() and mark.y[0] == pytest.approx(3.29)
    assert ("main", "loss", 0) not in view.nan_marks
    for figure in view.figures.values():
        for each in figure.marks:
            assert np.isfinite(np.asarray(each.y, dtype=float)).all()


GRADS = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 180), torch.nn.ReLU(), torch.nn.Linear(180, 4))
torch.manual_seed(100 + rank)
model(torch.randn(64, 6)).pow(2).mean().backward()
for p in model.parameters():
    comm.Allreduce(MPI.IN_PLACE, p.grad.numpy())
"""


def test_a_tensor_of_one_value_is_drawn_in_one_bin_even_the_lowest_float(world_of, magics, mpi, ip, capsys):
    """Every value the same: one bar holding them all. An attention mask filled with float32's lowest value (as
    transformer code fills one) cannot be cut into 30 bins of +-0.5 around it: np.histogram raised ValueError
    there, and the inspector had no histogram to draw."""
    world_of(2)
    mpi("import torch\nmask = torch.full((40_000,), torch.finfo(torch.float32).min)\n"
        "ones = torch.ones(40_000)", line="--gather mask ones")
    capsys.readouterr()
    for name in ("mask", "ones"):
        (report,) = inspect_gathered({name: ip.user_ns[name]}, magics.last.gather_stats)
        assert report.identical
        for rank in (0, 1):
            counts, edges = report.stats[rank]["histogram"]
            assert sum(counts) == max(counts) == len(range(0, 40_000, report.stats[rank]["histogram_stride"]))
            middle = counts.index(max(counts))
            stats = report.stats[rank]
            assert edges[0] < edges[middle] <= stats["min"] < edges[middle + 1] < edges[-1]
            # summed in float64: float32's sums overflowed to -inf and inf here
            assert stats["mean"] == stats["min"] and stats["norm"] == pytest.approx(abs(stats["min"]) * 200, rel=1e-6)
        widget = inspector_widget([report])
        assert len(widget.histogram.marks) == 2  # a curve per rank (identical ones nested, each visible)
    # the live chart's value axis: one tick at the mask's value (five read "-3.4e+38"), automatic ones again for
    # the next leaf chosen
    reports = inspect_gathered({"mask": ip.user_ns["mask"], "ones": ip.user_ns["ones"]}, magics.last.gather_stats)
    widget = inspector_widget(reports)
    axis, leaf = widget.histogram.axes[0], {report.name: i for i, report in enumerate(reports)}
    for name in ("ones", "mask", "ones"):
        widget.chooser.value = leaf[name]
        if name == "mask":
            assert list(axis.tick_values) == [pytest.approx(float(np.finfo(np.float32).min))]
            assert axis.tick_format == ".4g"
        else:
            assert axis.tick_values is None and axis.tick_format == ".2~g"


def test_picking_another_layer_rescales_the_histogram(world_of, magics, mpi):
    world_of(2)
    mpi(GRADS)
    reports = {r.layer: r for r in magics.show_grads("model")}
    widget = grads_widget(list(reports.values()))
    x, y = widget.histogram.axes[0].scale, widget.histogram.axes[1].scale
    for layer in ("0.weight", "2.bias"):
        widget.chooser.value = layer
        counts, edges = reports[layer].histograms[0]
        assert (x.min, x.max) == (edges[0], edges[-1])
        assert y.min == 0 and y.max == pytest.approx(max(counts) * 1.05)
        assert all(mark.scales["x"] is x for mark in widget.histogram.marks)


def test_histograms_keep_their_legend_out_of_the_plot_and_ticks_apart(world_of, magics, mpi):
    world_of(2)
    mpi(GRADS)
    widget = grads_widget(magics.show_grads("model"))
    assert not any(mark.display_legend for mark in widget.histogram.marks)
    assert "rank 0" in widget.legend.value and "rank 1" in widget.legend.value
    value_axis = widget.histogram.axes[0]
    assert value_axis.num_ticks is not None and value_axis.num_ticks <= 5
    assert widget.histogram.fig_margin["right"] >= 40  # room for the last tick label


def test_a_flag_shared_by_many_layers_is_written_once(world_of, magics, mpi):
    world_of(2)
    mpi("""
import torch
torch.manual_seed(rank)  # the bug: every layer differs
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
model(torch.randn(8, 3)).sum().backward()
""")
    reports = magics.show_grads("model")
    flag = reports[0].flags[0]
    assert flag.startswith("weights differ on rank 1: different initial seeds")
    assert all(flag in report.flags for report in reports)
    table = grads_table_html(reports)
    assert table.count("different initial seeds") == 1 and "[1] on 6 layers: weights differ on rank 1:" in table
    assert table.count("[1] weights differ on rank 1<") == 6


def test_a_rank_that_finished_is_not_silent():
    history = History()
    history.add(0, [("main", step, 100.0 + step, {"loss": 1.0}) for step in range(3)], arrived=10.0)  # done early
    history.add(1, [("main", step, 100.0 + step, {"loss": 1.0}) for step in range(20)], arrived=19.0)
    assert history.silent("main", now=20.0) == {0: 10.0}  # as far as the history knows
    (first, second) = history.summary("main", now=20.0, live=True, finished=[0])
    assert first["notes"] == [] and second["notes"] == []
    assert "no report for" not in summary_html(history, "main", now=20.0, live=True, finished=[0])
    assert history.silent("main", now=20.0, finished=[0]) == {}


def test_chart_titles_stay_the_metric_name_and_a_log_scale_is_offered_for_positive_values(magics, mpi, fresh,
                                                                                              monkeypatch):
    fresh(2)
    monkeypatch.setattr(magics, "live_view", "widgets")
    mpi("import mpinb\nfor step in range(5): mpinb.report(step=step, loss=1.0 - step)")
    first = magics.live.view
    mpi("for step in range(5): mpinb.report(step=step, loss=10.0 ** -step, run='DDP')")
    ddp = magics.live.view
    mpi("for step in range(5, 10): mpinb.report(step=step, loss=1.0 - step, run='main')")
    again = magics.live.view
    for view, run in ((first, "main"), (ddp, "DDP"), (again, "main")):
        assert view.figures[(run, "loss")].title == "loss"
    assert ddp.subtitles[("DDP", "loss")].value == "<small>run DDP</small>"
    assert again.subtitles[("main", "loss")].value == ""
    negative = again.log_toggles[("main", "loss")]
    assert negative.disabled and "positive" in negative.tooltip  # losses down to -8: no log scale
    toggle = ddp.log_toggles[("DDP", "loss")]
    assert not toggle.disabled
    toggle.value = True
    figure = ddp.figures[("DDP", "loss")]
    log = figure.axes[1].scale
    assert isinstance(log, bqplot.LogScale) and all(mark.scales["y"] is log for mark in figure.marks)
    assert figure.axes[0].scale is figure.marks[0].scales["x"]
    toggle.value = False
    assert isinstance(figure.axes[1].scale, bqplot.LinearScale)
    assert all(mark.scales["y"] is figure.axes[1].scale for mark in figure.marks)
    assert math.isclose(min(min(mark.y) for mark in figure.marks), 1e-4)
