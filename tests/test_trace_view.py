"""The trace's table, its Chrome export, its summary (who held whom up) and the timeline widget, on made-up spans."""

import base64
import json
import re

import numpy as np
import pytest

from mpinb.notebook.models import traces as tr
from mpinb.wire import chrome_trace as chrome
from mpinb.widgets.idle_folding import Folding
from mpinb.widgets.timeline import TimelineWidget, _js_number, legend_html
from mpinb.widgets.timeline_drawing import Drawing
from mpinb.widgets.timeline_static import BAND_COLOR, timeline_bundle, timeline_figure
from mpinb.widgets.trace_rows import label
from mpinb.widgets.trace_summary import HIGHLIGHT, summary_html, summary_text

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
    assert summary.notes[0] in summary_text(summary) and "12 oldest" in summary_html(summary)
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
    text = summary_text(summary)
    assert text.splitlines()[0] == summary.sentence
    assert len(text.splitlines()) == 1 + 1 + 4 and "straggler" in text.splitlines()[4]
    page = summary_html(summary)
    assert page.count("<tr") == 5 and page.count(f"background:{HIGHLIGHT}") == 1


def test_straggler_per_call_without_step_markers():
    summary = tr.summarize(tr.frame(training(late=1, steps=20, markers=False)))
    assert summary.straggler == 1
    assert "arrived last at 20 of 20 Allreduce calls; the other ranks waited 30 ms per call for it" in summary.sentence


def test_balanced_trace_names_nobody():
    summary = tr.summarize(tr.frame(training(late=None)))
    assert summary.straggler is None
    assert summary.sentence.startswith("no rank held the others up")
    assert "at 200 collectives" in summary.sentence
    assert "straggler" not in summary_text(summary)


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
    view = TimelineWidget(trace, tr.summarize(trace), max_segments=500)
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


def after_idle(*, ranks=4, steps=60, late=2, idle=20_000 * MS, delay=30 * MS):
    """What a user's training cell with ``%%mpi --trace`` records: ``broadcast_parameters`` at once, *idle*
    without any MPI call (a data load), then *steps* steps of ``allreduce_gradients``, each made of mpinb's own
    agreement allgather and an Allreduce of 65 float32; rank *late* arrives *delay* after the others."""
    spans = {rank: [] for rank in range(ranks)}
    for rank in range(ranks):
        spans[rank] += [
            ("broadcast_parameters", "COMM_WORLD", None, 0, 0, T0, T0 + 3 * MS, 1, "torch", ""),
            ("allgather", "COMM_WORLD", None, 0, 0, T0, T0 + MS, 1, "mpinb",
             "mpinb's check before broadcast_parameters"),
            ("Bcast", "COMM_WORLD", 0, 260, 0, T0 + MS, T0 + 3 * MS, 2, "collective", "65 x float32")]
    now, seq = T0 + 3 * MS + idle, 2
    for step in range(steps):
        now += 50 * MS
        latest = now + delay
        for rank in range(ranks):
            start = latest if rank == late else now
            spans[rank] += [
                ("step", "", None, 0, 0, start - 10, start - 10, step, "step", ""),
                ("allreduce_gradients", "COMM_WORLD", None, 0, 0, start, latest + 2 * MS, seq + 1, "torch", ""),
                ("allgather", "COMM_WORLD", None, 0, 0, start + 10_000, latest + MS, seq + 1, "mpinb",
                 "mpinb's check before allreduce_gradients"),
                ("Allreduce", "COMM_WORLD", None, 260, 260, latest + MS, latest + 2 * MS - 10_000, seq + 2,
                 "collective", "SUM, 65 x float32")]
        seq += 2
        now = latest + 2 * MS
    return spans


def test_an_idle_stretch_is_folded_into_a_labelled_band_and_the_steps_fill_the_picture():
    """The user's picture spanned 0-26 s with the 60 steps squeezed into the last 5 s: the 20 s without any call
    is now a narrow band saying how long it was, and the axis still reads the seconds since the trace began."""
    trace = tr.frame(after_idle())
    fold = Folding.of(trace)
    (low, high, seconds), = fold.bands
    assert seconds == pytest.approx(20.05, abs=1e-6) and Folding.label(seconds) == "idle 20.0 s"
    assert (high - low) / fold.extent < 0.05
    steps = trace[trace["kind"] == "step"]
    first = float(fold.fold(steps["start"].min()))
    assert (fold.extent - first) / fold.extent > 0.9
    # true distances inside the stretches left as they are, and the ticks say the seconds since the start
    assert fold.fold(24.0) - fold.fold(23.0) == pytest.approx(1.0)
    assert fold.unfold(fold.fold(np.array([0.001, 21.5, 24.9]))) == pytest.approx([0.001, 21.5, 24.9])
    ticks = fold.ticks(0.0, fold.extent)
    assert ticks[0] == (0.0, "0")
    for position, text in ticks[1:]:
        assert float(fold.unfold(position)) == pytest.approx(float(text)) and float(text) > 20
        assert not low < position < high
    # the regular gaps between steps (compute) are never folded
    assert Folding.of(tr.frame(training(late=2))).bands == []
    assert Folding.of(tr.frame(after_idle(idle=300 * MS))).bands == []


def test_the_straggler_is_visible_in_the_picture_and_its_lane_named():
    trace = tr.frame(after_idle())
    summary = tr.summarize(trace)
    drawing = Drawing(trace, summary)
    assert drawing.straggler == 2 and drawing.rank_label(2) == "rank 2 (straggler)"
    (wait,) = [lanes for layer, _, color, lanes in drawing.series if layer == "wait"]
    assert sorted(wait) == [0, 1, 3]  # every rank but the straggler waits, in every step
    for rank in (0, 1, 3):
        starts, ends = wait[rank]
        assert len(starts) == 60 and np.allclose(ends - starts, 0.030)
    layers = {(layer, name) for layer, name, *_ in drawing.series}
    assert ("call", "allreduce_gradients") in layers and ("nested", "mpinb check (allgather)") in layers
    assert ("nested", "Allreduce") in layers and ("call", "Allreduce") not in layers
    view = TimelineWidget(trace, summary)
    assert view.x_scale.max == pytest.approx(Folding.of(trace).extent)
    assert view.drawn_waits == {0: 60, 1: 60, 2: 0, 3: 60}
    assert view.y_axis.tick_labels == {"2": "2 (straggler)"}
    band, label = view.figure.marks[:2]
    assert list(label.text) == ["idle 20.0 s"] and band.fill == "inside"
    assert view.x_axis.tick_labels["0"] == "0" and "21" in view.x_axis.tick_labels.values()
    assert all(key == _js_number(value) for key, value in zip(view.x_axis.tick_labels, view.x_axis.tick_values))
    # zoomed in on one step: the tick labels are its seconds, finer
    step = float(Folding.of(trace).fold(21.0))
    with view.x_scale.hold_trait_notifications():
        view.x_scale.min, view.x_scale.max = step, step + 0.1
    texts = list(view.x_axis.tick_labels.values())
    assert texts and all(21.0 <= float(text) <= 21.1 + 1e-9 for text in texts) and "." in texts[1]


def test_the_static_rendering_is_an_opaque_picture_of_the_folded_steps(tmp_path):
    from PIL import Image

    trace = tr.frame(after_idle())
    summary = tr.summarize(trace)
    data = timeline_bundle(trace, summary)
    assert set(data) == {"text/plain", "text/html", "image/png"}
    assert data["text/plain"] == summary_text(summary)
    path = tmp_path / "timeline.png"
    path.write_bytes(base64.b64decode(data["image/png"]))
    image = Image.open(path)
    assert image.mode in ("RGB", "RGBA")
    pixels = np.asarray(image.convert("RGBA"))
    assert (pixels[..., 3] == 255).all()  # its own background, whatever the page's
    assert tuple(pixels[0, 0, :3]) == (255, 255, 255) and tuple(pixels[-1, -1, :3]) == (255, 255, 255)
    red = np.all(np.abs(pixels[..., :3].astype(int) - [0xB2, 0x18, 0x2B]) < 8, axis=-1)
    assert red.sum() > 2000  # the waits of the ranks that wait for the straggler
    fig = timeline_figure(trace, summary)
    ax = fig.axes[0]
    assert [text.get_text() for text in ax.texts if text.get_rotation() == 90] == ["idle 20.0 s"]
    assert ax.get_xlim() == pytest.approx((0.0, Folding.of(trace).extent))
    assert "rank 2 (straggler)" in [label.get_text() for label in ax.get_yticklabels()]
    # every text of the picture reads on what it is drawn on: white, or the band (the label written up it)
    from matplotlib.colors import to_hex

    fig.canvas.draw()
    texts = [*ax.texts, *ax.get_xticklabels(), *ax.get_yticklabels(), ax.xaxis.label, *ax.get_legend().get_texts()]
    for text in texts:
        ground = BAND_COLOR if text.get_rotation() == 90 else "#ffffff"
        assert text.get_text() and _contrast(_rgba(to_hex(text.get_color())), _rgba(ground)) >= 4.5, text


def test_mpinb_s_own_checks_are_labelled_and_the_users_call_is_blamed():
    """The summary blamed "allgather" calls, mpinb's own agreement check before each allreduce_gradients; the
    user's call is the one named, mpinb's checks said apart."""
    summary = tr.summarize(tr.frame(after_idle()))
    assert summary.straggler == 2
    assert summary.sentence.startswith("rank 2 arrived last at 60 of 60 allreduce_gradients calls; ")
    assert "allgather" not in summary.sentence
    (note,) = summary.notes
    assert note.startswith("mpinb's own checks (allgather inside allreduce_gradients, broadcast_parameters)")
    assert label("allgather", "mpinb") == "mpinb check (allgather)" and label("allgather", "collective") \
        == "allgather"
    rows = {row["rank"]: row for row in summary.per_rank}
    assert rows[0]["slowest"].startswith("allreduce_gradients ")
    # a check alone (the one GradientAllreducer makes when built) is shown as mpinb's
    spans = {rank: [("allgather", "COMM_WORLD.Dup#1", None, 0, 0, T0, T0 + (5 + rank) * MS, 1, "mpinb",
                     "mpinb's check before GradientAllreducer")] for rank in range(2)}
    summary = tr.summarize(tr.frame(spans))
    assert summary.straggler is None and summary.collectives == 0
    assert summary.per_rank[1]["slowest"] == "mpinb check (allgather) 6.0 ms"


def test_a_buffer_given_with_its_datatype_says_the_users_dtype_and_count():
    """mpinb.torch passes a tensor's memory as uint8 with the count and MPI type of its elements: the span said
    "SUM, 260 x uint8" for 65 float32 gradients."""
    from mpi4py import MPI

    from mpinb.rank.tracing.arguments import describe

    memory = np.zeros(260, dtype=np.uint8)
    assert describe([memory, 65, MPI.FLOAT]) == (65, "float32", 260)
    assert describe([memory, MPI.FLOAT]) == (65, "float32", 260)
    assert describe([np.zeros(10), 3, MPI.DOUBLE]) == (3, "float64", 24)
    assert describe([np.zeros(10), "d"]) == (10, "float64", 80)
    assert describe([np.zeros(6), [1, 2, 3]]) == (6, "float64", 48)  # [data, counts]: the data's own type
    assert describe([np.zeros(6), ([1, 2, 3], [0, 1, 3]), MPI.DOUBLE]) == (6, "float64", 48)
    assert describe([memory[:8], 8, MPI.BYTE]) == (8, "byte", 8)
    assert describe(np.zeros(4, "f")) == (4, "float32", 16)


THEMES = {  # JupyterLab 4's values of the variables the HTML uses; None: a page without them (the fallbacks)
    "light": {"--jp-content-font-color1": "rgba(0,0,0,.87)", "--jp-content-font-color2": "rgba(0,0,0,.54)",
              "--jp-layout-color0": "#ffffff", "--jp-rendermime-error-background": "#ffdddd"},
    "dark": {"--jp-content-font-color1": "#ffffff", "--jp-content-font-color2": "rgba(255,255,255,.7)",
             "--jp-layout-color0": "#111111", "--jp-rendermime-error-background": "rgba(244,67,54,.28)"},
    "fallbacks": {},
}


def _rgba(value):
    value = value.strip()
    if value.startswith("#"):
        digits = value[1:]
        if len(digits) == 3:
            digits = "".join(c * 2 for c in digits)
        return tuple(int(digits[i:i + 2], 16) for i in (0, 2, 4)) + (1.0,)
    parts = [float(p) for p in re.findall(r"[\d.]+", value)]
    return tuple(parts[:3]) + (parts[3] if len(parts) > 3 else 1.0,)


def _resolve(value, theme):
    match = re.fullmatch(r"var\((--[\w-]+),(.+)\)", value.strip())
    if match is None:
        return _rgba(value)
    return _rgba(THEMES[theme].get(match.group(1), match.group(2)))


def _over(color, below):
    alpha = color[3]
    return tuple(alpha * c + (1 - alpha) * b for c, b in zip(color[:3], below[:3])) + (1.0,)


def _contrast(one, two):
    def luminance(color):
        channels = [c / 255 for c in color[:3]]
        channels = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * channels[0] + 0.7152 * channels[1] + 0.0722 * channels[2]

    high, low = sorted([luminance(one), luminance(two)], reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_the_timelines_text_reads_in_jupyterlab_light_and_dark():
    """Every text colour of the legend and the summary table, on every background they set (the straggler's row
    too), is 4.5:1 or better in JupyterLab Light, Dark, and where its variables are not defined; text is never a
    fixed colour (a rank's colour is a box beside its number)."""
    trace = tr.frame(after_idle())
    summary = tr.summarize(trace)
    for page in (summary_html(summary), legend_html(Drawing(trace, summary))):  # each text on each ground
        styles = re.findall(r"style='([^']*)'", page)
        texts = {m for style in styles for m in re.findall(r"(?:^|;)color:([^;]+)", style)}
        grounds = {m for style in styles if "inline-block" not in style  # a swatch is no background to text
                   for m in re.findall(r"(?:^|;)background:([^;]+)", style)}
        assert texts and grounds
        assert all(text.startswith("var(--jp-") for text in texts), texts
        for theme in THEMES:
            page_ground = _resolve("var(--jp-layout-color0,#fff)", theme)
            for ground in grounds:
                under = _over(_resolve(ground, theme), page_ground)
                for text in texts:
                    ratio = _contrast(_over(_resolve(text, theme), under), under)
                    assert ratio >= 4.5, (theme, text, ground, ratio)


def test_mpi_trace_shows_the_zoomable_timeline_with_the_static_one_as_fallback(ip, magics, monkeypatch):
    """%mpi trace showed the static image only (zoomable with keep_widgets alone): now the widget while the
    kernel lives, and in the same output the static rendering for a notebook saved or exported."""
    from IPython.utils.capture import capture_output

    trace = tr.frame(after_idle(ranks=2, steps=5))
    monkeypatch.setattr(magics.cells, "last_trace", trace)  # as a traced cell leaves it
    monkeypatch.setattr(magics, "live_view", "widgets")
    with capture_output() as captured:
        ip.run_line_magic("mpi", "trace")
    (shown,) = [output.data for output in captured.outputs]
    assert set(shown) == {"application/vnd.jupyter.widget-view+json", "image/png", "text/html", "text/plain"}
    assert shown["text/plain"] == summary_text(tr.summarize(trace))
    monkeypatch.setattr(magics, "live_view", "text")
    with capture_output() as captured:
        ip.run_line_magic("mpi", "trace")
    assert not captured.outputs and "allreduce_gradients" in captured.stdout
