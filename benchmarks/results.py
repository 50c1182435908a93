"""Keep one marked section of benchmarks/RESULTS.md current: each benchmark script rewrites only its own table."""

import contextlib
import subprocess
import sys
from pathlib import Path


def shell():
    """A real IPython shell with mpinb loaded, as a user gets it from ``%load_ext mpinb``."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "mpinb")
    return ip


def publish(table, path, mark):
    """Print *table*; with a *path*, also put it (it begins and ends with the line *mark*) in place of the section
    *mark* encloses in that file, or append it when there is none yet."""
    print(table)
    if not path:
        return
    text = Path(path).read_text()
    if mark in text:
        before, _, rest = text.partition(mark)
        text = before + table + rest.partition(mark)[2]
    else:
        text = text.rstrip("\n") + "\n\n" + table + "\n"
    Path(path).write_text(text)



@contextlib.contextmanager
def one_core_busy():
    """Another process spinning on a core while the block runs, stopped by its pid at the end: the busy-machine
    rows."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


class OtherLoad:
    """CPU that processes outside this benchmark's own tree use while it runs, sampled twice a second.

    On 2 cores, another process running for a while is enough to swing a row: ranks that wait for each other in
    every collective lose most when either is preempted. ``summary()`` says how busy the rest of the machine was,
    on average and over its busiest 10 s, so a disturbed run can be told from a change in mpinb.
    """

    def __init__(self, every=0.5, window=10.0):
        import threading

        import psutil

        self.psutil, self.every, self.window = psutil, every, window
        self.me = psutil.Process()
        self.samples = []  # fraction of all cores busy with other processes, per interval
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _busy(self):
        times = self.psutil.cpu_times()
        return sum(times) - times.idle - getattr(times, "iowait", 0.0)

    def _own(self, seen):
        """CPU seconds of this process and its descendants since the last call (*seen*: pid → last total)."""
        total = 0.0
        for process in [self.me, *self.me.children(recursive=True)]:
            try:
                times = process.cpu_times()
            except self.psutil.Error:
                continue
            now = times.user + times.system
            total += now - seen.get(process.pid, now if process.pid in seen else 0.0)
            seen[process.pid] = now
        return total

    def _run(self):
        seen, cores = {}, self.psutil.cpu_count() or 1
        busy = self._busy()
        self._own(seen)  # what this tree has used so far is not the others'
        while not self.stop_event.wait(self.every):
            busy_now, own_now = self._busy(), self._own(seen)
            self.samples.append(max(0.0, (busy_now - busy) - own_now) / (self.every * cores))
            busy = busy_now

    def summary(self):
        """``"other processes kept 3% of the cores busy on average, 41% over the busiest 10 s"``."""
        self.stop_event.set()
        self.thread.join()
        if not self.samples:
            return "the load of other processes was not sampled"
        span = max(1, int(self.window / self.every))
        windows = [sum(self.samples[i:i + span]) / len(self.samples[i:i + span])
                   for i in range(0, max(1, len(self.samples) - span + 1))]
        mean = sum(self.samples) / len(self.samples)
        return (f"other processes kept {mean:.0%} of the cores busy on average, {max(windows):.0%} over the "
                f"busiest {self.window:g} s")
