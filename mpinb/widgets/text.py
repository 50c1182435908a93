"""Plain-text tables for terminals: every view's text form lines its columns up the same way."""


def aligned(table):
    """*table* (rows of strings, the first a header) as lines with each column padded to its widest cell."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in table]
