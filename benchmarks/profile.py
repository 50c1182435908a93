"""Where the time goes: a cold start's phases and its CPU by process, and a trivial cell's CPU by process.

    python benchmarks/profile.py [--start-ranks 4] [--starts 3] [--sizes 2,8,64] [--cells 300] [--markdown PATH]

Cold start (--start-ranks ranks, median of --starts): the wall-clock time of each phase of `World.start` as its
progress line announces them (checking the MPI, the controller, launching, registration, learning ranks, the
channel), then the first cell's output; and the CPU each kind of process spent by the time the world was up
(psutil): the notebook, ipyparallel's controller, mpiexec and its proxies, the ranks.
Round trip (each of --sizes): --cells trivial cells (`pass`) after 20 warm ones; per cell, the wall-clock time,
the notebook's CPU and the ranks' CPU (summed, and per rank). On C cores, a round trip cannot be shorter than
(the ranks' CPU + the notebook's) / C once the ranks outnumber the cores: that is the floor it is set against.
Both are also set against what the whole machine spent (/proc/stat, less its load in the second before): the
CPU of processes that ended before they could be counted and of the kernel's own work (interrupts, softirqs:
the loopback TCP of every message) is in that floor and not in the processes'.
"""

import argparse
import contextlib
import datetime
import io
import logging
import os
import platform
import statistics
import sys
import time

import psutil
from results import publish, shell

from mpinb.notebook.cell import dispatch
from mpinb.notebook.world.cluster import World

MARK = "<!-- where the time goes -->"


# what happens from each announcement of World.start's progress line to the next
PHASES = (
    ("starting", "the controller's process started (ipyparallel does not wait for it here)"),
    ("launching", "mpiexec launched; the client connects once the controller is up"),
    ("registered first", "every rank registers: imports, MPI_Init, connects, its first heartbeat heard"),
    ("registered all", "each engine's MPI rank learnt; the reaper watches the processes"),
    ("connecting", "the cell channel: every rank's agent connects and says hello"),
)


class Phases:
    """A World's progress line that notes when each phase began instead of drawing anything."""

    def __init__(self, log):
        self.log = log

    def update(self, text, done=None, total=None, *, force=False):
        word = text.split()[0] if done is None else f"{text.split()[-1]} {'first' if done < total else 'all'}"
        if done is None or done == 0 or done >= total:
            self.log.setdefault(word, time.perf_counter())

    def close(self):
        pass


def cpu(process):
    try:
        times = process.cpu_times()
        return times.user + times.system
    except psutil.Error:
        return 0.0


def kind(process):
    try:
        line = " ".join(process.cmdline())
    except psutil.Error:
        return None
    for needle, name in (("mpinb.notebook.world.controller", "controller"), ("ipyparallel.engine", "ranks (engines)"),
                         ("mpinb.rank.launch", "ranks' parents"), ("hydra_pmi_proxy", "mpiexec and proxies"),
                         ("mpiexec", "mpiexec and proxies"), ("mpinb.notebook.world.reaper", "reaper")):
        if needle in line:
            return name
    return "other"


def machine_busy():
    """CPU-seconds every CPU of the machine has spent busy (not idle, not waiting for I/O) since boot, from
    /proc/stat: what the processes that ended before they could be counted (``mpiexec --version``, the check of
    the ranks' Python) and the kernel's work outside any process spent, too."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def background(seconds=1.0):
    """CPU-seconds a second the machine spends without us, measured over *seconds* of doing nothing."""
    before = machine_busy()
    time.sleep(seconds)
    return (machine_busy() - before) / seconds


def one_start(size):
    log = {}
    quiet = background()
    notebook = time.process_time()
    began, busy = time.perf_counter(), machine_busy()
    world = World(size, progress=lambda: Phases(log))
    world.start()
    up = time.perf_counter()
    machine = machine_busy() - busy - quiet * (up - began)
    spent = {"notebook": time.process_time() - notebook}
    for child in psutil.Process().children(recursive=True):
        name = kind(child)
        if name:
            spent[name] = spent.get(name, 0.0) + cpu(child)
    dispatch.dispatch(world, "print('ready')", stream=False)
    first = time.perf_counter()
    world.stop()
    marks = [log[word] for word, _ in PHASES] + [up]
    phases = {"which MPI: mpiexec --version, the ranks' Python checked": marks[0] - began}
    for (_, name), at, end in zip(PHASES, marks, marks[1:]):
        phases[name] = end - at
    phases["the first cell's output"] = first - up
    return phases, spent, first - began, machine


def start_rows(size, starts):
    runs = [one_start(size) for _ in range(starts)]
    total = statistics.median(run[2] for run in runs)
    names = list(runs[0][0])
    lines = [f"Cold start to first output, {size} ranks: {total:.2f} s (median of {starts}).", "",
             "| phase | wall-clock s |", "|---|---|"]
    for name in names:
        lines.append(f"| {name} | {statistics.median(run[0].get(name, 0.0) for run in runs):.3f} |")
    kinds = sorted({k for run in runs for k in run[1]}, key=lambda k: -runs[0][1].get(k, 0.0))
    lines += ["", "| process | CPU s by the time the world is up |", "|---|---|"]
    for name in kinds:
        lines.append(f"| {name} | {statistics.median(run[1].get(name, 0.0) for run in runs):.2f} |")
    every = sum(statistics.median(run[1].get(k, 0.0) for run in runs) for k in kinds)
    cores = os.cpu_count() or 1
    lines.append(f"| all, over {cores} cores | {every:.2f} ({every / cores:.2f} s of wall-clock at best) |")
    machine = statistics.median(run[3] for run in runs)
    lines.append(f"| the whole machine while it started (/proc/stat: processes that ended before they could be "
                 f"counted and the kernel's own work included), less its load in the second before | "
                 f"{machine:.2f} ({machine / cores:.2f} s at best) |")
    return lines


def round_trip(ip, magics, size, cells):
    with contextlib.redirect_stdout(io.StringIO()):
        ip.run_line_magic("mpi", f"start -n {size}")
    for _ in range(20):
        ip.run_cell_magic("mpi", "", "pass")
    pids = {who["pid"] for who in magics.world.identities.values()}
    ranks = [process for process in psutil.Process().children(recursive=True) if process.pid in pids]
    quiet = background()
    before = sum(cpu(process) for process in ranks)
    notebook, began, busy = time.process_time(), time.perf_counter(), machine_busy()
    for _ in range(cells):
        ip.run_cell_magic("mpi", "", "pass")
    wall = (time.perf_counter() - began) / cells
    machine = (machine_busy() - busy) / cells - quiet * wall
    notebook = (time.process_time() - notebook) / cells
    on_ranks = (sum(cpu(process) for process in ranks) - before) / cells
    links = chain(magics.world, cells)
    with contextlib.redirect_stdout(io.StringIO()):
        ip.run_line_magic("mpi", "stop")
    return wall, notebook, on_ranks, machine, links


def chain(world, cells):
    """Medians over *cells* cells that return ``time.monotonic()`` on each rank (one clock on one machine): from
    the notebook's call until the first rank runs the cell, from the first rank to the last, and from the last
    until the notebook has every result."""
    links = []
    for _ in range(cells):
        began = time.monotonic()
        result = dispatch.dispatch(world, "__import__('time').monotonic()", stream=False)
        ended = time.monotonic()
        runs = sorted(float(value) for value in result.values.values())
        links.append((runs[0] - began, runs[-1] - runs[0], ended - runs[-1]))
    return [statistics.median(link[i] for link in links) for i in range(3)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start-ranks", type=int, default=4)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--sizes", default="2,8,64")
    parser.add_argument("--cells", type=int, default=300)
    parser.add_argument("--markdown", help="also put the tables in this file (their own section)")
    args = parser.parse_args()
    logging.getLogger("ipyparallel").setLevel(logging.ERROR)
    lines = start_rows(args.start_ranks, args.starts)
    ip = shell()
    magics = ip.magics_manager.registry["MPIMagics"]
    magics.start_timeout = 600.0
    cores = os.cpu_count() or 1
    lines += ["", "| N | round trip | notebook CPU per cell | ranks' CPU per cell (per rank) | "
              "(ranks + notebook) / cores | the whole machine's CPU per cell (/proc/stat, less its load in the "
              "second before) / cores |", "|---|---|---|---|---|---|"]
    chains = []
    for size in (int(s) for s in args.sizes.split(",")):
        wall, notebook, on_ranks, machine, links = round_trip(ip, magics, size, args.cells)
        floor = (notebook + on_ranks) / cores
        lines.append(f"| {size} | {wall * 1e3:.2f} ms | {notebook * 1e3:.2f} ms | {on_ranks * 1e3:.2f} ms "
                     f"({on_ranks / size * 1e6:.0f} µs) | {floor * 1e3:.2f} ms | {machine / cores * 1e3:.2f} ms |")
        print(lines[-1], file=sys.stderr)
        chains.append(f"| {size} | " + " | ".join(f"{link * 1e3:.2f} ms" for link in links) + " |")
    lines += ["", "One cell's chain (`dispatch` of a cell returning `time.monotonic()` on each rank, medians): what "
              "happens before the first rank runs and after the last one has run cannot overlap the ranks' work.",
              "", "| N | notebook's call → first rank runs the cell | first → last rank | last rank → every result "
              "in the notebook |", "|---|---|---|---|", *chains]
    header = (f"{MARK}\n## Where the time goes\n\n`python benchmarks/profile.py --start-ranks {args.start_ranks} "
              f"--starts {args.starts} --sizes {args.sizes} --cells {args.cells}`, {datetime.date.today()}, "
              f"{platform.node()}, {cores} cores.\n\n")
    publish(header + "\n".join(lines) + f"\n{MARK}", args.markdown, MARK)


if __name__ == "__main__":
    main()
