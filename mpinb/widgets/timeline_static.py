"""The static rendering of a traced cell's timeline: the same picture as the live widget (``timeline.py``), as a PNG
with its own white background, for a notebook saved or exported, and the MIME bundle that holds it with the
trace's summary."""

import numpy as np

from .idle_folding import Folding
from .timeline_drawing import LANE, MIN_WIDTH, STEP_COLOR, WAIT_COLOR, Drawing, bucketed
from .trace_summary import summary_html, summary_text

BAND_COLOR = "#e3e3e3"  # a folded idle stretch in the PNG (on its own white background) ...
BAND_TEXT = "#262626"  # ... and its label, on it (11.8:1)
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
            begin, finish = bucketed(starts, ends, 0.0, extent, buckets)
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
