"""The tensor inspector shown after ``%%mpi --gather``: per leaf, per rank statistics and one verdict, drawn from
the reports ``notebook/models/leaf_reports.py`` computes: :func:`inspector_text` and :func:`inspector_widget` render
them.
"""

from html import escape

from .colors import WRAP, color, rank_label, tint
from .text import aligned, number

STAT_COLUMNS = ("shape", "dtype", "device", "norm", "min", "max", "mean", "nan", "inf", "max |Δ| to first")


def rows(report):
    """Per-rank cells of :data:`STAT_COLUMNS` (or the value, for scalars), as strings."""
    out = {}
    for rank, stats in sorted(report.stats.items()):
        if "value" in stats:
            out[rank] = [repr(stats["value"])] + [""] * (len(STAT_COLUMNS) - 2) + [number(report.diff[rank])]
            continue
        cells = [str(tuple(stats["shape"])), stats["dtype"], stats["device"]]
        nothing_finite = "nan" in stats and "norm" not in stats  # counted, but no finite value to describe
        cells += ["nan" if nothing_finite else number(stats.get(key)) for key in ("norm", "min", "max", "mean")]
        nan = f"{stats['nan']} (all NaN)" if report.all_nan(rank) else str(stats.get("nan", ""))
        cells += [nan, str(stats.get("inf", "")), number(report.diff.get(rank))]
        out[rank] = cells
    return out


def inspector_text(reports):
    """Every leaf: a verdict line, then one aligned line per rank."""
    blocks = []
    for report in reports:
        table = [("rank", *STAT_COLUMNS)] + [(str(rank), *cells) for rank, cells in rows(report).items()]
        blocks.append("\n".join([f"{report.label}: {report.verdict}", *("  " + line for line in aligned(table))]))
    return "\n\n".join(blocks)


def inspector_widget(reports):
    """A summary of every leaf, and for the selected one the per-rank table and histograms (bqplot)."""
    import ipywidgets as w

    from .charts import draw_histograms, histogram_figure

    summary = w.HTML(inspector_summary_html(reports))
    chooser = w.Dropdown(options=[(r.label, i) for i, r in enumerate(reports)], description="leaf",
                         layout=w.Layout(width="auto"))
    table = w.HTML()
    histogram = histogram_figure("histogram per rank", "value", "520px")
    legend = w.HTML()

    def show(change=None):
        report = reports[chooser.value]
        table.value = leaf_table_html(report)
        draw_histograms(histogram, {rank: stats["histogram"] for rank, stats in report.stats.items()
                                    if "histogram" in stats}, legend=legend)

    chooser.observe(show, names="value")
    if reports:
        show()
    body = w.Box([table, w.VBox([legend, histogram])], layout=w.Layout(display="flex", flex_flow="row wrap"))
    box = w.VBox([summary, chooser, body] if reports else [summary])
    box.reports, box.chooser, box.table, box.histogram, box.legend = reports, chooser, table, histogram, legend
    return box


def inspector_summary_html(reports):
    """One row per gathered leaf: its name, shape, dtype and verdict (the head of the live inspector and of the
    static one)."""
    cell = "text-align:left;padding:0 12px 0 0;vertical-align:top"
    body = []
    for report in reports:
        kind = "ok" if report.verdict == "identical on all ranks" else "error"
        first = next(iter(report.stats.values()), {})
        shape = str(tuple(first["shape"])) if "shape" in first else type(first.get("value")).__name__
        body.append(f"<tr><td style='{cell}'><code>{_escape(report.label)}</code></td>"
                    f"<td style='{cell};white-space:nowrap'>{shape}</td>"
                    f"<td style='{cell}'>{first.get('dtype', '')}</td>"
                    f"<td style='{cell};{color(kind)};{WRAP}'><b>{_escape(report.verdict)}</b></td></tr>")
    head = "".join(f"<th style='{cell}'>{name}</th>" for name in ("gathered", "shape", "dtype", "verdict"))
    return f"<table style='font-size:12px;border-collapse:collapse'><tr>{head}</tr>{''.join(body)}</table>"


def leaf_table_html(report):
    """One leaf's per-rank statistics, the ranks that differ or hold NaN/Inf tinted."""
    cell = "text-align:left;padding:0 10px 0 0;white-space:nowrap"
    head = "".join(f"<th style='{cell}'>{c}</th>" for c in ("rank", *STAT_COLUMNS))
    body = []
    for rank, cells in rows(report).items():
        flagged = rank in report.differing or report.stats[rank].get("nan") or report.stats[rank].get("inf")
        style = f" style='{tint('flag')}'" if flagged else ""
        tds = "".join(f"<td style='{cell}'>{_escape(c)}</td>" for c in cells)
        body.append(f"<tr{style}><td style='{cell}'>{rank_label(rank)}</td>{tds}</tr>")
    return (f"<table style='font-family:monospace;font-size:12px;border-collapse:collapse'><tr>{head}</tr>"
            f"{''.join(body)}</table>")


def _escape(text):
    return escape(str(text))


