"""The root of the errors mpinb raises on purpose, and the one the cell channel raises when the world is gone: here,
below everything that raises them, so that the channel needs nothing above it; ``mpinb/errors.py`` re-exports
both, and users name and catch them there."""


import os
import re
import shutil
import sys


class MpinbError(Exception):
    """Every error mpinb raises on purpose. Its message says what happened and what to do; IPython shows it
    without mpinb's own frames (``_render_traceback_``), and the magics show :class:`BadArguments` and
    :class:`NoMPI` as the one-line ``UsageError`` of a magic."""

    __module__ = "mpinb.errors"  # the name users import, catch and see in a plain traceback

    def _render_traceback_(self):
        return fitted([f"\x1b[1;31m{type(self).__name__}\x1b[0m: {self}"])


class MPIError(MpinbError):
    """The MPI world itself went wrong or is not there: it did not start, it stopped, a rank of it died."""

    __module__ = "mpinb.errors"


_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def fitted(lines, width=None):
    """*lines* (each may hold several) as a terminal shows them without breaking a word: where IPython writes to a
    terminal, a line wider than it is broken at spaces, its next lines indented two further than it; in a notebook
    (whose front end wraps) and under a width of 20 the lines are returned as they are. Colour codes take no
    width."""
    if width is None:
        isatty = getattr(sys.stdout, "isatty", None)
        if not (isatty and isatty()):
            return list(lines)
        try:  # the terminal's own width (a COLUMNS inherited from a parent may be stale)
            width = os.get_terminal_size(sys.stdout.fileno()).columns
        except (OSError, ValueError, AttributeError):
            width = shutil.get_terminal_size().columns
    if width < 20:
        return list(lines)
    out = []
    for line in (part for text in lines for part in text.split("\n")):
        if len(_ESCAPE.sub("", line)) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip(" ")) + 2)
        row, seen = line[:len(line) - len(line.lstrip(" "))], len(line) - len(line.lstrip(" "))
        for word in line.lstrip(" ").split(" "):
            size = len(_ESCAPE.sub("", word))
            if seen + size > width and row.strip():
                out.append(row.rstrip(" "))
                row, seen = indent, len(indent)
            row += word + " "
            seen += size + 1
        out.append(row.rstrip(" "))
    return out
