"""Plain-text tables for terminals: every view's text form lines its columns up the same way, and writes its
numbers the same way."""

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
