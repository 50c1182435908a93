"""Plain-text tables for terminals: every view's text form lines its columns up the same way, and writes its
numbers, durations and sizes the same way."""

import numbers


def aligned(table):
    """*table* (rows of strings, the first a header) as lines with each column padded to its widest cell."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in table]


def number(value, digits=4):
    """A table cell for *value*: empty for ``None`` or ``""``, a non-integral number to *digits* significant
    digits, anything else as ``str`` writes it."""
    if value is None or (isinstance(value, str) and value == ""):
        return ""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        return f"{value:.{digits}g}"
    return str(value)


def duration(seconds):
    """Seconds as short text: ``1.25 s``, ``29 ms``, ``2.9 ms``, ``0.3 ms``, ``45 µs``."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    ms = seconds * 1e3
    if ms >= 10:
        return f"{ms:.0f} ms"
    if ms >= 0.1:
        return f"{ms:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def size(count):
    """Bytes as short text: ``512 B``, ``8.0 KiB``, ``1.2 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count} B" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return ""
