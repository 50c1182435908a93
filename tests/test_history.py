"""The per-rank metric history: what the charts draw and mpinb.metrics() returns, by direct assertions."""

import math

import numpy as np
import pytest

from mpinb.notebook.models.history import History
from mpinb.widgets.decimation import decimate
from mpinb.widgets.summary import summary_html, summary_text


def batch(run, steps, *, t0=100.0, dt=0.01, **metrics):
    """Records as a rank's agent sends them: (run, step, time, {name: value})."""
    return [(run, step, t0 + i * dt, {name: f(step) for name, f in metrics.items()})
            for i, step in enumerate(steps)]


def test_every_value_is_kept_exactly_in_order():
    history = History()
    history.add(0, batch("main", range(0, 100), loss=lambda s: 1 / (s + 1)))
    history.add(1, batch("main", range(0, 50), loss=lambda s: 2.0 ** -s))
    history.add(0, batch("main", range(100, 150), t0=101.0, loss=lambda s: 1 / (s + 1)))
    frame = history.to_frame()
    assert len(history) == len(frame) == 200
    assert list(frame.columns) == ["run", "rank", "step", "name", "value", "time"]
    rank0 = frame[frame["rank"] == 0]
    assert rank0.step.tolist() == list(range(150))
    assert rank0.value.tolist() == [1 / (s + 1) for s in range(150)]  # exact, not approximately
    assert frame[frame["rank"] == 1].value.iloc[-1] == 2.0 ** -49


def test_runs_and_metrics_stay_apart():
    history = History()
    history.add(0, batch("main", range(3), loss=float, acc=lambda s: s / 10))
    history.add(0, batch("lr=0.1", range(2), loss=lambda s: -s))
    assert history.runs() == ["main", "lr=0.1"]
    assert history.names == {"main": ["loss", "acc"], "lr=0.1": ["loss"]}
    assert len(history.to_frame("lr=0.1")) == 2
    assert history.to_frame("main").name.value_counts().to_dict() == {"acc": 3, "loss": 3}


def test_a_metric_going_nan_or_inf_is_flagged_once_with_rank_and_step():
    history = History()
    assert history.add(3, batch("main", range(5), loss=float)) == []
    alerts = history.add(3, batch("main", [5, 6, 7], loss=lambda s: math.nan))
    assert alerts == ["rank 3: loss became NaN at step 5"]
    assert history.add(3, batch("main", [8], loss=lambda s: math.nan)) == []
    assert history.add(2, batch("other", [0], loss=lambda s: -math.inf)) == [
        "rank 2: loss became -inf at step 0 (run other)"]
    (row,) = history.summary("main")
    assert row["notes"] == ["loss became NaN at step 5"] and math.isnan(row["values"]["loss"])


def test_steps_per_second_and_stragglers_use_each_rank_s_own_clock():
    history = History()
    history.add(0, batch("main", range(100), dt=0.01, loss=float))  # 100 steps/s
    history.add(1, batch("main", range(100), dt=0.0105, loss=float))  # a little slower: not a straggler
    history.add(2, batch("main", range(40), dt=0.025, loss=float))  # 40 steps/s
    rates = history.rates("main")
    assert rates[0] == pytest.approx(100) and rates[2] == pytest.approx(40)
    assert set(history.stragglers("main")) == {2}
    notes = {row["rank"]: row["notes"] for row in history.summary("main")}
    assert notes[0] == notes[1] == [] and notes[2][0].startswith("straggler: 0.42×")


def test_rates_measure_the_recent_window_only():
    history = History(window=1.0)
    history.add(0, batch("main", range(100), t0=0.0, dt=0.1, loss=float))  # 10 steps/s for 10 s
    history.add(0, batch("main", range(100, 200), t0=10.0, dt=0.01, loss=float))  # then 100 steps/s
    assert history.rates("main")[0] == pytest.approx(100, rel=0.1)


def test_a_rank_that_went_quiet_is_noted_while_others_report():
    history = History()
    history.add(0, batch("main", range(3), loss=float), arrived=10.0)
    history.add(1, batch("main", range(3), loss=float), arrived=19.5)
    assert history.silent("main", now=20.0) == {0: 10.0}
    assert history.silent("main", now=40.0) == {}  # everyone quiet: the cell is doing something else
    live = {row["rank"]: row["notes"] for row in history.summary("main", now=20.0, live=True)}
    assert live[0] == ["no report for 10 s"] and live[1] == []
    assert all(not row["notes"] for row in history.summary("main", now=20.0))


def test_summary_as_text_and_html():
    history = History()
    history.add(0, batch("main", range(10), loss=lambda s: 0.5, lr=lambda s: 0.01))
    history.add(1, batch("main", range(10), loss=lambda s: math.nan if s > 4 else 0.5, lr=lambda s: 0.01))
    text = summary_text(history, "main")
    assert text.splitlines()[1].split() == ["rank", "step", "loss", "lr", "steps/s", "notes"]
    assert text.splitlines()[3].startswith("1     9     nan") and "loss became NaN at step 5" in text
    page = summary_html(history, "main")
    assert page.count("<tr") == 3 and "background:#fdecea" in page


def test_decimation_keeps_spikes_ends_and_bounds():
    steps = np.arange(100_000)
    values = np.sin(steps / 1000.0)
    values[54_321] = 50.0
    values[77_777] = np.nan
    x, y = decimate(steps, values, 1000)
    assert len(x) <= 1002 and x[0] == 0 and x[-1] == 99_999
    assert 54_321 in x and 77_777 in x and np.isnan(y[x == 77_777]).all()
    assert np.all(np.diff(x) > 0)
    small = np.arange(10)
    assert decimate(small, small * 1.0, 1000)[0] is small
