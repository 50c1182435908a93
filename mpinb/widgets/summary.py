"""The per-rank table of a run (last step, last values, steps/s, notes) as text for terminals and HTML for widgets."""

import html

from .colors import WRAP, rank_label, tint
from .text import aligned, number


def _cells(history, run, *, now=None, live=False, finished=()):
    names = history.names.get(run, [])
    summary = history.summary(run, now=now, live=live, finished=finished)
    waits = any(row["wait"] for row in summary)  # only when ranks communicate (through mpi4py or torch)
    header = ["rank", "step", *names, "steps/s", *(["wait ms/step"] if waits else []), "notes"]
    rows = []
    for row in summary:
        values = [number(row["values"].get(name), 5) for name in names]
        rate = "" if row["rate"] is None else f"{row['rate']:.1f}"
        wait = ["" if row["wait"] is None else f"{row['wait'] * 1e3:.1f}"] if waits else []
        rows.append((row["rank"], [str(row["rank"]), str(row["step"]), *values, rate, *wait,
                                   "; ".join(row["notes"])]))
    return header, rows


def summary_text(history, run, *, now=None, live=False, finished=()):
    """An aligned table, one line per rank, under a line naming the run (*finished*: ranks done with the cell,
    never noted as silent)."""
    header, rows = _cells(history, run, now=now, live=live, finished=finished)
    table = [header] + [cells for _, cells in rows]
    lines = aligned(table)
    return "\n".join([f"metrics of run {run!r}:", *lines])


def summary_html(history, run, *, now=None, live=False, finished=()):
    """The same table as HTML, each rank in its chart colour and rows that need a look highlighted."""
    header, rows = _cells(history, run, now=now, live=live, finished=finished)
    head = "".join(f"<th style='text-align:left;padding:0 12px 0 0'>{html.escape(h)}</th>" for h in header)
    body = []
    for rank, cells in rows:
        flagged = bool(cells[-1])
        style = f" style='{tint('flag')}'" if flagged else ""
        tds = [f"<td style='text-align:left;padding:0 12px 0 0'>{rank_label(rank, cells[0])}</td>"]
        tds += [f"<td style='text-align:left;padding:0 12px 0 0'>{html.escape(cell)}</td>" for cell in cells[1:-1]]
        tds.append(f"<td style='text-align:left;padding:0 12px 0 0;{WRAP}'>{html.escape(cells[-1])}</td>")
        body.append(f"<tr{style}>{''.join(tds)}</tr>")
    return (f"<table style='border-collapse:collapse;font-family:monospace;font-size:12px'>"
            f"<caption style='text-align:left'><b>run {html.escape(run)}</b></caption>"
            f"<tr>{head}</tr>{''.join(body)}</table>")
