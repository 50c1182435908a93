"""What the notebook's front end can show: widgets (a kernel with a front end that renders them) or text, and
whether that text may be coloured."""

import sys


def in_notebook(shell):
    """A kernel with a front end that renders widgets (terminal IPython has no ``kernel``)."""
    return getattr(shell, "kernel", None) is not None


def colored(shell):
    """Whether rank labels may be coloured: in a terminal that shows colours, never in a notebook."""
    if in_notebook(shell):
        return False
    return sys.stderr.isatty() and getattr(shell, "colors", "nocolor").lower() != "nocolor"
