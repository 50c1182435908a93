"""Every number the ranks reported in one world: the plain data behind the live charts and ``mpinb.metrics()``."""

import collections
import glob
import json
import math
import statistics
import time
from array import array

import numpy as np

from ...wire.kinds import DEFAULT_RUN
from ...wire.report_words import nonfinite_message

COLUMNS = ["run", "rank", "step", "name", "value", "time"]


class Series:
    """One metric of one rank in one run: steps, values and the rank's wall-clock times, in arrival order."""

    __slots__ = ("steps", "values", "times")

    def __init__(self):
        self.steps, self.values, self.times = array("q"), array("d"), array("d")

    def __len__(self):
        return len(self.steps)

    def arrays(self):
        """``(steps, values)`` as numpy arrays (copies: the series keeps growing while they are drawn)."""
        return np.array(self.steps, dtype=np.int64), np.array(self.values, dtype=np.float64)


class Progress:
    """How far one rank got in one run, and how fast: samples of (rank time, step, seconds in communication so
    far) taken per batch."""

    __slots__ = ("step", "time", "values", "samples", "arrived", "comm")

    def __init__(self):
        self.step = self.time = self.arrived = self.comm = None
        self.values = {}
        self.samples = collections.deque()


class History:
    """Metrics of every rank, by run, rank and name; nothing is ever dropped or decimated here.

    A run is what ``report(run=...)`` names (``"main"`` by default), cut where a cell starts it over: when a
    later cell reports into a run at a step at or before the last step the run reached, that cell's reports are a
    new run, ``"main #2"`` (a re-run of the training cell, or another cell counting from 0 again), with its own
    curves, steps/s and waits. A cell that goes on counting steps continues the run.

    Parameters
    ----------
    window : float, default 5.0
        Seconds of each rank's recent progress that its steps/s is measured over.
    straggler_ratio : float, default 0.8
        A rank whose steps/s is below this fraction of the median rank's is a straggler.
    min_span : float, default 0.5
        Seconds of progress a rank needs before its steps/s means something (shorter bursts show none).
    """

    def __init__(self, *, window=5.0, straggler_ratio=0.8, min_span=0.5):
        self.window, self.straggler_ratio, self.min_span = window, straggler_ratio, min_span
        self.series = {}  # (run, rank, name) -> Series
        self.progress = {}  # (run, rank) -> Progress
        self.names = {}  # run -> metric names in the order they first appeared
        self.alerts = []  # (run, rank, note, message), in the order they were found
        self._nonfinite = set()  # (run, rank, name) already alerted
        self.cell = 0  # how many cells began (begin_cell): the one reporting now
        self._current = {}  # reported run name -> the run its reports go to now
        self._opened_in = {}  # run -> the cell that last reported into it
        self._last_step = {}  # run -> the highest step any rank reported into it

    def begin_cell(self):
        """A cell starts: a run it reports into at a step the run already passed starts over (counted here, not
        by the shell's execution count, which front ends that keep no history do not advance)."""
        self.cell += 1

    def current_run(self, name):
        """The run ``report(run=name)`` goes to now (``name``, or ``"name #2"`` after a re-run)."""
        return self._current.get(name, name)

    def _run_for(self, name, step):
        """The run a report of run *name* at *step* belongs to (see the class's docstring)."""
        run = self._current.get(name)
        if run is None:
            run = self._current[name] = name
        elif self._opened_in.get(run) != self.cell and step <= self._last_step.get(run, step - 1):
            number = sum(1 for key in self.names if key == name or key.startswith(f"{name} #")) + 1
            run = self._current[name] = f"{name} #{number}"
        self._opened_in[run] = self.cell
        if step > self._last_step.get(run, step - 1):
            self._last_step[run] = step
        return run

    def add(self, rank, records, *, arrived=None):
        """Append a batch ``[(run, step, time, {name: value}), ...]`` from *rank*; return the new alerts."""
        arrived = time.monotonic() if arrived is None else arrived
        new_alerts = []
        touched = {}
        for reported, step, when, values, *comm in records:
            run = self._run_for(reported, step)
            progress = touched.get(run)
            if progress is None:
                progress = touched[run] = self._progress(run, rank)
                progress.samples.append((when, step, comm[0] if comm else None))
            for name, value in values.items():
                key = (run, rank, name)
                series = self.series.get(key)
                if series is None:
                    series = self.series[key] = Series()
                    if name not in self.names.setdefault(run, []):
                        self.names[run].append(name)
                series.steps.append(step)
                series.values.append(value)
                series.times.append(when)
                if not math.isfinite(value) and key not in self._nonfinite:
                    self._nonfinite.add(key)
                    note = nonfinite_message(name, value, step)
                    message = f"rank {rank}: {note}" + (f" (run {run})" if run != DEFAULT_RUN else "")
                    self.alerts.append((run, rank, note, message))
                    new_alerts.append(message)
            progress.values.update(values)
            progress.step, progress.time = step, when
            progress.comm = comm[0] if comm else None
        for progress in touched.values():
            progress.arrived = arrived
            progress.samples.append((progress.time, progress.step, progress.comm))
            while len(progress.samples) > 2 and progress.samples[1][0] < progress.time - self.window:
                progress.samples.popleft()
        return new_alerts

    def _progress(self, run, rank):
        progress = self.progress.get((run, rank))
        if progress is None:
            progress = self.progress[(run, rank)] = Progress()
            self.names.setdefault(run, [])
        return progress

    def __len__(self):
        """How many values are held (one per rank, step and name)."""
        return sum(len(series) for series in self.series.values())

    def runs(self):
        return list(self.names)

    def ranks(self, run):
        return sorted(rank for r, rank in self.progress if r == run)

    def rates(self, run):
        """Steps per second of each rank of *run* over its last ``window`` seconds (``None`` until measurable)."""
        rates = {}
        for rank in self.ranks(run):
            samples = self.progress[(run, rank)].samples
            (t0, s0, _), (t1, s1, _) = samples[0], samples[-1]
            rates[rank] = (s1 - s0) / (t1 - t0) if t1 - t0 >= self.min_span else None
        return rates

    def waits(self, run):
        """Seconds per step each rank of *run* spent in communication (collectives, waits, point-to-point) over
        its last ``window`` seconds: ``None`` until measurable, or when the rank does not say (no mpi4py)."""
        waits = {}
        for rank in self.ranks(run):
            samples = self.progress[(run, rank)].samples
            (t0, s0, c0), (t1, s1, c1) = samples[0], samples[-1]
            measurable = c0 is not None and c1 is not None and s1 > s0 and t1 - t0 >= self.min_span
            waits[rank] = (c1 - c0) / (s1 - s0) if measurable else None
        return waits

    def held_up_by(self, run, *, least=0.001):
        """``{rank: seconds per step the other ranks wait}`` for the rank of *run* the others wait for: when
        the others spend at least *least* s per step in communication and it less than half of that (in
        synchronised training every rank runs at the same steps/s, so only the waits show who is slow)."""
        waits = {rank: wait for rank, wait in self.waits(run).items() if wait is not None}
        if len(waits) < 2:
            return {}
        slowest = min(waits, key=waits.get)
        others = statistics.median(wait for rank, wait in waits.items() if rank != slowest)
        if others >= least and waits[slowest] < 0.5 * others:
            return {slowest: others - waits[slowest]}
        return {}

    def stragglers(self, run):
        """``{rank: rate / median rate}`` for the ranks of *run* slower than ``straggler_ratio`` × the median."""
        rates = {rank: rate for rank, rate in self.rates(run).items() if rate is not None}
        if len(rates) < 2:
            return {}
        median = statistics.median(rates.values())
        if median <= 0:
            return {}
        return {rank: rate / median for rank, rate in rates.items() if rate < self.straggler_ratio * median}

    def silent(self, run, *, now=None, after=3.0, finished=()):
        """``{rank: seconds}`` for ranks of *run* not heard from for *after* s while another rank was; a rank in
        *finished* (done with the cell) is not silent, however long ago it last reported."""
        now = time.monotonic() if now is None else now
        quiet = {rank: now - self.progress[(run, rank)].arrived for rank in self.ranks(run)}
        if not quiet or min(quiet.values()) >= after:
            return {}
        done = set(finished)
        return {rank: seconds for rank, seconds in quiet.items() if seconds >= after and rank not in done}

    def summary(self, run, *, now=None, live=False, finished=()):
        """One row per rank of *run*: ``rank, step, values, rate, notes`` (notes flag what needs a look).

        *live* adds the "no report for N s" note, which only means something while the cell runs, and never for
        the ranks in *finished*, those done with the cell.
        """
        rates, slow, waits, holder = self.rates(run), self.stragglers(run), self.waits(run), self.held_up_by(run)
        quiet = self.silent(run, now=now, finished=finished) if live else {}
        bad = {}
        for alert_run, rank, note, _ in self.alerts:
            if alert_run == run:
                bad.setdefault(rank, []).append(note)
        rows = []
        for rank in self.ranks(run):
            progress = self.progress[(run, rank)]
            notes = list(bad.get(rank, []))
            if rank in slow:
                notes.append(f"straggler: {slow[rank]:.2f}× the median steps/s")
            if rank in holder:
                notes.append(f"straggler: the other ranks wait {holder[rank] * 1e3:.1f} ms per step for it")
            if rank in quiet:
                notes.append(f"no report for {quiet[rank]:.0f} s")
            rows.append({"rank": rank, "step": progress.step, "values": dict(progress.values),
                         "rate": rates[rank], "wait": waits[rank], "notes": notes})
        return rows

    def to_frame(self, run=None):
        """Everything held (or one run's) as a pandas DataFrame with columns run, rank, step, name, value, time."""
        import pandas as pd

        keys = [key for key in self.series if run is None or key[0] == run]
        columns = {name: [] for name in COLUMNS}
        for key in keys:
            series, n = self.series[key], len(self.series[key])
            for name, item in zip(("run", "rank", "name"), key):
                columns[name].append(np.full(n, item, dtype=object if name != "rank" else np.int64))
            columns["step"].append(np.array(series.steps, dtype=np.int64))
            columns["value"].append(np.array(series.values, dtype=np.float64))
            columns["time"].append(np.array(series.times, dtype=np.float64))
        frame = pd.DataFrame({name: np.concatenate(parts) if parts else [] for name, parts in columns.items()},
                             columns=COLUMNS)
        frame["time"] = pd.to_datetime(frame["time"], unit="s")
        return frame.sort_values(["run", "rank", "step", "name"], kind="stable").reset_index(drop=True)


def read_metrics(pattern):
    """Load what ``MPINB_METRICS_FILE`` made ranks write under plain mpiexec (a glob) as ``mpinb.metrics()`` does."""
    history = History()
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise FileNotFoundError(f"no metrics files match {pattern!r}; set MPINB_METRICS_FILE=metrics-{{rank}}.jsonl "
                                "when running the script under mpiexec")
    for path in paths:
        by_rank = collections.defaultdict(list)
        with open(path) as lines:
            for line in lines:
                item = json.loads(line)
                rank, run, step, when = item.pop("rank"), item.pop("run"), item.pop("step"), item.pop("time")
                by_rank[rank].append((run, step, when, item))
        for rank, records in by_rank.items():
            history.add(rank, records)
    return history.to_frame()

