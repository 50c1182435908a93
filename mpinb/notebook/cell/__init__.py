"""A ``%%mpi`` cell on the ranks: dispatched, in flight until every rank replied, its output labelled by rank, its
gathered values rebuilt, the errors of ranks that did not finish on their own, and its live views."""

from . import dispatch
from .dispatch import CellResult
from .live import CellStatus, LiveMetrics, LiveTrace, show_trace
from .output import RankPrinter, rank_ordered
from .perrank import PerRank

__all__ = ["CellResult", "CellStatus", "LiveMetrics", "LiveTrace", "PerRank", "RankPrinter", "dispatch",
           "rank_ordered", "show_trace"]
