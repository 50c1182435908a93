"""``%mpi status`` as a table widget in a notebook and as aligned text in a terminal."""

import html

from .colors import color
from .text import aligned

COLUMNS = ("rank", "host", "pid", "threads", "state")
_STATE_COLOURS = {"idle": "ok", "busy": "warn", "dead": "error"}  # kinds of colors.color, readable in any theme


def _state(value):
    kind = _STATE_COLOURS.get(value)
    style = color(kind) if kind else "color:inherit"
    return f"<span style='{style}'>{html.escape(value)}</span>"


def status_text(rows, header):
    """*rows* (dicts with rank, host, pid, state) as a header line and an aligned table."""
    table = [COLUMNS] + [tuple(str(row[c]) for c in COLUMNS) for row in rows]
    lines = aligned(table)
    return "\n".join([header, *lines])


def status_html(rows, header):
    """The same table as HTML (a plain output: it needs no kernel to show), each state in its colour."""
    head = "".join(f"<th style='text-align:left;padding:0 24px 0 0'>{name}</th>" for name in COLUMNS)
    body = []
    for row in rows:
        cells = []
        for name in COLUMNS:
            value = _state(str(row[name])) if name == "state" else html.escape(str(row[name]))
            cells.append(f"<td style='text-align:left;padding:0 24px 0 0'>{value}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    heading = "<br>".join(html.escape(line) for line in header.splitlines())
    return (f"<div><b>{heading}</b></div><table style='font-family:monospace;font-size:12px;border-collapse:collapse'>"
            f"<tr>{head}</tr>{''.join(body)}</table>")


def status_widget(rows, header):
    """The same table as an ipywidgets ``GridBox`` (one cell widget per value) under an HTML header."""
    import ipywidgets as w

    cells = [w.HTML(f"<b>{name}</b>") for name in COLUMNS]
    for row in rows:
        for name in COLUMNS:
            value = str(row[name])
            if name == "state":
                cells.append(w.HTML(_state(value)))
            else:
                cells.append(w.Label(value))
    grid = w.GridBox(cells, layout=w.Layout(grid_template_columns=f"repeat({len(COLUMNS)}, max-content)",
                                            grid_gap="2px 24px"))
    heading = "<br>".join(html.escape(line) for line in header.splitlines())
    return w.VBox([w.HTML(f"<b>{heading}</b>"), grid])
