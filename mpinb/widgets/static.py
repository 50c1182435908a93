"""Static renderings of every view: what a cell's output keeps once the cell ended, for a notebook reopened
without a kernel, nbconvert's HTML, nbviewer and GitHub's preview.

Each function returns a MIME bundle: ``text/html`` (tables, with the charts as embedded PNG images),
``image/png`` (the charts alone, for renderers that show images but not HTML) and ``text/plain`` (what a
terminal prints). Charts are drawn with matplotlib's Agg backend through its object API (no pyplot state, no
display, nothing shared between threads), in the same colours as the live bqplot charts, on an opaque white
background of their own (texts in dark colours on it, never in a light rank colour). On a dark page (JupyterLab's
dark theme, a notebook reopened in it, nbconvert's ``--theme dark``) a rule that comes with each image turns its
lightness over and its hues back, so that the chart is dark paper with light texts there rather than a white block;
where styles are stripped (GitHub's preview) the image shows as drawn.
"""

import base64
import html
import io
import math

import numpy as np

from ..wire.ranks import label_ranks
from .colors import NAN_COLOR, identical_groups, rank_color, stacked_widths

DPI = 100
NAN_COLOUR = NAN_COLOR
PAPER = "#ffffff"  # every chart's background: opaque, so that its dark texts read in a dark theme too
INK = "#222222"  # texts drawn over curves (in a rank's colour, a light one would not read on PAPER)
def bundle(text, html_parts, images=()):
    """A MIME bundle of *text*, the HTML *html_parts* joined, and the first of *images* (base64 PNGs) as the
    bundle's ``image/png``."""
    data = {"text/plain": text, "text/html": "".join(html_parts)}
    if images:
        data["image/png"] = images[0]
    return data


# JupyterLab marks its page with the theme's lightness (and nbconvert's HTML does the same); invert(0.88) makes the
# white paper #1f1f1f, near the dark theme's own #111, and hue-rotate(180deg) turns the inverted rank colours back
DARK_PAGE = ("<style>[data-jp-theme-light='false'] img.mpinb-chart"
             "{filter:invert(0.88) hue-rotate(180deg)}</style>")


def img(png, alt):
    """An ``<img>`` embedding base64 *png*, with the rule that darkens it on a dark page."""
    return (f"{DARK_PAGE}<img class='mpinb-chart' src='data:image/png;base64,{png}' "
            f"alt='{html.escape(alt, quote=True)}' style='max-width:100%'>")


def figure(width, height, *, left=60, right=20, top=28, bottom=40, between=(60, 60)):
    """A matplotlib Figure of *width* × *height* pixels, not registered with pyplot, with margins in pixels
    (a layout engine would find them too, at about twice the cost of drawing)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, facecolor=PAPER)
    fig.pixel_margins = dict(left=left, right=right, top=top, bottom=bottom, between=between)
    return fig


def grid(fig, rows, columns, count=None):
    """The first *count* (all) axes of a *rows* × *columns* grid of *fig* inside its pixel margins, row by row
    (the cells left over get none: an axes costs its ticks even when hidden)."""
    m = fig.pixel_margins
    width, height = fig.get_size_inches() * DPI
    cell_w, cell_h = width / columns, height / rows
    fig.subplots_adjust(left=m["left"] / width, right=1 - m["right"] / width, bottom=m["bottom"] / height,
                        top=1 - m["top"] / height, wspace=m["between"][0] / max(1.0, cell_w - m["between"][0]),
                        hspace=m["between"][1] / max(1.0, cell_h - m["between"][1]))
    count = rows * columns if count is None else count
    return [fig.add_subplot(rows, columns, i + 1) for i in range(count)]


def png(fig):
    """*fig* as a base64 PNG."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, facecolor=PAPER, transparent=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


# ---------------------------------------------------------------------- metrics


def metrics_png(history, runs, **options):
    """:func:`metrics_figure` as a base64 PNG (``None`` when nothing was reported)."""
    fig = metrics_figure(history, runs, **options)
    return None if fig is None else png(fig)


def metrics_figure(history, runs, *, max_points=2000, log=None):
    """One chart per metric of *runs* (a row of up to three per line), one curve per rank in its colour, a
    marker where a rank's value first became NaN or infinite. *log*: ``{(run, name): bool}`` from the live
    view; by default a metric whose positive values span more than three decades is drawn on a log scale."""
    from .decimation import decimate
    from ..wire.kinds import DEFAULT_RUN

    charts = [(run, name) for run in runs for name in history.names.get(run, [])]
    if not charts:
        return None
    columns = min(3, len(charts))
    rows = -(-len(charts) // columns)
    fig = figure(440 * columns, 280 * rows, right=80, between=(140, 70))
    axes = grid(fig, rows, columns, len(charts))
    for ax, (run, name) in zip(axes, charts):
        values_seen, marked = [], 0
        for rank in history.ranks(run):
            series = history.series.get((run, rank, name))
            if series is None or not len(series):
                continue
            steps, values = series.arrays()
            bad = np.flatnonzero(~np.isfinite(values))
            shown_steps, shown = decimate(steps, np.where(np.isfinite(values), values, np.nan), max_points)
            ax.plot(shown_steps, shown, color=rank_color(rank), linewidth=1.3, label=f"rank {rank}")
            values_seen.append(shown[np.isfinite(shown)])
            if len(bad):
                step = steps[bad[0]]
                ax.axvline(step, color=rank_color(rank), linestyle=":", linewidth=1)
                right = step > (steps[0] + steps[-1]) / 2  # the label on the side with room
                # dark text on a white box edged in the rank's colour: readable over the curves it may cross
                ax.annotate(f"rank {rank}: {_nonfinite(values[bad[0]])} from step {step}", (step, 1.0),
                            xycoords=("data", "axes fraction"), xytext=(-3 if right else 3, -12 - 13 * marked),
                            textcoords="offset points", ha="right" if right else "left", fontsize=8, color=INK,
                            bbox=dict(boxstyle="round,pad=0.2", facecolor=PAPER, edgecolor=rank_color(rank),
                                      linewidth=1, alpha=0.9))
                marked += 1
        finite = np.concatenate(values_seen) if values_seen else np.zeros(0)
        wanted = (log or {}).get((run, name))
        if wanted is None:
            wanted = _spans_decades(finite)
        if wanted and len(finite) and finite.min() > 0:
            from matplotlib.ticker import NullFormatter

            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(NullFormatter())  # labelled decades only: minor labels cost and crowd
        _title(ax, name + ("" if run == DEFAULT_RUN else f"  (run {run})"))
        ax.set_xlabel("step", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.25)
        if ax.lines:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


def _spans_decades(values, decades=3):
    positive = values[values > 0] if len(values) else values
    return bool(len(positive) and len(positive) == len(values) and positive.max() / positive.min() > 10 ** decades)


def _nonfinite(value):
    return "NaN" if math.isnan(value) else ("+inf" if value > 0 else "-inf")


def metrics_bundle(history, runs, **options):
    """The live charts and per-rank tables of *runs*, as they stood when the cell ended."""
    from .summary import summary_html, summary_text

    chart = metrics_png(history, runs, **options)
    tables = [summary_html(history, run) for run in runs]
    text = "\n".join(summary_text(history, run) for run in runs)
    parts = ([img(chart, "metrics per rank")] if chart else []) + tables
    return bundle(text, parts, [chart] if chart else [])


# ---------------------------------------------------------------------- histograms and heatmaps


def histograms_png(panels, **options):
    """:func:`histograms_figure` as a base64 PNG (``None`` without panels)."""
    fig = histograms_figure(panels, **options)
    return None if fig is None else png(fig)


def histograms_figure(panels, *, x_label, columns=3, width=300, height=190):
    """Small multiples: *panels* is ``[(title, {rank: (counts, edges)}), ...]``; each panel one step curve per
    rank, on its own scales."""
    if not panels:
        return None
    columns = min(columns, len(panels))
    rows = -(-len(panels) // columns)
    fig = figure(width * columns + 70, height * rows, left=50, right=90, top=24, bottom=36, between=(50, 60))
    axes = grid(fig, rows, columns, len(panels))
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    keyed = set()  # the ranks drawn in some panel
    for ax, (title, histograms) in zip(axes, panels):
        drawn = False
        histograms = {rank: histogram for rank, histogram in histograms.items() if _drawable(histogram)}
        widths = stacked_widths(histograms, base=1.2, step=1.8)  # identical ranks as nested bands, all visible
        for rank, histogram in sorted(histograms.items()):
            counts, edges = (np.asarray(part, dtype=np.float64) for part in histogram)
            ax.stairs(counts, edges, color=rank_color(rank), linewidth=widths[rank], label=f"rank {rank}")
            drawn = True
            keyed.add(rank)
        if not drawn:
            ax.text(0.5, 0.5, "no finite values to draw", ha="center", va="center", transform=ax.transAxes,
                    fontsize=9, color=NAN_COLOUR)
            ax.set_xticks([])
            ax.set_yticks([])
        else:
            ax.locator_params(axis="x", nbins=4)
            ax.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))  # counts
            same = identical_groups(histograms)
            ax.set_xlabel(x_label + "".join(f"; {_ranks(group, len(histograms))} identical" for group in same),
                          fontsize=8)
            low, high = ax.get_xlim()
            middle = (low + high) / 2
            if high - low < 1e-3 * abs(middle):  # one value far from 0 (a mask filled with float32's lowest):
                # matplotlib wrote its offset over the axis label, and the ticks told nothing apart
                ax.set_xticks([middle], [f"{middle:.4g}"])
            else:
                ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))
        _title(ax, _clip(title, 48), size=9)
        ax.tick_params(labelsize=7)
    if keyed:  # one line width in the key: the curves' widths only tell identical ranks apart
        handles = [Line2D([], [], color=rank_color(rank), linewidth=1.5) for rank in sorted(keyed)]
        fig.legend(handles, [f"rank {rank}" for rank in sorted(keyed)], loc="upper right", fontsize=8,
                   frameon=False)
    return fig


def _drawable(histogram):
    if not histogram:
        return False
    counts, edges = (np.asarray(part, dtype=np.float64) for part in histogram)
    return bool(len(counts)) and bool(np.isfinite(edges).all())


def _ranks(group, everyone):
    return "all ranks" if len(group) == everyone else label_ranks(group)


def heatmap_png(rows, columns, values, **options):
    """:func:`heatmap_figure` as a base64 PNG."""
    return png(heatmap_figure(rows, columns, values, **options))


def heatmap_figure(rows, columns, values, *, title, label):
    """A heatmap of *values* (rows × columns; NaN in grey) on a red-white-blue scale centred on 1, with a
    colour bar labelled *label*."""
    from matplotlib.colors import TwoSlopeNorm

    values = np.asarray(values, dtype=np.float64)
    labels = [_clip(row, 32) for row in rows]
    left = 24 + 6 * max((len(label) for label in labels), default=4)  # about 6 px a character at 8 points
    right = 190  # the colour bar (14 px), its tick labels, then the caption beyond them
    width, height = left + max(240, 64 * len(columns)) + right, 78 + 24 * max(2, len(rows))
    fig = figure(width, height, left=left, right=right, top=34, bottom=40)
    ax = grid(fig, 1, 1)[0]
    finite = values[np.isfinite(values)]
    high = max(2.0, float(finite.max()) if len(finite) else 2.0)
    norm = TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=high)
    from matplotlib import colormaps

    cmap = colormaps["RdBu"].with_extremes(bad=NAN_COLOUR)
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=norm, aspect="auto")
    ax.set_xticks(range(len(columns)), columns, fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    fig.text(8 / width, 1 - 8 / height, title, ha="left", va="top", fontsize=10)
    box = ax.get_position()
    bar = fig.colorbar(image, cax=fig.add_axes([box.x1 + 14 / width, box.y0, 14 / width, box.height]))
    bar.ax.tick_params(labelsize=7)
    note = label + ("\n\ngrey: NaN" if np.isnan(values).any() else "")
    # beyond the bar (14 px from the plot, 14 px wide) and its tick labels (about 30 px at 7 points)
    fig.text(box.x1 + (14 + 14 + 40) / width, box.y0 + box.height / 2, note, ha="left", va="center", fontsize=8)
    return fig


def grads_bundle(reports, *, most=6):
    """``%mpi grads``: the heatmap of gradient norms, the table with flags, and the per-rank gradient
    histograms of the flagged layers (else the first ones), *most* of them."""
    from .grads import grads_table_html, grads_text, norm_ratio

    ranks = sorted(reports[0].norm) if reports else []
    with_grads = [r for r in reports if r.grad_norm]
    images, parts = [], []
    if with_grads:
        ratio = [[norm_ratio(r.grad_norm, rank) for rank in ranks] for r in with_grads]
        heat = heatmap_png([r.layer for r in with_grads], [f"rank {rank}" for rank in ranks], ratio,
                           title="gradient norm per layer and rank", label="÷ the layer's\nmedian rank")
        chosen = [r for r in with_grads if r.flags] or with_grads
        panels = [(r.layer, {rank: r.histograms.get(rank) for rank in ranks}) for r in chosen[:most]]
        hist = histograms_png(panels, x_label="gradient")
        images = [heat] + ([hist] if hist else [])
        parts = [img(heat, "gradient norm heatmap")]
        if hist:
            more = f" (the first {most} of {len(chosen)})" if len(chosen) > most else ""
            which = "flagged layers" if any(r.flags for r in with_grads) else "layers"
            parts.append(f"<div style='font-size:12px'>gradient histograms per rank, {which}{more}:</div>")
            parts.append(img(hist, "gradient histograms"))
    parts.append(grads_table_html(reports))
    return bundle(grads_text(reports), parts, images)


def inspector_bundle(reports, *, most=6):
    """The tensor inspector: the verdict of every gathered leaf, each leaf's per-rank table, and the per-rank
    histograms of the leaves that have them (those that differ first), *most* of them."""
    from .inspector import inspector_summary_html, inspector_text, leaf_table_html

    parts = [inspector_summary_html(reports)]
    with_histograms = [r for r in reports if any("histogram" in s for s in r.stats.values())]
    with_histograms.sort(key=lambda r: r.identical)
    panels = [(r.label, {rank: s.get("histogram") for rank, s in r.stats.items()}) for r in with_histograms[:most]]
    hist = histograms_png(panels, x_label="value")
    if hist:
        parts.append(img(hist, "histograms per rank"))
    for report in reports:
        parts.append(f"<div style='margin-top:6px'><code>{html.escape(report.label)}</code>: "
                     f"{html.escape(report.verdict)}</div>{leaf_table_html(report)}")
    return bundle(inspector_text(reports), parts, [hist] if hist else [])


# ---------------------------------------------------------------------- timeline


def _title(ax, text, *, size=10):
    """*text* centred above *ax* (``set_title`` places itself by measuring the axes' tick labels on every draw,
    which costs as much as drawing the chart)."""
    ax.text(0.5, 1.0, text, transform=ax.transAxes, ha="center", va="bottom", fontsize=size)


def _clip(text, width):
    return text if len(text) <= width else text[: width - 1] + "…"
