"""Native stacks of the ranks (py-spy): ``%mpi stacks``, and where in C a rank that did not answer the interrupt
is. ``py_spy.py`` runs py-spy (when there is one, and the kernel may ptrace the ranks), ``places.py`` says a
stack in one line, ``report.py`` puts them together for the command and for the errors."""

from .py_spy import NativeStack, capture
from .report import for_unanswered, in_error, stacks

__all__ = ["NativeStack", "capture", "for_unanswered", "in_error", "stacks"]
