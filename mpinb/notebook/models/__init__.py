"""The data views draw, computed in the notebook: every number the ranks reported, a traced cell's table, and
what the tensor inspector shows of gathered values."""

from .history import History, read_metrics
from .leaf_reports import inspect_gathered
from .traces import frame, summarize

__all__ = ["History", "frame", "inspect_gathered", "read_metrics", "summarize"]
