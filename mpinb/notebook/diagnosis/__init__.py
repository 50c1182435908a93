"""What went wrong on the ranks: where each is stuck (its Python and native stacks), how it died, ranks in
different collectives and the fix for them, ranks let out of MPI after a Stop, and replicas that drifted apart."""

from . import native
from .deaths import death_report, last_stderr
from .diagnose import RankStack, capture_stacks, fatal_stack
from .mismatch import MismatchWatch, after_cell, at_death, left_apart
from .recover import Recovery
from .replicas import differences

__all__ = ["MismatchWatch", "RankStack", "Recovery", "after_cell", "at_death", "capture_stacks", "death_report",
           "differences", "fatal_stack", "last_stderr", "left_apart", "native"]
