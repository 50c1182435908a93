"""A traced cell's summary drawn: the sentence saying who held whom up, then one row per rank (its communication and
compute time, bytes, waits, slowest call), as aligned text for terminals and as an HTML table. The summary itself
is computed in ``notebook/models/traces.py``."""

import html

from .colors import rank_color
from .text import aligned, duration, size


def _cells(summary):
    """The table's header and ``(rank, cells)`` per rank, as text."""
    header = ["rank", "calls", "comm", "compute", "comm %", "sent", "received", "waited", "slowest", "notes"]
    rows = []
    for row in summary.per_rank:
        note = "straggler" if row["rank"] == summary.straggler else ""
        rows.append((row["rank"], [str(row["rank"]), str(row["calls"]), duration(row["comm_seconds"]),
                                   duration(row["compute_seconds"]), f"{100 * row['comm_share']:.0f}%",
                                   size(row["sent"]), size(row["received"]), duration(row["waited"]),
                                   row["slowest"], note]))
    return header, rows


def summary_text(summary):
    """The sentence, then an aligned table with one line per rank (for terminals)."""
    header, rows = _cells(summary)
    return "\n".join([summary.sentence, *summary.notes, *aligned([header] + [cells for _, cells in rows])])


# Colours of the HTML (the table here, the timeline's legend): JupyterLab's own, so that text reads in its light
# and dark themes alike (WCAG AA, 4.5:1), with fallbacks that read together wherever those are not defined
# (nbconvert's HTML, nbviewer): the text's colour is always set with the background it is read on.
TEXT = "var(--jp-content-font-color1,#1a1a1a)"
MUTED = "var(--jp-content-font-color2,#595959)"  # secondary text: 4.6:1 in JupyterLab Light, 9:1 in Dark
BACKGROUND = "var(--jp-layout-color0,#fff)"
HIGHLIGHT = "var(--jp-rendermime-error-background,#fdd)"  # the straggler's row (what error output reads on)
PANEL = f"color:{TEXT};background:{BACKGROUND}"


def swatch(color, *, width=10, height=10):
    """A small box of *color* (a rank's, an operation's) to go with a label in the text's colour: coloured text
    cannot read in a light and a dark theme both."""
    return (f"<span style='display:inline-block;width:{width}px;height:{height}px;background:{color};"
            f"vertical-align:middle;margin-right:4px'></span>")


def summary_html(summary):
    """The same as an HTML table under the sentence, each rank with a box in its colour and the straggler's row
    highlighted, in JupyterLab's text and background colours."""
    header, rows = _cells(summary)
    head = "".join(f"<th style='text-align:left;padding:0 12px 0 0'>{html.escape(h)}</th>" for h in header)
    body = []
    for rank, cells in rows:
        style = f" style='background:{HIGHLIGHT}'" if rank == summary.straggler else ""
        tds = [f"<td style='padding:0 12px 0 0;white-space:nowrap'>{swatch(rank_color(rank))}<b>{cells[0]}</b></td>"]
        tds += [f"<td style='padding:0 12px 0 0'>{html.escape(cell)}</td>" for cell in cells[1:]]
        body.append(f"<tr{style}>{''.join(tds)}</tr>")
    return (f"<table style='border-collapse:collapse;font-family:monospace;font-size:12px;{PANEL}'>"
            f"<caption style='text-align:left;{PANEL}'>"
            f"{'<br>'.join(map(html.escape, [summary.sentence, *summary.notes]))}</caption>"
            f"<tr>{head}</tr>{''.join(body)}</table>")
