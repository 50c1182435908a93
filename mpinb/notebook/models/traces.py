"""A traced cell's MPI calls as a table, and which rank held the others up: the data behind the timeline."""

import collections
import dataclasses

import numpy as np
import pandas as pd

from ...widgets.text import duration
from ...widgets.trace_rows import MPINB, label, nesting, traced_ranks
from ...wire import chrome_trace as chrome

COLUMNS = ["rank", "op", "comm", "peer", "bytes", "start", "end", "seq", "kind", "sent", "received", "detail"]
BLOCKING = ("collective", "torch")  # kinds whose calls every member enters and waits in
MIN_WAIT = 1e-3  # seconds the others must wait per collective, on average, before a rank is called a straggler


class Trace(pd.DataFrame):
    """Every span of a trace, one row each, sorted by rank then start (see :data:`COLUMNS`).

    ``start`` and ``end`` are seconds since the earliest start of any span. Metadata (kept by slices, sorts and
    copies, which stay a :class:`Trace`): ``origin_ns``, that start as the first rank's ``perf_counter_ns()``;
    ``offset_ns``, what turns that clock into wall-clock nanoseconds (0 if unknown); ``dropped``, ``{rank: spans
    its ring buffer lost}``; ``ranks``, every rank traced, those that made no call included.
    """

    _metadata = ["origin_ns", "offset_ns", "dropped", "ranks"]

    @property
    def _constructor(self):
        return Trace

    def spans(self):
        """The spans again, ``{rank: [(op, comm, peer, sent, received, start_ns, end_ns, seq, kind, detail)]}``
        (times on the first rank's clock)."""
        origin = getattr(self, "origin_ns", 0) or 0
        start_ns = origin + np.rint(self["start"].to_numpy(dtype=np.float64) * 1e9).astype(np.int64)
        end_ns = origin + np.rint(self["end"].to_numpy(dtype=np.float64) * 1e9).astype(np.int64)
        out = {}
        for row, start, end in zip(self.itertuples(index=False), start_ns.tolist(), end_ns.tolist()):
            out.setdefault(int(row.rank), []).append(
                (row.op, row.comm, _optional(row.peer), int(row.sent), int(row.received), start, end,
                 _optional(row.seq), row.kind, row.detail))
        return out

    def to_chrome(self, path):
        """Write the trace as Chrome-trace JSON that Perfetto (ui.perfetto.dev) and chrome://tracing open.

        One process per rank (``rank N``), a complete event per call and an instant event per step marker, in
        microseconds on the wall clock where the trace knows it (else on the ranks' monotonic clock).
        """
        offset = getattr(self, "offset_ns", 0) or 0
        events = []
        for rank, spans in sorted(self.spans().items()):
            events.extend(chrome.events(rank, spans, offset_ns=offset))
        chrome.write(path, events)


def frame(spans_by_rank, *, clocks=None, dropped=None, offset_ns=0):
    """The spans of every rank as a :class:`Trace`.

    Parameters
    ----------
    spans_by_rank : dict
        ``{rank: [(op, comm, peer, sent, received, start_ns, end_ns, seq, kind, detail), ...]}``; a rank with
        no spans still counts (it shows as an empty lane).
    clocks : dict, optional
        ``{rank: (perf_counter_ns, time_ns)}`` read together on each rank. Ranks whose two clocks differ by the
        same amount (within :data:`SAME_HOST` ns) share a monotonic clock and are left as they are; ranks on
        other hosts are moved onto the first rank's clock through the wall clock (as good as NTP keeps them).
    dropped : dict, optional
        ``{rank: spans its ring buffer lost}``, kept as ``trace.dropped`` and said in the summary.
    offset_ns : int, default 0
        Wall-clock minus monotonic nanoseconds, when *clocks* is not given (for :meth:`Trace.to_chrome`).

    Returns
    -------
    Trace
        Sorted by rank, then start; ``bytes`` is ``max(sent, received)``, the message's size.
    """
    shifts, offset_ns = _shifts(clocks, offset_ns)
    fields = [[] for _ in range(10)]  # op, comm, peer, sent, received, start_ns, end_ns, seq, kind, detail
    rank, shift = [], []
    for r, spans in spans_by_rank.items():
        if spans:
            for field, values in zip(fields, zip(*spans)):
                field.extend(values)
            rank.append(np.full(len(spans), r, dtype=np.int64))
            shift.append(np.full(len(spans), shifts.get(r, 0), dtype=np.int64))
    op, comm, peer, sent, received, start_ns, end_ns, seq, kind, detail = fields
    rank = np.concatenate(rank) if rank else np.zeros(0, dtype=np.int64)
    shift = np.concatenate(shift) if shift else np.zeros(0, dtype=np.int64)
    start_ns = np.array(start_ns, dtype=np.int64) + shift
    end_ns = np.array(end_ns, dtype=np.int64) + shift
    origin = int(start_ns.min()) if len(start_ns) else 0
    sent = np.array(sent, dtype=object)
    received = np.array(received, dtype=object)
    sent = np.where(sent == None, 0, sent).astype(np.int64)  # noqa: E711 - elementwise
    received = np.where(received == None, 0, received).astype(np.int64)  # noqa: E711 - elementwise
    columns = {
        "rank": rank, "op": pd.array(op, dtype="str"), "comm": pd.array(comm, dtype="str"),
        "peer": pd.array(peer, dtype="Int64"), "bytes": np.maximum(sent, received),
        "start": (start_ns - origin) / 1e9, "end": (end_ns - origin) / 1e9, "seq": pd.array(seq, dtype="Int64"),
        "kind": pd.array(kind, dtype="str"), "sent": sent, "received": received,
        "detail": pd.array([value or "" for value in detail], dtype="str"),
    }
    trace = Trace(columns, columns=COLUMNS)
    trace = trace.sort_values(["rank", "start"], kind="stable").reset_index(drop=True)
    trace.origin_ns, trace.offset_ns = origin, offset_ns
    trace.dropped = {int(r): int(n) for r, n in (dropped or {}).items() if n}
    trace.ranks = sorted(int(r) for r in spans_by_rank)
    return trace


SAME_HOST = 5_000_000  # ns: ranks whose wall-minus-monotonic offsets agree this well share one monotonic clock


def _shifts(clocks, offset_ns):
    """``({rank: ns to add to its times}, wall-clock offset of the result)`` from each rank's clock pair."""
    if not clocks:
        return {}, offset_ns
    offsets = {int(rank): int(wall) - int(mono) for rank, (mono, wall) in clocks.items()}
    hosts = []  # [offset of the host's first rank], one per monotonic clock seen
    shifts = {}
    for rank in sorted(offsets):
        host = next((h for h in hosts if abs(offsets[rank] - h) <= SAME_HOST), None)
        if host is None:
            hosts.append(host := offsets[rank])
        shifts[rank] = host - hosts[0]
    return shifts, hosts[0]


@dataclasses.dataclass
class Summary:
    """Who held whom up in a trace, and each rank's split of its time between communication and compute.

    Attributes
    ----------
    straggler : int or None
        The rank that arrived last at most collectives while the others waited for it, if one did.
    sentence : str
        What happened, in one sentence.
    per_rank : list of dict
        One per rank: ``rank, comm_seconds, compute_seconds, comm_share, sent, received, calls, slowest`` (the
        longest call as text), ``waited`` (seconds spent at collectives waiting for a later rank) and ``last``
        (how many collectives it arrived at last).
    collectives : int
        Collectives matched across at least two ranks.
    notes : list of str
        What else the reader must know, such as calls a rank's buffer dropped.
    waits : pandas.DataFrame or None
        Where each rank waited for a later one (:func:`waits`), which the timeline draws over its calls.
    """

    straggler: object
    sentence: str
    per_rank: list
    collectives: int = 0
    notes: list = dataclasses.field(default_factory=list)
    waits: object = dataclasses.field(default=None, repr=False, compare=False)


def _arrivals(trace):
    """The collectives two or more ranks took part in, one row per rank's arrival, with ``latest`` (the last
    arrival's start) and ``wait`` (how long this rank waited for it): the rows :func:`_matched` keeps."""
    matched = _matched(trace)
    if len(matched):
        matched = matched[matched.groupby(["comm", "seq"])["rank"].transform("nunique") >= 2]
    if not len(matched):
        return matched.assign(latest=np.zeros(0), wait=np.zeros(0))
    latest = matched.groupby(["comm", "seq"], sort=False)["start"].transform("max")
    return matched.assign(latest=latest, wait=latest - matched["start"])


def waits(trace, arrivals=None):
    """Where each rank waited for a later one: ``(rank, start, end)`` rows, one per collective it arrived at
    before the last, from its arrival to the last one's (within its own call: a nonblocking one waits later, in
    its ``Wait``)."""
    arrivals = _arrivals(trace) if arrivals is None else arrivals
    arrivals = arrivals[arrivals["wait"] > 0]
    end = np.minimum(arrivals["end"].to_numpy(dtype=np.float64), arrivals["latest"].to_numpy(dtype=np.float64))
    out = pd.DataFrame({"rank": arrivals["rank"].to_numpy(dtype=np.int64),
                        "start": arrivals["start"].to_numpy(dtype=np.float64), "end": end})
    return out[out["end"] > out["start"]].sort_values(["rank", "start"], kind="stable").reset_index(drop=True)


def summarize(trace):
    """Find the rank the others waited for and split each rank's traced time into communication and compute.

    Collectives (kinds ``collective`` and ``torch``, not calls nested in another traced call) are matched across
    ranks by ``(comm, seq)``; a nonblocking one (``Iallreduce``: ``allreduce_gradients``' buckets) arrives when it
    is posted, and the others wait for it in their ``Wait``. In each collective two or more ranks took part in,
    the rank that started last is the last arriver; every other rank waited from its own start to that one. A
    rank that arrived last at more than half of them, while the others waited more than 1 ms per collective for
    it on average, is the straggler.

    A rank's communication time is the length of the union of its calls (a torch call and the MPI call inside
    it count once), its compute time the rest of its traced wall time (first span's start to last span's end).
    """
    matched = _arrivals(trace)
    groups = matched.groupby(["comm", "seq"], sort=False) if len(matched) else None
    waited = collections.Counter()  # rank -> seconds waited, in every matched collective
    last_of = {}  # group -> (last rank, op)
    spreads = []
    if groups is not None:
        waited.update(matched.groupby("rank")["wait"].sum().to_dict())
        last = matched.loc[groups["start"].idxmax()]
        last_of = {(row.comm, row.seq): (int(row.rank), row.op) for row in last.itertuples(index=False)}
        spreads = (groups["start"].max() - groups["start"].min()).to_numpy()
    last_counts = collections.Counter(rank for rank, _ in last_of.values())
    per_rank = [_rank_row(trace, rank, waited.get(rank, 0.0), last_counts.get(rank, 0))
                for rank in traced_ranks(trace)]
    dropped = getattr(trace, "dropped", None) or {}
    notes = [f"rank {rank}'s trace buffer was full: its {count} oldest calls are missing"
             for rank, count in sorted(dropped.items())]
    notes += _own_checks_note(trace)
    summary = Summary(None, "", per_rank, len(last_of), notes, waits(trace, matched))
    if not last_of:
        blocking = trace["kind"].isin(BLOCKING).any()
        summary.sentence = ("no collective was traced on more than one rank" if blocking
                            else "no collectives were traced")
        return summary
    candidate, count = max(last_counts.items(), key=lambda item: (item[1], -item[0]))
    for_it = matched[matched["rank"] != candidate]
    for_it = for_it[[last_of[key][0] == candidate for key in zip(for_it["comm"], for_it["seq"])]]
    others = [row for row in per_rank if row["rank"] != candidate and row["rank"] in set(matched["rank"])]
    pairs = int((matched["rank"] != candidate).sum())
    total = float(for_it["wait"].sum())
    if count > len(last_of) / 2 and pairs and total / pairs > MIN_WAIT:
        summary.straggler = candidate
        summary.sentence = _straggler_sentence(trace, candidate, last_of, others, total, pairs)
    else:
        summary.sentence = _balanced_sentence(last_of, last_counts, spreads, waited, len(matched) - len(last_of))
    return summary


def _own_checks_note(trace):
    """A line on mpinb's own checks, if the trace has any: how many, before which calls, how long; they are not
    matched as the user's collectives (their wait is the call they check for)."""
    own = trace[trace["kind"] == MPINB]
    if not len(own):
        return []
    ops = ", ".join(sorted(set(own["op"])))
    before = sorted({detail.removeprefix("mpinb's check before ") for detail in own["detail"]
                     if detail.startswith("mpinb's check before ")})
    per_rank = own.groupby("rank").size().max()
    where = f" inside {', '.join(before)}" if before else ""
    return [f"mpinb's own checks ({ops}{where}): {per_rank} per rank, counted as part of the calls they check "
            "for (a rank that arrives early waits in them)"]


def _matched(trace):
    """The rows of collectives worth matching: outermost calls of kind collective/torch with a seq."""
    keep = []
    for _, spans in trace.groupby("rank", sort=False):
        calls = spans[spans["kind"] != "step"]
        nested, _ = nesting(calls["start"].to_numpy(), calls["end"].to_numpy())
        blocking = calls["kind"].isin(BLOCKING) & calls["seq"].notna()
        blocking = blocking.to_numpy()
        keep.append(calls[blocking & ~nested])
    if not keep:
        return trace.iloc[:0]
    return pd.concat(keep)


def union_length(starts, ends):
    """The total length covered by intervals ``[starts[i], ends[i]]`` (overlaps and nesting counted once)."""
    starts, ends = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
    if not len(starts):
        return 0.0
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    first = np.flatnonzero(np.concatenate([[True], starts[1:] > reach[:-1]]))
    return float((np.maximum.reduceat(ends, first) - starts[first]).sum())


def _rank_row(trace, rank, waited, last):
    spans = trace[trace["rank"] == rank]
    calls = spans[spans["kind"] != "step"]
    wall = float(spans["end"].max() - spans["start"].min()) if len(spans) else 0.0
    starts, ends = calls["start"].to_numpy(), calls["end"].to_numpy()
    comm = min(union_length(starts, ends), wall)
    # bytes of the calls the code made: a call wrapping others (torch over MPI) counts the larger of its own
    # bytes and theirs, so the pair counts once
    nested, holders = nesting(starts, ends)
    moved = {field: _outer_sum(calls[field].to_numpy(), nested, holders) for field in ("sent", "received")}
    slowest = ""
    if len(calls):
        durations = ends - starts
        longest = int(np.argmax(durations))
        slowest = f"{label(calls['op'].iloc[longest], calls['kind'].iloc[longest])} " \
                  f"{duration(float(durations[longest]))}"
    return {"rank": int(rank), "comm_seconds": comm, "compute_seconds": wall - comm,
            "comm_share": comm / wall if wall > 0 else 0.0,
            "sent": moved["sent"], "received": moved["received"], "calls": len(calls), "slowest": slowest,
            "waited": float(waited), "last": last}


def _outer_sum(values, nested, holders):
    """The sum of *values* over the outermost calls, each the larger of its own and that of the calls inside."""
    inside = np.zeros(len(values), dtype=np.int64)
    np.add.at(inside, holders[nested], values[nested])
    return int(np.maximum(values, inside)[~nested].sum())


def _straggler_sentence(trace, rank, last_of, others, total, pairs):
    ops = collections.Counter(op for last, op in last_of.values() if last == rank)
    op = ops.most_common(1)[0][0]
    of_op = sum(1 for _, group_op in last_of.values() if group_op == op)
    text = f"rank {rank} arrived last at {ops[op]} of {of_op} {op} calls"
    rest = len(last_of) - of_op
    if rest and sum(ops.values()) > ops[op]:
        text += f" (and at {sum(ops.values()) - ops[op]} of {rest} other collectives)"
    ranks = [row["rank"] for row in others]
    steps = trace[(trace["kind"] == "step") & trace["rank"].isin(ranks)].groupby("rank").size()
    if len(steps) and steps.mean() > 0:
        each = f"{duration(total / steps.mean() / max(1, len(ranks)))} per step"
    else:
        each = f"{duration(total / pairs)} per call"
    wall = sum(row["comm_seconds"] + row["compute_seconds"] for row in others)
    share = f" ({100 * total / wall:.0f}% of their time)" if wall > 0 else ""
    return f"{text}; the other ranks waited {each} for it{share}"


def _balanced_sentence(last_of, last_counts, spreads, waits, pairs):
    """*pairs*: how many (rank, collective) arrivals could have waited (all but each collective's last)."""
    n = len(last_of)
    spread = duration(float(np.max(spreads))) if len(spreads) else duration(0.0)
    mean = sum(waits.values()) / pairs if pairs else 0.0
    noun = "collective" if n == 1 else "collectives"
    if mean <= MIN_WAIT:
        return f"no rank held the others up: the ranks arrived within {spread} of each other at {n} {noun}"
    rank, count = last_counts.most_common(1)[0]
    return (f"no single rank held the others up: the ranks arrived up to {spread} apart at {n} {noun} and "
            f"waited {duration(mean)} per call on average; rank {rank} arrived last most often ({count} of {n})")


def _optional(value):
    return None if value is None or value is pd.NA else int(value)
