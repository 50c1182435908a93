"""While a cell runs: feed the ranks' metric batches into the world's History and keep a view of it current.

In a notebook the view is a :class:`~mpinb.widgets.charts.MetricsWidget`, displayed in the cell's output when
the first report arrives and refreshed in place at most every ``refresh_interval`` seconds. In a terminal,
alerts (a metric that became NaN) print as they are found and the per-rank table prints when the cell ends.
"""

import sys
import time

from ...widgets import views
from ...widgets.summary import summary_text

# JupyterLab breaks an output's <pre> anywhere (word-break: break-all): 'cal/l'; lines break between words here
PRE_WRAP = "white-space:pre-wrap;word-break:normal;overflow-wrap:break-word"


class LiveMetrics:
    """The metrics side of one running cell.

    Parameters
    ----------
    history : History
        Where every batch goes (the world's).
    view : {"widgets", "text", "off"}
        Live charts (a notebook), text (a terminal), or nothing shown (the history is kept all the same).
    refresh_interval : float, default 0.25
        Seconds between redraws at most; with ``max_points`` it bounds what the browser receives.
    max_points : int, default 1000
        Points drawn per curve at most.
    runs : list of str
        Runs to show already (``%mpi metrics``); a running cell adds each run as its first report arrives.
    show_after : float, default 2.0
        Seconds the cell must have run before its live charts are displayed: a shorter cell's would be replaced
        by their static rendering before the browser drew them, which then shows alone.
    """

    def __init__(self, history, *, view, refresh_interval=0.25, max_points=1000, stderr=None, stdout=None,
                 runs=(), show_after=2.0):
        self.history, self.widgets, self.text = history, view == "widgets", view == "text"
        self.refresh_interval, self.max_points = refresh_interval, max_points
        self.stderr, self.stdout = stderr or sys.stderr, stdout or sys.stdout
        self.view = None
        self.runs = list(runs)
        self.batches = self.records = self.refreshes = 0
        self._next_refresh = 0.0
        self.started, self.show_after, self.displayed = time.monotonic(), show_after, False

    def add(self, rank, records):
        """One batch from *rank*."""
        self.batches += 1
        self.records += len(records)
        alerts = self.history.add(rank, records)
        for record in records:
            run = self.history.current_run(record[0])
            if run not in self.runs:
                self.runs.append(run)
        if alerts and self.text:
            self.stderr.write("".join(f"[mpinb] {alert}\n" for alert in alerts))
            self.stderr.flush()

    def tick(self, now=None, *, finished=()):
        """Redraw if something arrived and the last redraw is ``refresh_interval`` old; *finished* ranks are
        done with the cell (not silent)."""
        now = time.monotonic() if now is None else now
        if self.widgets and self.runs and now >= self._next_refresh:
            self._refresh(now, live=True, finished=finished)

    def finish(self):
        """The cell ended: draw the final state (every rank's last value), or print the table in a terminal."""
        if not self.runs:
            return
        if self.widgets:
            self._refresh(time.monotonic(), live=False)
            if not self.displayed:
                views.show_at_end(lambda: self.view.widget, self._static, name="live charts")
                if not views.keep_widgets:
                    views.close_later(self.view.widget)
        elif self.text:
            self.stdout.write("".join(summary_text(self.history, run) + "\n" for run in self.runs))
            self.stdout.flush()

    def _refresh(self, now, *, live, finished=()):
        if self.view is None:
            from ...widgets.charts import MetricsWidget

            self.view = MetricsWidget(self.history, max_points=self.max_points)
        if live and not self.displayed and now - self.started >= self.show_after:
            self.displayed = True
            views.show(self.view.widget, self._static, name="live charts")
        for run in self.runs:
            self.view.show(run)
        self.view.refresh(now=now, live=live, finished=finished)
        self.refreshes += 1
        self._next_refresh = now + self.refresh_interval


    def _static(self):
        from ...widgets.static import metrics_bundle

        log = {key: toggle.value for key, toggle in self.view.log_toggles.items() if toggle.value}
        return metrics_bundle(self.history, list(self.runs), log=log)


class CellStatus:
    """A long cell says where it is: after *after* seconds, one line per rank (finished, or running and its
    last reported step), updated in place in a notebook (every *every* s) and printed every *after* s in a
    terminal.
    """

    def __init__(self, history, *, widgets, after=30.0, every=1.0, stream=None):
        self.history, self.widgets, self.after, self.every = history, widgets, after, every
        self.stream = stream or sys.stderr
        self.view = None
        self.updates = 0
        self._next = None
        # when each rank's progress arrived before this cell: a step reported in an earlier cell is not this one's
        self._before = {key: progress.arrived for key, progress in history.progress.items()}

    def tick(self, elapsed, ranks, finished):
        if not self.after or elapsed < self.after or (self._next is not None and elapsed < self._next):
            return
        self._next = elapsed + (self.every if self.widgets else self.after)
        lines = self.lines(elapsed, ranks, finished)
        self.updates += 1
        if self.widgets:
            import html

            import ipywidgets

            text = "<br>".join(html.escape(line) for line in lines)
            if self.view is None:  # gone when the cell ends: what it said is no longer true
                self.view = ipywidgets.HTML(f"<pre style=\"{PRE_WRAP}\">{text}</pre>")
                views.show(self.view, lambda: {"text/plain": ""}, name="cell status")
            else:
                self.view.value = f"<pre style=\"{PRE_WRAP}\">{text}</pre>"
        else:
            self.stream.write("".join(f"[mpinb] {line}\n" for line in lines))
            self.stream.flush()

    def lines(self, elapsed, ranks, finished):
        """``["cell running for 42 s", "rank 0: finished", "rank 1: running, step 120", ...]``."""
        steps = {}
        for key, progress in self.history.progress.items():
            if key in self._before and progress.arrived == self._before[key]:
                continue  # nothing new from this rank in this cell
            steps[key[1]] = progress.step if progress.step is not None else steps.get(key[1])
        out = [f"cell running for {elapsed:.0f} s"]
        for rank in ranks:
            if rank in finished:
                out.append(f"rank {rank}: finished")
            else:
                step = f", last reported step {steps[rank]}" if rank in steps else ""
                out.append(f"rank {rank}: running{step}")
        return out


class LiveTrace:
    """The trace of one ``%%mpi --trace`` cell: every rank's spans as their batches arrive, and at the end the
    :class:`~mpinb.notebook.models.traces.Trace`, its summary, and the timeline (a widget in a notebook, text in a terminal).

    Parameters
    ----------
    view : {"widgets", "text", "off"}
        Where the timeline and summary go when the cell ends.
    """

    def __init__(self, *, view):
        self.view = view
        self.spans = {}  # rank -> spans, in arrival order
        self.dropped = {}  # rank -> spans its ring lost before they could be sent
        self.clocks = {}  # rank -> (monotonic ns, wall-clock ns) read together on the rank
        self.batches = 0

    def add(self, rank, spans, dropped, clock):
        """One batch from *rank*."""
        self.batches += 1
        self.spans.setdefault(rank, []).extend(spans)
        if dropped:
            self.dropped[rank] = self.dropped.get(rank, 0) + dropped
        self.clocks.setdefault(rank, clock)

    def finish(self, ranks=()):
        """The cell ended: build the trace, show it, and return it."""
        from ..models import frame, summarize

        for rank in ranks:
            self.spans.setdefault(rank, [])
        trace = frame(self.spans, clocks=self.clocks, dropped=self.dropped)
        summary = summarize(trace)
        show_trace(trace, summary, view=self.view)
        return trace


def show_trace(trace, summary=None, *, view):
    """Display *trace*: the timeline widget and summary table in a notebook, the summary as text elsewhere."""
    from ...widgets import trace_summary
    from ..models import summarize

    summary = summary or summarize(trace)
    if view == "widgets":
        from ...widgets.timeline import TimelineWidget
        from ...widgets.timeline_static import timeline_bundle

        views.show_at_end(lambda: TimelineWidget(trace, summary).widget, lambda: timeline_bundle(trace, summary),
                          name="timeline")
    elif view == "text":
        print(trace_summary.summary_text(summary))
