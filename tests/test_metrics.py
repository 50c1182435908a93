"""mpinb.report() under %%mpi on real worlds: the history, the live views, and mpinb.metrics()."""

import subprocess
import sys

import pytest
from IPython.core.error import UsageError

import mpinb
from mpinb.errors import RankError

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]


def test_every_reported_value_reaches_mpinb_metrics(fresh, mpi, capsys):
    fresh(2)
    mpi("""
import mpinb
for step in range(3000):
    mpinb.report(step=step, loss=rank + step / 3000, lr=0.1)
print("trained")
""")  # the last report is sent right before the cell ends: it must not be lost
    frame = mpinb.metrics()
    assert len(frame) == 2 * 3000 * 2
    for rank in (0, 1):
        loss = frame[(frame["rank"] == rank) & (frame.name == "loss")]
        assert loss.step.tolist() == list(range(3000))
        assert loss.value.tolist() == [rank + step / 3000 for step in range(3000)]
    out = capsys.readouterr().out
    assert "[rank 0] trained" in out
    assert "metrics of run 'main':" in out and out.rstrip().splitlines()[-1].startswith("1     2999  1.9997")


def test_cells_extend_the_same_run_until_a_new_one_starts(fresh, mpi, capsys):
    fresh(2)
    mpi("import mpinb\nfor _ in range(5): mpinb.report(loss=1.0)")
    mpi("for _ in range(5): mpinb.report(loss=2.0)")
    mpi("for _ in range(3): mpinb.report(loss=3.0, run='lr=0.1')")
    mpi("mpinb.report(loss=4.0)")  # stays in the run named last
    frame = mpinb.metrics()
    main = frame[(frame.run == "main") & (frame["rank"] == 1)]
    assert main.step.tolist() == list(range(10)) and main.value.tolist() == [1.0] * 5 + [2.0] * 5
    other = mpinb.metrics(run="lr=0.1")
    assert other[other["rank"] == 0].value.tolist() == [3.0, 3.0, 3.0, 4.0]
    assert other[other["rank"] == 0].step.tolist() == [0, 1, 2, 3]


def test_nan_on_one_rank_is_reported_while_the_cell_runs(fresh, mpi, capsys):
    fresh(4)
    mpi("""
import math, mpinb
for step in range(300):
    mpinb.report(loss=math.nan if rank == 3 and step >= 212 else 1.0)
""")
    captured = capsys.readouterr()
    assert captured.err.count("became NaN") == 1
    assert "[mpinb] rank 3: loss became NaN at step 212" in captured.err
    assert "loss became NaN at step 212" in captured.out.splitlines()[-1]


def test_a_dead_rank_is_noticed_while_metrics_keep_arriving(ip, mpi, fresh):
    fresh(2)
    with pytest.raises(RankError, match="rank 1 died"):  # rank 0 never stops by itself: the death ends the cell
        mpi("""
import os, time, mpinb
t0 = time.monotonic()
while True:
    mpinb.report(loss=1.0)
    time.sleep(0.001)
    if rank == 1 and time.monotonic() - t0 > 1:
        os._exit(3)
""")
    assert len(mpinb.metrics()) > 100  # what the ranks sent before the death is kept
    ip.run_line_magic("mpi", "restart")


def test_widget_view_draws_every_rank_and_keeps_the_last_value(world_of, ip, magics, mpi, fresh, monkeypatch):
    fresh(2)
    monkeypatch.setattr(magics, "live_view", "widgets")
    mpi("""
import time, mpinb
for step in range(5000):
    mpinb.report(step=step, loss=(rank + 1) * 1000 - step)
    if step % 500 == 0:
        time.sleep(0.05)
""")
    view = magics.live.view
    lines = view.lines
    assert sorted(lines) == [("main", "loss", 0), ("main", "loss", 1)]
    for rank in (0, 1):
        line = lines[("main", "loss", rank)]
        assert line.labels == [f"rank {rank}"]
        assert len(line.x) <= magics.max_points + 2  # decimated for drawing ...
        assert line.x[-1] == 4999 and line.y[-1] == (rank + 1) * 1000 - 4999  # ... keeping the final value
        assert line.y.max() == (rank + 1) * 1000
    assert "background:#ff7f0e" in view.tables.value and "<b>1</b>" in view.tables.value and ">4999<" in view.tables.value
    assert len(mpinb.metrics()) == 10000
    live = magics.live
    assert live.refreshes <= 2 + live.batches  # redraws follow batches at most, never single reports


def test_metrics_line_magic(world_of, ip, mpi, fresh, capsys):
    fresh(2)
    ip.run_line_magic("mpi", "metrics")
    assert "no metrics reported in this world yet" in capsys.readouterr().out
    mpi("import mpinb\nmpinb.report(acc=0.5, run='eval')")
    capsys.readouterr()
    ip.run_line_magic("mpi", "metrics")
    assert capsys.readouterr().out.splitlines()[:2] == ["metrics of run 'eval':", "rank  step  acc  steps/s  notes"]
    with pytest.raises(UsageError, match="no run 'nope' in this world's metrics; runs: eval"):
        ip.run_line_magic("mpi", "metrics --run nope")


def test_bad_report_arguments_fail_the_cell_with_a_clear_message(fresh, mpi):
    fresh(2)
    with pytest.raises(RankError, match=r"ranks 0-1: TypeError: mpinb.report\(loss=...\) takes a number"):
        mpi("import mpinb\nmpinb.report(loss='low')")


def test_metrics_outside_the_notebook_says_where_it_works():
    done = subprocess.run([sys.executable, "-c", "import mpinb; mpinb.metrics()"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert "RuntimeError: mpinb.metrics() reads the notebook's copy" in done.stderr
    assert "call it in the notebook after %load_ext mpinb" in done.stderr


def test_a_re_run_of_the_training_cell_is_a_run_of_its_own(fresh, ip, capsys):
    """Steps 0-59 reported twice from cells run one after the other (as a re-run does): two runs, each with its own
    curve and rates, told apart in mpinb.metrics(); a cell that goes on counting continues the run."""
    fresh(2)
    training = "%%mpi\nimport mpinb, time\nfor step in range(60):\n    time.sleep(0.01)\n" \
               "    mpinb.report(step=step, loss=1.0 / (step + 1))"
    for _ in range(2):
        assert ip.run_cell(training).success
    frame = mpinb.metrics()
    assert sorted(frame.run.unique()) == ["main", "main #2"]
    for run in ("main", "main #2"):
        for rank in (0, 1):
            rows = frame[(frame.run == run) & (frame["rank"] == rank)]
            assert rows.step.tolist() == list(range(60))  # no curve joins step 59 back to step 0
    history = ip.magics_manager.registry["MPIMagics"].history
    assert all(rate is not None and rate > 0 for rate in history.rates("main #2").values())
    assert ip.run_cell(training.replace("range(60)", "range(60, 70)")).success  # counting on: the same run
    frame = mpinb.metrics()
    assert sorted(frame.run.unique()) == ["main", "main #2"]
    assert frame[(frame.run == "main #2") & (frame["rank"] == 0)].step.tolist() == list(range(70))
    out = capsys.readouterr().out
    assert "metrics of run 'main #2':" in out
