"""``%mpi who``: every name on the ranks, with the ranks where it differs or is missing flagged.

:func:`who_report` turns each rank's :func:`mpinb.rank.who.who` into plain rows; :func:`who_text` and
:func:`who_widget` (or :func:`who_html`) render them.
"""

import html
from collections import Counter

from ..wire.ranks import format_ranks, label_ranks
from .colors import WRAP, color, rank_label, tint
from .text import aligned

BY_DESIGN = frozenset({"rank"})
GROUPS_SHOWN = 4  # lines of a name that differs, one per group of ranks holding the same, at most (text)
_FIELDS = ("type", "shape", "dtype")


def who_report(by_rank, *, by_design=BY_DESIGN):
    """*by_rank*: rank → that rank's ``who()``. One row per name, sorted by name, as a plain dict:

    - ``name``; ``ranks``: rank → that rank's description (``type``, ``shape``, ``dtype``, ``hash``,
      ``summary``, ``note``) for the ranks holding the name;
    - ``reference``: the rank the others are compared with: the lowest rank of the majority (more than half of
      the ranks holding the name agree on type, shape, dtype and hash), else the lowest rank holding it;
    - ``differs_on``: ranks whose type, shape or dtype differ from the reference's, or whose hash does (when
      both were hashed: a value that could not be hashed is compared by type, shape and dtype only);
    - ``missing_on``: ranks without the name;
    - ``groups``: ``[(ranks, description), ...]``, ranks holding the same (type, shape, dtype, hash) together,
      the reference's group first;
    - ``type``, ``shape``, ``dtype``: the value when equal on every rank holding the name, else ``None``;
    - ``by_design``: the name is in *by_design* and differs: ``rank`` differs on every rank because it should,
      so it is not flagged, only marked "differs by design" (a name missing on some ranks still is flagged);
    - ``flags``: what needs a look, as ``"w: differs on ranks 1, 3"`` and ``"x: missing on rank 2"``.

    Other names that differ by design (a ``local_rank``, a per-rank ``seed``) are flagged unless passed in
    *by_design*: a flag that is expected costs a glance, a difference that is not flagged costs a bug hunt.
    """
    ranks = sorted(by_rank)
    names = sorted({name for described in by_rank.values() for name in described}, key=lambda n: (n.lower(), n))
    rows = []
    for name in names:
        present = {rank: by_rank[rank][name] for rank in ranks if name in by_rank[rank]}
        missing = [rank for rank in ranks if rank not in present]
        reference = _reference(present)
        differs = [rank for rank, described in present.items() if _differs(described, present[reference])]
        expected = name in by_design
        flags = []
        if differs and not expected:
            flags.append(f"{name}: differs on {label_ranks(differs)}")
        if missing:
            flags.append(f"{name}: missing on {label_ranks(missing)}")
        row = {"name": name, "ranks": present, "reference": reference, "differs_on": differs, "missing_on": missing,
               "groups": _groups(present, reference), "by_design": expected and bool(differs), "flags": flags}
        for field in _FIELDS:
            values = {_key(described.get(field)) for described in present.values()}
            row[field] = present[reference].get(field) if len(values) == 1 else None
        rows.append(row)
    return rows


def _key(value):
    return tuple(value) if isinstance(value, list) else value  # a shape may come back as a list


def _identity(described):
    return tuple(_key(described.get(field)) for field in (*_FIELDS, "hash"))


def _reference(present):
    counts = Counter(_identity(described) for described in present.values())
    identity, count = counts.most_common(1)[0]
    if 2 * count > len(present):
        return min(rank for rank, described in present.items() if _identity(described) == identity)
    return min(present)


def _differs(described, reference):
    if any(_key(described.get(f)) != _key(reference.get(f)) for f in _FIELDS):
        return True
    mine, theirs = described.get("hash"), reference.get("hash")
    return mine is not None and theirs is not None and mine != theirs


def _groups(present, reference):
    groups = {}
    for rank, described in present.items():
        groups.setdefault(_identity(described), []).append(rank)
    first = _identity(present[reference])
    ordered = [groups.pop(first)] + sorted(groups.values(), key=lambda ranks: (-len(ranks), ranks))
    return [(ranks, present[ranks[0]]) for ranks in ordered]


def _headline(rows):
    ranks = sorted({rank for row in rows for rank in [*row["ranks"], *row["missing_on"]]})
    # one entry per name: "result: differs on rank 3, missing on rank 2"
    flags = [f"{row['name']}: " + ", ".join(flag.split(": ", 1)[1] for flag in row["flags"])
             for row in rows if row["flags"]]
    head = f"{len(rows)} name{'s' if len(rows) != 1 else ''} on {len(ranks)} rank{'s' if len(ranks) != 1 else ''}"
    if not flags:
        return f"{head}: every name the same on every rank" + (" (but for rank)" if any(
            row["by_design"] for row in rows) else "")
    shown = flags[:3] + ([f"and {len(flags) - 3} more"] if len(flags) > 3 else [])
    return f"{head}; " + "; ".join(shown)


def _hash(described):
    value = described.get("hash") or "-"
    note = described.get("note")
    return f"{value} ({note})" if note and described.get("hash") else value


def _shape(shape):
    return "" if shape is None else str(tuple(shape))


def _notes(row, described=None, *, hashed_too=False):
    """The row's flags (without its name) and the reference's note: only one that says why there is no hash,
    unless *hashed_too* (the text puts ``(first 64 MB)`` by the hash itself)."""
    notes = []
    if row["by_design"]:
        notes.append("differs by design")
    notes += [flag.split(": ", 1)[1] for flag in row["flags"]]
    described = described or row["ranks"][row["reference"]]
    if described.get("note") and (hashed_too or not described.get("hash")):
        notes.append(f"hash: {described['note']}" if described.get("hash") else described["note"])
    return "; ".join(notes)


def who_text(rows):
    """An aligned table under a headline naming what differs: one line per name when every rank holds the same
    (type, shape and dtype then said once), else one line per group of ranks that agree, the reference's
    first, at most :data:`GROUPS_SHOWN`. The hash column is each value's short content hash, with its note
    (``(first 64 MB)``) when only a part was hashed; ``-`` when it could not be hashed cheaply."""
    if not rows:
        return "no names defined on the ranks"
    table = [["name", "ranks", "type", "shape", "dtype", "hash", "value", "notes"]]
    for row in rows:
        name = row["name"]
        everyone = "all" if not row["missing_on"] else format_ranks(row["ranks"])
        if not row["differs_on"] or row["by_design"]:
            ref = row["ranks"][row["reference"]]
            if row["by_design"]:
                values = [row["ranks"][rank].get("summary", "") for rank in sorted(row["ranks"])]
                value, digest = _clip(", ".join(values)), ""
            else:
                value, digest = ref.get("summary", ""), _hash(ref)
            table.append([name, everyone, ref.get("type", ""), _shape(row["shape"]), row["dtype"] or "", digest,
                          value, _notes(row)])
            continue
        groups = row["groups"]
        for index, (ranks, described) in enumerate(groups[:GROUPS_SHOWN]):
            table.append([name if index == 0 else "", format_ranks(ranks), described.get("type", ""),
                          _shape(described.get("shape")), described.get("dtype") or "", _hash(described),
                          described.get("summary", ""), _notes(row, described) if index == 0 else ""])
        if len(groups) > GROUPS_SHOWN:
            rest = sorted(rank for ranks, _ in groups[GROUPS_SHOWN:] for rank in ranks)
            table.append(["", format_ranks(rest), f"({len(groups) - GROUPS_SHOWN} more groups)", "", "", "", "", ""])
    return "\n".join([_headline(rows), *aligned(table)])


def _clip(text, width=40):
    return text if len(text) <= width else text[: width - 1] + "…"


def who_html(rows):
    """The table as HTML: type, shape, dtype and value (the reference rank's), then one hash column per rank in
    its chart colour; a differing rank's cell in red with its type, shape and dtype when those differ (its value
    on hover), a missing one as ``—``; flagged rows highlighted, names differing by design in grey."""
    if not rows:
        return "<b>no names defined on the ranks</b>"
    ranks = sorted({rank for row in rows for rank in [*row["ranks"], *row["missing_on"]]})
    cell = "text-align:left;padding:0 12px 0 0;white-space:nowrap"
    head = "".join(f"<th style='{cell}'>{h}</th>" for h in ("name", "type", "shape", "dtype", "value"))
    head += "".join(f"<th style='{cell}'>{rank_label(rank, f'rank {rank}')}</th>" for rank in ranks)
    head += f"<th style='{cell}'>notes</th>"
    body = []
    for row in rows:
        ref = row["ranks"][row["reference"]]
        tds = [f"<td style='{cell}'><b>{html.escape(row['name'])}</b></td>"]
        tds += [f"<td style='{cell}'>{html.escape(text)}</td>" for text in (
            *(_column(row, field) for field in _FIELDS), ref.get("summary", ""))]
        for rank in ranks:
            tds.append(_rank_cell(row, rank, cell))
        notes = html.escape(_notes(row, hashed_too=True))
        kind = "muted" if row["by_design"] and not row["flags"] else "error"
        tds.append(f"<td style='{cell};{color(kind)};{WRAP};min-width:16em'>{notes}</td>")
        shade = "flag" if row["flags"] else ("quiet" if row["by_design"] else None)
        style = f" style='{tint(shade)}'" if shade else ""
        body.append(f"<tr{style}>{''.join(tds)}</tr>")
    return (f"<div style='overflow-x:auto'><table style='border-collapse:collapse;font-family:monospace;"
            f"font-size:12px'><caption style='text-align:left;{WRAP}'><b>{html.escape(_headline(rows))}</b></caption>"
            f"<tr>{head}</tr>{''.join(body)}</table></div>")


def _column(row, field):
    if len({_key(described.get(field)) for described in row["ranks"].values()}) > 1:
        return "varies"
    return _shape(row[field]) if field == "shape" else row[field] or ""


def _rank_cell(row, rank, cell):
    if rank not in row["ranks"]:
        return f"<td style='{cell};{color('error')}' title='not defined on rank {rank}'>—</td>"
    described = row["ranks"][rank]
    text = described.get("hash") or "-"
    ref = row["ranks"][row["reference"]]
    changed = [str(_shape(described.get(f)) if f == "shape" else described.get(f)) for f in _FIELDS
               if _key(described.get(f)) != _key(ref.get(f))]
    if changed:
        text = f"{text} {' '.join(changed)}"
    title = " · ".join(part for part in (described.get("summary", ""), described.get("note") or "") if part)
    style = cell
    if rank in row["differs_on"]:
        # bold, and (after the plain colour a renderer without color-mix keeps) red in the theme
        style += f";{color('muted')}" if row["by_design"] else f";color:#c62828;font-weight:bold;{color('error')}"
    return f"<td style='{style}' title='{html.escape(title, quote=True)}'>{html.escape(text)}</td>"


def who_widget(rows):
    """An ``ipywidgets.HTML`` showing :func:`who_html`; the rows stay on it as ``.rows``."""
    import ipywidgets as w

    widget = w.HTML(who_html(rows))
    widget.rows = rows
    return widget
