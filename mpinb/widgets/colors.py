"""One colour per rank, the same in every chart and table (matplotlib's tab10, then tab20's lighter shades), and the
colours of every view's text and highlights, readable in JupyterLab's Light and Dark themes and in an HTML export.

No colour reads on both a white and a near-black page (WCAG AA asks a contrast of 4.5), so the views' HTML colours
come from the theme: coloured text is the hue mixed with the theme's text colour (``color-mix`` with
``var(--jp-content-font-color0)``: darker in a light theme, lighter in a dark one), highlighted rows are a
semi-transparent tint over whatever background the theme draws, and muted text is the theme's text colour, part
transparent. Where JupyterLab's variables are missing (an HTML export, a plain browser) their fallbacks are those of
the Light theme; a renderer without ``color-mix`` reads the plain colour written before it (:data:`FALLBACKS`, each
readable on white and on the tints). In tables a rank is its number in the theme's text colour after a swatch of
its exact chart colour, ringed so that it shows on any page: every rank looks alike but for its hue, so none reads
as flagged (a rank's coloured number on a chip of black or white, whichever it read on, made rank 1's orange on black
look marked next to rank 0's blue on white).
"""

PALETTE = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
]
NAN_COLOR = "#9e9e9e"  # NaN in every chart and heatmap, live and static

TEXT = "var(--jp-content-font-color1, #1a1a1a)"  # for SVG text (bqplot legends), which does not inherit CSS color
_INK = "var(--jp-content-font-color0, #000)"  # the theme's strongest text colour: black, or white in a dark theme

# (hue, share of the hue in the mix with the theme's text colour): at least 5 to 1 on the theme's backgrounds and
# on the tints below, in JupyterLab Light and Dark
HUES = {"error": ("#d32f2f", 60), "ok": ("#2e7d32", 62), "warn": ("#ef6c00", 60)}
# what a renderer without color-mix shows: readable on white and on the tints' fallbacks
FALLBACKS = {"error": "#c62828", "ok": "#1b5e20", "warn": "#a84300", "muted": "#595959"}
FLAG_TINT = ((229, 57, 53), 0.16)  # a row that needs a look: rgb and alpha over the theme's background
QUIET_TINT = ((128, 128, 128), 0.14)  # a row that differs by design
TINT_FALLBACKS = {"flag": "#fdecea", "quiet": "#f3f4f8"}


def rank_color(rank):
    return PALETTE[rank % len(PALETTE)]


def swatch(rank):
    """A small square of *rank*'s chart colour (HTML), with a grey ring that shows it on a white page and on a
    black one: the key from a rank's number to its curves."""
    return ("<span style='display:inline-block;width:.7em;height:.7em;border-radius:2px;vertical-align:-.05em;"
            f"margin-right:.35em;background:{rank_color(rank)};box-shadow:0 0 0 1px rgba(128,128,128,.6)'></span>")


def rank_label(rank, text=None):
    """*text* (the rank's number) in bold, in the theme's text colour, after the rank's :func:`swatch`: HTML."""
    text = str(rank) if text is None else text
    return f"<span style='white-space:nowrap'>{swatch(rank)}<b>{text}</b></span>"


def color(kind):
    """CSS declarations giving text the colour of *kind* (``error``, ``ok``, ``warn``, ``muted``) in the theme."""
    if kind == "muted":
        return f"color:{FALLBACKS['muted']};color:color-mix(in srgb, {_INK} 64%, transparent)"
    hue, share = HUES[kind]
    return f"color:{FALLBACKS[kind]};color:color-mix(in srgb, {hue} {share}%, {_INK})"


def tint(kind):
    """CSS declarations giving a row the background of *kind* (``flag``: needs a look; ``quiet``: differs by
    design): a semi-transparent tint over the theme's background."""
    (r, g, b), alpha = FLAG_TINT if kind == "flag" else QUIET_TINT
    return (f"background:{TINT_FALLBACKS[kind]};"
            f"background:color-mix(in srgb, rgb({r}, {g}, {b}) {round(alpha * 100)}%, transparent)")


# Wrap long text between words, and inside a word only where one word is longer than the line (JupyterLab breaks
# its outputs' <pre> anywhere: "cal" / "l").
WRAP = "white-space:normal;word-break:normal;overflow-wrap:break-word"


def identical_groups(histograms):
    """Ranks whose histograms (``{rank: (counts, edges)}``) are the same, as sorted lists of two ranks or more."""
    groups = {}
    for rank, histogram in sorted(histograms.items()):
        if not histogram:
            continue
        counts, edges = histogram
        key = (tuple(float(c) for c in counts), tuple(float(e) for e in edges))
        groups.setdefault(key, []).append(rank)
    return [ranks for ranks in groups.values() if len(ranks) > 1]


def stacked_widths(histograms, base=1.5, step=2.0, widest=9.0):
    """``{rank: line width}`` so that each rank's colour stays visible where ranks' curves are the same: within a
    group of identical histograms the lowest rank is drawn widest (first, underneath), each next one narrower on
    top of it, so every colour shows as a band; a curve shared by no other rank keeps *base*."""
    widths = {rank: base for rank in histograms}
    for ranks in identical_groups(histograms):
        gap = min(step, (widest - base) / max(1, len(ranks) - 1))
        for position, rank in enumerate(ranks):
            widths[rank] = base + gap * (len(ranks) - 1 - position)
    return widths
