"""What computing a trace's summary (``notebook/models/traces.py``) and drawing its timeline both read off a trace's rows:
how an operation is named where it is shown, which ranks were traced, which calls were made inside others."""

import numpy as np

MPINB = "mpinb"  # the kind of mpinb's own checks (the agreement allgather before each mpinb.torch call)


def label(op, kind):
    """What an operation is called where it is shown: ``mpinb check (allgather)`` for mpinb's own checks."""
    return f"mpinb check ({op})" if kind == MPINB else op


def labels(trace):
    """:func:`label` of every row of *trace*, as a numpy array of str."""
    ops = trace["op"].to_numpy(dtype=object)
    own = (trace["kind"] == MPINB).to_numpy()
    if own.any():
        ops = ops.copy()
        ops[own] = [label(op, MPINB) for op in ops[own]]
    return ops


def traced_ranks(trace):
    """Every rank of *trace*: those with spans and those traced without any."""
    return sorted({int(rank) for rank in trace["rank"].unique()} | set(getattr(trace, "ranks", None) or ()))


def nesting(starts, ends):
    """``(nested, holders)`` for intervals of one rank: whether each lies inside an earlier-starting (or
    same-start, longer) one, and the index of the one reaching furthest before it (the one it is nested in)."""
    n = len(starts)
    if n < 2:
        return np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64)
    order = np.lexsort((-ends, starts))
    sorted_ends = ends[order]
    reach = np.maximum.accumulate(sorted_ends)
    nested, holders = np.zeros(n, dtype=bool), np.empty(n, dtype=np.int64)
    nested[order[1:]] = sorted_ends[1:] <= reach[:-1]
    furthest = np.maximum.accumulate(np.where(sorted_ends >= reach, np.arange(n), 0))
    holders[order] = order[np.concatenate([[0], furthest[:-1]])]
    return nested, holders
