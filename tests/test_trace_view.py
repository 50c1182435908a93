"""The trace's table, its Chrome export, its summary (who held whom up) and the timeline widget, on made-up spans."""

import json

import numpy as np
import pytest

from mpinb.notebook import traces as tr
from mpinb.rank import chrome
from mpinb.widgets.timeline import TimelineWidget

MS = 1_000_000  # nanoseconds
T0 = 5_000_000_000_000  # a perf_counter_ns() of a long-running host


def training(*, ranks=4, steps=200, late=None, delay=30 * MS, compute=50 * MS, call=1 * MS, markers=True):
    """Spans of *steps* training steps: compute, then an Allreduce of 4 float64; rank *late* starts each one
    *delay* after the others, and everyone leaves it together."""
    spans = {rank: [] for rank in range(ranks)}
    now = T0
    for step in range(1, steps + 1):
        now += compute
        latest = now + (delay if late is not None else 0)
        for rank in range(ranks):
            start = latest if rank == late else now
            if markers:
                spans[rank].append(("step", "", None, 0, 0, start - 10, start - 10, step, "step", ""))
            spans[rank].append(("Allreduce", "COMM_WORLD", None, 32, 32, start, latest + call, step, "collective",
                                "4 x float64, SUM"))
        now = latest + call
    return spans


def test_frame_columns_types_and_bytes():
    spans = {1: [("Isend", "COMM_WORLD", 0, 8192, 0, T0 + 3 * MS, T0 + 4 * MS, None, "p2p", "Isend→0 8 KiB")],
             0: [("Irecv", "COMM_WORLD", 1, 0, 0, T0 + 2 * MS, T0 + 2 * MS + MS // 2, None, "p2p", ""),
                 ("Wait", "COMM_WORLD", None, 0, 8192, T0 + 3 * MS, T0 + 5 * MS, None, "wait", ""),
                 ("Bcast", "COMM_WORLD", 0, 64, 0, T0 + MS, T0 + 2 * MS, 1, "collective", "8 x float64")]}
    trace = tr.frame(spans)
    assert isinstance(trace, tr.Trace)
    assert list(trace.columns) == tr.COLUMNS
    assert trace["rank"].tolist() == [0, 0, 0, 1]
    assert trace["op"].tolist() == ["Bcast", "Irecv", "Wait", "Isend"]  # by rank, then start
    assert trace["bytes"].tolist() == [64, 0, 8192, 8192]
    assert str(trace["peer"].dtype) == "Int64" and str(trace["seq"].dtype) == "Int64"
    assert trace["peer"].isna().tolist() == [False, False, True, False]
    assert trace["seq"].tolist()[0] == 1 and trace["seq"].isna().sum() == 3
    assert trace["start"].tolist() == pytest.approx([0.0, 0.001, 0.002, 0.002])
    assert trace["end"].tolist() == pytest.approx([0.001, 0.0015, 0.004, 0.003])
    assert trace.origin_ns == T0 + MS
    sliced = trace[trace["rank"] == 0].sort_values("start")
    assert isinstance(sliced, tr.Trace) and sliced.origin_ns == T0 + MS
    assert sliced.spans()[0][0] == ("Bcast", "COMM_WORLD", 0, 64, 0, T0 + MS, T0 + 2 * MS, 1, "collective",
                                    "8 x float64")


def test_empty_frame():
    trace = tr.frame({})
    assert list(trace.columns) == tr.COLUMNS and len(trace) == 0
    assert tr.summarize(trace).sentence == "no collectives were traced"


def test_clocks_align_hosts_and_dropped_spans_are_said():
    call = ("Barrier", "COMM_WORLD", None, 0, 0, T0, T0 + MS, 1, "collective", "")
    later = ("Barrier", "COMM_WORLD", None, 0, 0, T0 + 7 * MS, T0 + 8 * MS, 1, "collective", "")
    wall = 1_700_000_000 * 10**9
    # ranks 0 and 1 share a host (one monotonic clock); rank 2's host booted 100 s later, its monotonic clock lags
    clocks = {0: (T0, wall + T0), 1: (T0 + 5, wall + T0 + 6), 2: (T0 - 100 * 10**9, wall + T0)}
    spans = {0: [call], 1: [later], 2: [call[:5] + (T0 - 100 * 10**9, T0 - 100 * 10**9 + MS) + call[7:]], 3: []}
    trace = tr.frame(spans, clocks=clocks, dropped={1: 12, 2: 0})
    assert trace["start"].tolist() == pytest.approx([0.0, 0.007, 0.0])
    assert trace.offset_ns == wall and trace.dropped == {1: 12} and trace.ranks == [0, 1, 2, 3]
    summary = tr.summarize(trace)
    assert [row["rank"] for row in summary.per_rank] == [0, 1, 2, 3] and summary.per_rank[3]["calls"] == 0
    assert summary.notes == ["rank 1's trace buffer was full: its 12 oldest calls are missing"]
    assert summary.notes[0] in tr.summary_text(summary) and "12 oldest" in tr.summary_html(summary)
    assert sorted(TimelineWidget(trace, summary).drawn) == [0, 1, 2, 3]


def test_chrome_export_is_valid_json(tmp_path):
    trace = tr.frame(training(ranks=3, steps=5))
    path = tmp_path / "trace.json"
    trace.to_chrome(path)
    data = json.loads(path.read_text())
    assert data["displayTimeUnit"] == "ms"
    events = data["traceEvents"]
    complete = [event for event in events if event["ph"] == "X"]
    assert len(complete) == 3 * 5
    names = {event["pid"]: event["args"]["name"] for event in events
             if event["ph"] == "M" and event["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2"}
    assert {event["args"]["sort_index"] for event in events if event["name"] == "process_sort_index"} == {0, 1, 2}
    first = min(complete, key=lambda event: event["ts"])
    assert first["name"] == "Allreduce" and first["cat"] == "collective" and first["tid"] == 0
    assert first["ts"] == pytest.approx((T0 + 50 * MS) / 1000) and first["dur"] == pytest.approx(1000)
    assert first["args"] == {"comm": "COMM_WORLD", "peer": None, "sent": 32, "received": 32, "seq": 1,
                             "detail": "4 x float64, SUM"}
    steps = [event for event in events if event["ph"] == "i"]
    assert len(steps) == 3 * 5 and all(event["s"] == "t" for event in steps)


def test_chrome_events_offset():
    events = chrome.events(3, [("Barrier", "COMM_WORLD", None, 0, 0, 10_000, 52_000, 1, "collective", "")],
                           offset_ns=-10_000)
    assert events[-1]["ts"] == 0 and events[-1]["dur"] == 42 and events[-1]["pid"] == 3


def test_straggler_named_per_step():
    summary = tr.summarize(tr.frame(training(late=2)))
    assert summary.straggler == 2
    assert summary.collectives == 200
    assert "rank 2 arrived last at 200 of 200 Allreduce calls" in summary.sentence
    assert "the other ranks waited 30 ms per step for it" in summary.sentence
    # each step the others spend 50 ms computing, 30 ms waiting and 1 ms in the sum: 30 / 81 of their time
    assert summary.sentence.endswith("(37% of their time)")
    rows = {row["rank"]: row for row in summary.per_rank}
    assert rows[2]["last"] == 200 and rows[0]["last"] == 0
    assert rows[0]["waited"] == pytest.approx(200 * 0.030)
    assert rows[2]["waited"] == 0
    assert rows[0]["comm_share"] > rows[2]["comm_share"]
    assert rows[0]["calls"] == 200 and rows[0]["sent"] == 200 * 32
    assert rows[0]["slowest"] == "Allreduce 31 ms"
    text = tr.summary_text(summary)
    assert text.splitlines()[0] == summary.sentence
    assert len(text.splitlines()) == 1 + 1 + 4 and "straggler" in text.splitlines()[4]
    page = tr.summary_html(summary)
    assert page.count("<tr") == 5 and page.count("background:#fdecea") == 1


def test_straggler_per_call_without_step_markers():
    summary = tr.summarize(tr.frame(training(late=1, steps=20, markers=False)))
    assert summary.straggler == 1
    assert "arrived last at 20 of 20 Allreduce calls; the other ranks waited 30 ms per call for it" in summary.sentence


def test_balanced_trace_names_nobody():
    summary = tr.summarize(tr.frame(training(late=None)))
    assert summary.straggler is None
    assert summary.sentence.startswith("no rank held the others up")
    assert "at 200 collectives" in summary.sentence
    assert "straggler" not in tr.summary_text(summary)


def test_small_delays_are_not_a_straggler():
    summary = tr.summarize(tr.frame(training(late=3, delay=MS // 5, steps=50)))
    assert summary.straggler is None
    assert "within 0.2 ms of each other at 50 collectives" in summary.sentence


def test_nested_spans_count_once():
    # a torch all_reduce wrapping the MPI Allreduce that does the work, then compute, then a Barrier
    spans = {rank: [("all_reduce", "torch:default", None, 0, 0, T0, T0 + 10 * MS, 1, "torch", ""),
                    ("Allreduce", "COMM_WORLD.Dup#1", None, 400, 400, T0 + MS, T0 + 9 * MS, 1, "collective", ""),
                    ("Barrier", "COMM_WORLD", None, 0, 0, T0 + 20 * MS, T0 + 25 * MS, 1, "collective", "")]
             for rank in range(2)}
    summary = tr.summarize(tr.frame(spans))
    row = summary.per_rank[0]
    assert row["comm_seconds"] == pytest.approx(0.015)
    assert row["compute_seconds"] == pytest.approx(0.010)
    assert row["comm_share"] == pytest.approx(0.6)
    assert row["sent"] == 400 and row["received"] == 400
    assert row["calls"] == 3
    assert summary.collectives == 2  # the all_reduce and the Barrier; the Allreduce inside is not matched again
    assert tr.union_length([0, 1, 2, 10], [5, 3, 6, 11]) == pytest.approx(7)
    # the torch wrapper says what it sent, the MPI call inside what went both ways: 400 each way, once
    spans[0][0] = ("all_reduce", "torch:default", None, 400, 0, T0, T0 + 10 * MS, 1, "torch", "")
    row = tr.summarize(tr.frame(spans)).per_rank[0]
    assert row["sent"] == 400 and row["received"] == 400


def test_timeline_decimates_drawing_not_data():
    spans = training(ranks=4, steps=10_000, late=2, delay=MS // 2, compute=2 * MS, call=MS // 10)
    trace = tr.frame(spans)
    assert len(trace) == 4 * 2 * 10_000
    view = TimelineWidget(trace, max_segments=500)
    assert len(view.trace) == len(trace)
    assert view.figure in view.widget.children
    assert view.y_scale.reverse and view.figure.axes[1].label == "rank"
    assert view.lines["Allreduce"].labels == ["Allreduce"]
    assert set(view.drawn) == {0, 1, 2, 3}
    assert all(0 < count <= 500 for count in view.drawn.values())
    x, y = view.lines["Allreduce"].x, view.lines["Allreduce"].y
    assert len(x) == len(y) == 3 * sum(view.drawn.values()) - 1  # no separator after the last bar
    assert np.isfinite(y[-1])  # bqplot places the line's label there: a NaN is an error in the browser
    x, y = np.append(x, np.nan), np.append(y, np.nan)
    assert np.isnan(y[2::3]).all() and set(y[0::3]) == {0, 1, 2, 3}
    bars = x.reshape(-1, 3)
    assert (bars[:, 1] >= bars[:, 0]).all()

    # zoom to a hundredth of the run: every call in view is its own bar again
    low, high = 10.0, 10.0 + float(trace["end"].max()) / 100
    redraws = view.redraws
    with view.x_scale.hold_trait_notifications():
        view.x_scale.min, view.x_scale.max = low, high
    assert view.redraws == redraws + 1
    in_view = trace[(trace["kind"] != "step") & (trace["end"] >= low) & (trace["start"] <= high)]
    counts = in_view.groupby("rank").size()
    assert all(view.drawn[rank] == counts[rank] for rank in range(4))
    x = np.append(view.lines["Allreduce"].x, np.nan).reshape(-1, 3)
    assert x[:, 0].min() >= low and x[:, 1].max() <= high
    assert len(view.step_line.x) > 0


def test_timeline_of_a_small_trace_draws_every_call():
    trace = tr.frame(training(ranks=2, steps=3))
    view = TimelineWidget(trace, tr.summarize(trace))
    assert view.drawn == {0: 3, 1: 3}
    assert "no rank held the others up" in view.table.value
