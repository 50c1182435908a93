"""``%mpi grads model``: per layer, every rank's gradient norm and whether ranks agree on gradients and weights.

:func:`grad_report` turns the ranks' statistics into plain :class:`LayerReport` s with their flags;
:func:`grads_text` and :func:`grads_widget` render them (a layer × rank heatmap, a table, per-rank histograms).
"""

import math
import statistics
from dataclasses import dataclass, field
from html import escape as _escape

from ..ranks import label_ranks
from .text import aligned

RTOL = 1e-6


@dataclass
class LayerReport:
    layer: str
    kind: str  # "parameter" or "buffer"
    shape: tuple
    norm: dict = field(default_factory=dict)  # rank -> norm of the parameter (buffer)
    grad_norm: dict = field(default_factory=dict)  # rank -> norm of its gradient (parameters with one)
    diff: float = 0.0  # max over ranks of max |x_rank - x_0|
    grad_diff: float = 0.0
    param_ranks: list = field(default_factory=list)  # ranks whose parameter (buffer) differs from rank 0's
    grad_ranks: list = field(default_factory=list)
    histograms: dict = field(default_factory=dict)  # rank -> (counts, edges) of the gradient
    flags: list = field(default_factory=list)


def grad_report(per_rank, *, rtol=RTOL):
    """*per_rank*: rank → ``grad_stats()`` of that rank. A difference counts when it exceeds *rtol* × rank 0's
    largest absolute value (or is NaN)."""
    ranks = sorted(per_rank)
    reports = []
    for layer, first in per_rank[ranks[0]].items():
        report = LayerReport(layer, first["kind"], tuple(first["shape"]))
        for rank in ranks:
            stats = per_rank[rank][layer]
            report.norm[rank] = stats["norm"]
            if _differs(stats["diff"], first["scale"], rtol):
                report.param_ranks.append(rank)
            report.diff = _max(report.diff, stats["diff"])
            if "grad_norm" in stats:
                report.grad_norm[rank] = stats["grad_norm"]
                report.histograms[rank] = stats.get("grad_histogram")
                if _differs(stats["grad_diff"], first["grad_scale"], rtol):
                    report.grad_ranks.append(rank)
                report.grad_diff = _max(report.grad_diff, stats["grad_diff"])
        report.flags = _flags(report)
        reports.append(report)
    return reports


def _differs(diff, scale, rtol):
    return math.isnan(diff) or diff > rtol * scale


def _max(a, b):
    return b if math.isnan(b) or b > a else a


def _flags(report):
    flags = []
    if report.param_ranks:
        where = label_ranks(report.param_ranks)
        if report.kind == "buffer":
            flags.append(f"buffer differs on {where}: unsynchronised BatchNorm statistics?")
        else:
            flags.append(f"weights differ on {where}: different initial seeds, no broadcast from rank 0, "
                         "or steps taken with gradients not averaged?")
    if report.grad_ranks:
        flags.append(f"gradients differ on {label_ranks(report.grad_ranks)}: "
                     + ("a rank skipped the allreduce?" if not report.param_ranks else "follows from the weights"))
    if any(math.isnan(n) for n in report.grad_norm.values()):
        bad = [r for r, n in report.grad_norm.items() if math.isnan(n)]
        flags.append(f"NaN gradient on {label_ranks(bad)}")
    return flags


def grads_text(reports):
    """One line per layer: gradient norm per rank, cross-rank max |Δ| of gradients and weights, flags."""
    if not reports:
        return "no parameters"
    ranks = sorted(reports[0].norm)
    header = ["layer", "shape", *(f"|grad| r{r}" for r in ranks), "grad max|Δ|", "weight max|Δ|", "flags"]
    table = [header]
    for report in reports:
        norms = [_number(report.grad_norm.get(r)) for r in ranks]
        table.append([report.layer + (" (buffer)" if report.kind == "buffer" else ""), str(report.shape), *norms,
                      _number(report.grad_diff) if report.grad_norm else "", _number(report.diff),
                      "; ".join(report.flags)])
    return "\n".join([_verdict(reports), *aligned(table)])


def _verdict(reports):
    flagged = [r.layer for r in reports if r.flags]
    if flagged:
        return f"ranks disagree on {len(flagged)} of {len(reports)} layers: {', '.join(flagged)}"
    return f"all {len(reports[0].norm)} ranks agree on every layer's weights and gradients"


def grads_widget(reports):
    """Heatmap of gradient norms (layer × rank, relative to the layer's median rank), the table with flags,
    and per-rank gradient histograms of the layer picked in the dropdown."""
    import bqplot
    import ipywidgets as w
    import numpy as np

    from .charts import draw_histograms, histogram_figure

    ranks = sorted(reports[0].norm) if reports else []
    with_grads = [r for r in reports if r.grad_norm]
    ratio = np.array([[_ratio(r.grad_norm, rank) for rank in ranks] for r in with_grads]) if with_grads else None
    heatmap = None
    if ratio is not None:
        scales = {"row": bqplot.OrdinalScale(reverse=True), "column": bqplot.OrdinalScale(),
                  "color": bqplot.ColorScale(scheme="RdBu", min=0.0, mid=1.0, max=2.0)}
        grid = bqplot.GridHeatMap(color=ratio, row=[r.layer for r in with_grads],
                                  column=[f"rank {rank}" for rank in ranks], scales=scales)
        heatmap = bqplot.Figure(marks=[grid], title="grad norm ÷ layer's median rank: white 1, red less, blue more",
                                axes=[bqplot.Axis(scale=scales["column"]),
                                      bqplot.Axis(scale=scales["row"], side="left")],
                                fig_margin={"top": 40, "bottom": 30, "left": 120, "right": 20},
                                layout=w.Layout(width="480px", height=f"{max(220, 28 * len(with_grads) + 80)}px"))
    table = w.HTML(_table_html(reports))
    chooser = w.Dropdown(options=[r.layer for r in with_grads], description="layer", layout=w.Layout(width="auto"))
    histogram = histogram_figure("gradient histogram per rank", "gradient", "480px")

    def show(change=None):
        report = next(r for r in with_grads if r.layer == chooser.value)
        draw_histograms(histogram, {rank: report.histograms[rank] for rank in ranks if report.histograms.get(rank)})

    chooser.observe(show, names="value")
    if with_grads:
        flagged = [r.layer for r in with_grads if r.flags]
        chooser.value = flagged[0] if flagged else with_grads[0].layer
        show()
    top = [heatmap] if heatmap is not None else []
    box = w.VBox([w.HBox(top + [w.VBox([chooser, histogram])]), table])
    box.reports, box.chooser, box.heatmap, box.histogram, box.table = reports, chooser, heatmap, histogram, table
    return box


def _table_html(reports):
    ranks = sorted(reports[0].norm) if reports else []
    header = ["layer", "shape", *(f"|grad| rank {r}" for r in ranks), "grad max |Δ|", "weight max |Δ|", "flags"]
    head = "".join(f"<th align=left style='padding-right:12px;white-space:nowrap'>{_escape(h)}</th>" for h in header)
    body = []
    for report in reports:
        cells = [report.layer + (" (buffer)" if report.kind == "buffer" else ""), str(report.shape)]
        cells += [_number(report.grad_norm.get(r)) for r in ranks]
        cells += [_number(report.grad_diff) if report.grad_norm else "", _number(report.diff)]
        tds = "".join(f"<td style='padding-right:12px;white-space:nowrap'>{_escape(c)}</td>" for c in cells)
        flags = "<br>".join(_escape(flag) for flag in report.flags)
        style = " style='background:#fdecea'" if report.flags else ""
        body.append(f"<tr{style}>{tds}<td style='color:#c62828'>{flags}</td></tr>")
    verdict = _escape(_verdict(reports) if reports else "no parameters")
    return (f"<b>{verdict}</b><table style='font-family:monospace;font-size:12px'><tr>{head}</tr>"
            f"{''.join(body)}</table>")


def _ratio(norms, rank):
    median = statistics.median(norms.values())
    value = norms.get(rank, math.nan)
    return value / median if median else (1.0 if value == 0 else math.nan)


def _number(value):
    return "" if value is None else f"{value:.4g}"


