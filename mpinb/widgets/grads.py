"""``%mpi grads model``: per layer, every rank's gradient norm and whether ranks agree on gradients and weights.

:func:`grad_report` turns the ranks' statistics into plain :class:`LayerReport` s with their flags;
:func:`grads_text` and :func:`grads_widget` render them (a layer × rank heatmap, a table, per-rank histograms).
"""

import math
import statistics
from dataclasses import dataclass, field
from html import escape as _escape

from ..wire.ranks import label_ranks
from .colors import NAN_COLOR, WRAP, color, tint
from .text import aligned, number

RTOL = 1e-6
HEATMAP_TITLE = "grad norm ÷ median rank"
HEATMAP_LEGEND = "1 white, less red, more blue; NaN grey"


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
    nan: dict = field(default_factory=dict)  # rank -> NaN count of the parameter (buffer); inf likewise
    inf: dict = field(default_factory=dict)
    grad_nan: dict = field(default_factory=dict)
    grad_inf: dict = field(default_factory=dict)

    @property
    def nonfinite(self):
        """Whether some rank holds a NaN or Inf in this layer's weights or gradient."""
        return any(any(counts.values()) for counts in (self.nan, self.inf, self.grad_nan, self.grad_inf))


def grad_report(per_rank, *, rtol=RTOL):
    """*per_rank*: rank → ``grad_stats()`` of that rank. A difference counts when it exceeds *rtol* × rank 0's
    largest absolute value (or is NaN: a NaN or Inf on one of the two ranks only). Where some rank holds NaN or
    Inf, the layer's flags say that, and only that: a NaN spread by an allreduce is not a seed problem."""
    ranks = sorted(per_rank)
    reports = []
    for layer, first in per_rank[ranks[0]].items():
        report = LayerReport(layer, first["kind"], tuple(first["shape"]))
        for rank in ranks:
            stats = per_rank[rank][layer]
            report.norm[rank] = stats["norm"]
            report.nan[rank], report.inf[rank] = _counts(stats, "")
            if _differs(stats["diff"], first["scale"], rtol):
                report.param_ranks.append(rank)
            report.diff = _max(report.diff, stats["diff"])
            if "grad_norm" in stats:
                report.grad_norm[rank] = stats["grad_norm"]
                report.grad_nan[rank], report.grad_inf[rank] = _counts(stats, "grad_")
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


def _counts(stats, prefix):
    """NaN and Inf counts of a rank's statistics (from the norm where an older rank sent none)."""
    norm = stats[f"{prefix}norm"]
    nan = stats.get(f"{prefix}nan", 1 if math.isnan(norm) else 0)
    return nan, stats.get(f"{prefix}inf", 1 if math.isinf(norm) else 0)


def _flags(report):
    """NaN and Inf first and alone; else which ranks' weights (buffers) and gradients differ, and a likely cause."""
    what = "buffer" if report.kind == "buffer" else "weights"
    bad_weights = _nonfinite_flags(report.nan, report.inf, what)
    bad_grads = _nonfinite_flags(report.grad_nan, report.grad_inf, "gradient")
    if bad_weights or bad_grads:
        return bad_weights + bad_grads
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
    return flags


def _nonfinite_flags(nan, inf, what):
    flags = []
    nan_ranks = [rank for rank, count in sorted(nan.items()) if count]
    inf_ranks = [rank for rank, count in sorted(inf.items()) if count and not nan.get(rank)]
    if nan_ranks:
        flags.append(f"NaN {what} on {label_ranks(nan_ranks)}")
    if inf_ranks:
        flags.append(f"Inf {what} on {label_ranks(inf_ranks)}")
    return flags


def grads_text(reports):
    """One line per layer: gradient norm per rank, cross-rank max |Δ| of gradients and weights, flags."""
    if not reports:
        return "no parameters"
    ranks = sorted(reports[0].norm)
    header = ["layer", "shape", *(f"|grad| r{r}" for r in ranks), "grad max|Δ|", "weight max|Δ|", "flags"]
    table = [header]
    for report in reports:
        norms = [number(report.grad_norm.get(r)) for r in ranks]
        table.append([report.layer + (" (buffer)" if report.kind == "buffer" else ""), str(report.shape), *norms,
                      number(report.grad_diff) if report.grad_norm else "", number(report.diff),
                      "; ".join(report.flags)])
    return "\n".join([_verdict(reports), *aligned(table)])


def _verdict(reports):
    nonfinite = [r.layer for r in reports if r.nonfinite]
    flagged = [r.layer for r in reports if r.flags and not r.nonfinite]
    parts = []
    if nonfinite:
        parts.append(f"NaN or Inf in {len(nonfinite)} of {len(reports)} layers: {', '.join(nonfinite)}")
    if flagged:
        parts.append(f"ranks disagree on {len(flagged)} of {len(reports)} layers: {', '.join(flagged)}")
    if parts:
        return "; ".join(parts)
    return f"all {len(reports[0].norm)} ranks agree on every layer's weights and gradients"


def grads_widget(reports):
    """Heatmap of gradient norms (layer × rank, relative to the layer's median rank), the table with flags,
    and per-rank gradient histograms of the layer picked in the dropdown."""
    import bqplot
    import ipywidgets as w
    import numpy as np

    from .charts import NullColorGridHeatMap, draw_histograms, histogram_figure

    ranks = sorted(reports[0].norm) if reports else []
    with_grads = [r for r in reports if r.grad_norm]
    ratio = np.array([[norm_ratio(r.grad_norm, rank) for rank in ranks] for r in with_grads]) if with_grads else None
    heatmap = None
    if ratio is not None:
        scales = {"row": bqplot.OrdinalScale(reverse=True), "column": bqplot.OrdinalScale(),
                  "color": bqplot.ColorScale(scheme="RdBu", min=0.0, mid=1.0, max=2.0)}
        grid = NullColorGridHeatMap(color=ratio, row=[r.layer for r in with_grads], null_color=NAN_COLOR,
                                    column=[f"rank {rank}" for rank in ranks], scales=scales)
        legend = bqplot.ColorAxis(scale=scales["color"], side="right", num_ticks=5, label=HEATMAP_LEGEND)
        # bqplot draws a vertical colour bar 100 px short of the plot's top and bottom, its label centred above it,
        # unwrapped: the plot is at least 300 px high (a bar of 100 px for five ticks), the right margin holds the
        # label's width on both sides of the bar
        longest = max(len(r.layer) for r in with_grads)
        left = min(240, 24 + 7 * longest)
        right = 40 + 7 * len(HEATMAP_LEGEND)
        plot_width = max(240, 60 * len(ranks))
        plot_height = max(300, 28 * len(with_grads))
        heatmap = bqplot.Figure(marks=[grid], title=HEATMAP_TITLE,
                                axes=[bqplot.Axis(scale=scales["column"]),
                                      bqplot.Axis(scale=scales["row"], side="left"), legend],
                                fig_margin={"top": 40, "bottom": 30, "left": left, "right": right},
                                layout=w.Layout(width=f"{left + plot_width + right}px",
                                                height=f"{40 + plot_height + 30}px"))
    table = w.HTML(grads_table_html(reports))
    chooser = w.Dropdown(options=[r.layer for r in with_grads], description="layer", layout=w.Layout(width="auto"))
    histogram = histogram_figure("gradient histogram per rank", "gradient", "480px")
    legend = w.HTML()

    def show(change=None):
        report = next(r for r in with_grads if r.layer == chooser.value)
        draw_histograms(histogram, {rank: report.histograms[rank] for rank in ranks if report.histograms.get(rank)},
                        legend=legend)

    chooser.observe(show, names="value")
    if with_grads:
        flagged = [r.layer for r in with_grads if r.flags]
        chooser.value = flagged[0] if flagged else with_grads[0].layer
        show()
    top = [heatmap] if heatmap is not None else []
    charts = w.Box(top + [w.VBox([chooser, legend, histogram])], layout=w.Layout(display="flex", flex_flow="row wrap"))
    box = w.VBox([charts, table])
    box.reports, box.chooser, box.heatmap, box.histogram, box.table = reports, chooser, heatmap, histogram, table
    box.legend = legend
    return box


def grads_table_html(reports):
    """The verdict, one note per flag that several layers share, and the table (rows point to shared notes)."""
    ranks = sorted(reports[0].norm) if reports else []
    shared = _shared_flags(reports)
    header = ["layer", "shape", *(f"|grad| rank {r}" for r in ranks), "grad max |Δ|", "weight max |Δ|", "flags"]
    cell = "text-align:left;padding:0 12px 0 0;white-space:nowrap"
    head = "".join(f"<th style='{cell}'>{_escape(h)}</th>" for h in header)
    body = []
    for report in reports:
        cells = [report.layer + (" (buffer)" if report.kind == "buffer" else ""), str(report.shape)]
        cells += [number(report.grad_norm.get(r)) for r in ranks]
        cells += [number(report.grad_diff) if report.grad_norm else "", number(report.diff)]
        tds = "".join(f"<td style='{cell}'>{_escape(c)}</td>" for c in cells)
        flags = "<br>".join(_escape(f"[{shared[flag][0]}] {_head(flag)}" if flag in shared else flag)
                            for flag in report.flags)
        style = f" style='{tint('flag')}'" if report.flags else ""
        body.append(f"<tr{style}>{tds}<td style='{color('error')};text-align:left;min-width:14em;{WRAP}'>{flags}</td>"
                    "</tr>")
    verdict = _escape(_verdict(reports) if reports else "no parameters")
    notes = "".join(f"<div style='{color('error')};font-size:12px;{WRAP}'>[{number}] on {count} layers: "
                    f"{_escape(flag)}</div>" for flag, (number, count) in shared.items())
    return (f"<div style='{WRAP}'><b>{verdict}</b></div>{notes}<table style='font-family:monospace;font-size:12px;"
            f"border-collapse:collapse'><tr>{head}</tr>{''.join(body)}</table>")


def _shared_flags(reports):
    """``{flag: (note number, layers)}`` for the flags that more than one layer has, in order of appearance."""
    counts = {}
    for report in reports:
        for flag in report.flags:
            counts[flag] = counts.get(flag, 0) + 1
    shared = [flag for flag, count in counts.items() if count > 1]
    return {flag: (number, counts[flag]) for number, flag in enumerate(shared, 1)}


def _head(flag):
    """The part of a flag before its explanation: ``weights differ on ranks 1-3``."""
    return flag.split(":", 1)[0]


def norm_ratio(norms, rank):
    """*rank*'s norm ÷ the median of the ranks' finite norms (NaN where either is missing or not finite)."""
    finite = [norm for norm in norms.values() if math.isfinite(norm)]
    value = norms.get(rank, math.nan)
    if not finite or not math.isfinite(value):
        return math.nan
    median = statistics.median(finite)
    return value / median if median else (1.0 if value == 0 else math.nan)



