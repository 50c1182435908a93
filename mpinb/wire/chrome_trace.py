"""Spans as Chrome trace events, the JSON that Perfetto and chrome://tracing open (as Horovod's timeline writes):
written by a script traced under plain ``mpiexec`` (``rank/tracing/script.py``) and by the notebook's
``Trace.to_chrome`` (``notebook/models/traces.py``)."""

import json

from . import files

ARGS = ("comm", "peer", "sent", "received", "seq", "detail")


def events(rank, spans, *, offset_ns=0):
    """The trace events of one rank: two metadata events naming and sorting its process, then one per span.

    Parameters
    ----------
    rank : int
        The rank; it is the events' ``pid`` (one process per rank in the viewer, named ``rank N``).
    spans : iterable of tuple
        ``(op, comm, peer, sent, received, start_ns, end_ns, seq, kind, detail)`` as ``mpinb.rank.tracing``
        records them. A span of kind ``"step"`` (an ``mpinb.report(step=...)`` call) becomes an instant event,
        every other a complete (``"X"``) event.
    offset_ns : int, default 0
        Added to every time before it is written: ``time.time_ns() - time.perf_counter_ns()`` puts the events
        on the wall clock, minus the trace's first start puts them at zero.

    Returns
    -------
    list of dict
        Events with ``ts`` and ``dur`` in microseconds; ``args`` hold comm, peer, sent, received, seq and detail.

    Example::

        chrome.write("trace-0.json", chrome.events(0, [("Barrier", "COMM_WORLD", None, 0, 0, 10_000, 52_000,
                                                        1, "collective", "")]))
    """
    rank = int(rank)
    out = [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
           {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}}]
    for op, comm, peer, sent, received, start_ns, end_ns, seq, kind, detail in spans:
        args = dict(zip(ARGS, (comm, _int(peer), int(sent or 0), int(received or 0), _int(seq), detail or "")))
        event = {"name": op, "cat": kind, "ts": (int(start_ns) + offset_ns) / 1000, "pid": rank, "tid": 0,
                 "args": args}
        if kind == "step":
            event.update(ph="i", s="t")
        else:
            event.update(ph="X", dur=(int(end_ns) - int(start_ns)) / 1000)
        out.append(event)
    return out


def write(path, events):
    """Write *events* to *path* as a Chrome trace (``{"traceEvents": [...], "displayTimeUnit": "ms"}``): through
    a fresh owner-only file renamed to *path*, so a link planted there (``/tmp/trace-0.json``) is replaced, not
    written through (``wire/files.py``)."""
    events = list(events)
    files.replace(path, lambda file: json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, file))


def _int(value):
    """*value* as an int, or None (numpy and pandas integers included; pandas' NA is None)."""
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
