"""What keeping every rank's variables for a restart after a death costs: snapshots on and off, and the disk.

    python benchmarks/snapshots.py [--rounds 5] [--markdown benchmarks/RESULTS.md]

A rank snapshots its variables once idle for 0.2 s after a cell; a cell that comes sooner cancels it unless the
last snapshot is older than ``snapshot_lag`` (10 s), then it waits for it. Snapshots are switched per arm in
the same world (the rank's agent keeps or drops its ``Snapshots``), arms alternating for --rounds rounds:
  healthy cell   2 ranks (one per core), a namespace of a small model, its Adam optimizer and a few numbers: the
                 round trip of ``%%mpi step += 1``, blocks of 10, on / off (goal: within 3%); and the same with
                 ``snapshot_lag = 0`` (every cell waits for the snapshot of the one before: the worst case).
  100 MB changed 4 ranks, each with 100 MB of float64 that a cell adds 1 to: the snapshot's own time, in the
                 background (the rank idle), the slowest rank, against each rank writing 100 MB to a new file in the same folder at the
                 same time (goal: no more); each after ``os.sync()``, so that neither pays for the other's
                 write-back; and with ``snapshot_lag = 0``, what the next cell waits (on − off).
  restore        reading a rank's snapshot of those 100 MB back (``snapshots.restore``), against reading the
                 100 MB file, timed on each rank, the slowest (goal: no more).
  death          2 and 8 ranks, each with the small model, its optimizer and 10 MB of float64: from sending a cell
                 whose last rank segfaults to the world running again with every rank's variables back, in its
                 parts: the death reported (the cell's error), the dead world stopped, the new one started, numpy
                 and torch imported (which unpickling the variables would do first), the variables restored (the
                 steps of ``%mpi restart``, timed one by one), medians over --rounds deaths.
"""

import argparse
import datetime
import logging
import os
import platform
import statistics
import time

from results import OtherLoad, publish, shell

MARK = "<!-- snapshots -->"
SMALL = """
import numpy as np, torch
torch.manual_seed(rank)
model = torch.nn.Linear(64, 64)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
model(torch.randn(8, 64)).sum().backward()
opt.step()
step, lr, losses = 0, 1e-3, [0.5, 0.4]
"""
BIG = """
import os, time, numpy as np
data = np.zeros(100 * 2**20 // 8)
def write_plain():
    from mpinb.rank import snapshots
    path = os.path.join(snapshots.current().root, 'plain.bin')
    if os.path.exists(path):
        os.unlink(path)  # a new file, as a snapshot's buffers are
    comm.Barrier()
    tic = time.perf_counter()
    with open(path, 'wb') as file:
        file.write(memoryview(data).cast('B'))
    seconds = time.perf_counter() - tic
    comm.Barrier()
    return seconds
def read_plain():
    from mpinb.rank import snapshots
    path = os.path.join(snapshots.current().root, 'plain.bin')
    comm.Barrier()
    tic = time.perf_counter()
    with open(path, 'rb') as file:
        buffer = bytearray(os.fstat(file.fileno()).st_size)
        file.readinto(buffer)
    return time.perf_counter() - tic
def last_snapshot():
    from mpinb.rank import snapshots
    kept = snapshots.current()
    return kept.last, kept.phases
def restore_back():
    from mpinb.rank import snapshots
    kept = snapshots.current()
    cell = kept.last[0]
    comm.Barrier()
    tic = time.perf_counter()
    snapshots.restore(os.path.dirname(kept.root), cell, rank, {})
    return time.perf_counter() - tic
"""
# the rank's agent keeps its Snapshots, or drops them (put aside on the module, not in the namespace kept)
SWITCH = ("(lambda agent, kept: (setattr(kept, 'aside', getattr(kept, 'aside', None) or agent.snapshots), "
          "setattr(agent, 'snapshots', kept.aside if {on} else None), setattr(kept.aside, 'lag', {lag})))("
          "__import__('mpinb.rank.agent', fromlist=['Agent'])._agent, "
          "__import__('mpinb.rank.snapshots', fromlist=['Snapshots']))\npass")


def arm(ip, on, lag=10.0):
    ip.run_cell_magic("mpi", "", SWITCH.format(on=on, lag=lag))


def trips(ip, code, n=10):
    times = []
    for _ in range(n):
        tic = time.perf_counter()
        ip.run_cell_magic("mpi", "", code)
        times.append(time.perf_counter() - tic)
    return statistics.median(times)


def changed(ip):
    tic = time.perf_counter()
    ip.run_cell_magic("mpi", "", "data += 1.0")
    ip.run_cell_magic("mpi", "", "pass")
    return time.perf_counter() - tic


CRASH = "import ctypes\nif rank == size - 1:\n    ctypes.string_at(0)\ncomm.Barrier()"


def death(ip, magics, size, rounds):
    """``{part: [seconds, ...]}`` of *rounds* deaths and restores of a world of *size* ranks (see the docstring)."""
    from mpinb.notebook.world import kept_state

    parts = {"reported": [], "stopped": [], "started": [], "imported": [], "restored": []}
    ip.run_line_magic("mpi", f"start -n {size}")
    ip.run_cell_magic("mpi", "", SMALL + "data = np.zeros(10 * 2**20 // 8) + rank")
    for _ in range(rounds):
        ip.run_cell_magic("mpi", "", "from mpinb.rank import snapshots\nsnapshots.flush()")  # the state is kept
        world = magics.world
        tic = time.perf_counter()
        try:
            ip.run_cell_magic("mpi", "", CRASH)
        except Exception:  # noqa: BLE001 - the RankError that reports the death
            pass
        reported = time.perf_counter()
        world.stop()
        stopped = time.perf_counter()
        world.start()
        started = time.perf_counter()
        # what unpickling the variables imports first, timed apart: most of a restore of small values
        ip.run_cell_magic("mpi", "", "import numpy, torch")
        imported = time.perf_counter()
        lines = kept_state.restore(world, magics.commands.on_every_rank)
        restored = time.perf_counter()
        assert any("restored every rank's variables" in line for line in lines), lines
        for part, (begin, end) in {"reported": (tic, reported), "stopped": (reported, stopped),
                                   "started": (stopped, started), "imported": (started, imported),
                                   "restored": (imported, restored)}.items():
            parts[part].append(end - begin)
    ip.run_line_magic("mpi", "stop")
    return parts


def slowest(values):
    return max(values.values() if isinstance(values, dict) else values)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--markdown", help="replace the snapshots section of this file with the table")
    args = parser.parse_args()
    logging.getLogger("ipyparallel").setLevel(logging.ERROR)
    load = OtherLoad()
    ip = shell()
    magics = ip.magics_manager.registry["MPIMagics"]
    magics.threads_per_rank = 1

    ip.run_line_magic("mpi", "start -n 2")
    ip.run_cell_magic("mpi", "", SMALL)
    healthy = {"on": [], "off": [], "again": [], "lag 0": []}
    arms = [("on", True, 10.0), ("off", False, 10.0), ("again", False, 10.0), ("lag 0", True, 0.0)]
    for number in range(args.rounds):
        for name, on, lag in arms[number % 4:] + arms[:number % 4]:
            arm(ip, on, lag)
            healthy[name].append(trips(ip, "step += 1"))
    ip.run_line_magic("mpi", "stop")

    ip.run_line_magic("mpi", "start -n 4")
    ip.run_cell_magic("mpi", "", BIG)
    big = {"on": [], "off": [], "background": [], "write": [], "restore": [], "read": []}
    for number in range(args.rounds):
        for name, on in ([("on", True), ("off", False)] if number % 2 else [("off", False), ("on", True)]):
            arm(ip, on, 0.0)
            ip.run_cell_magic("mpi", "", "pass")  # the switch's own snapshot is taken before the timing
            big[name].append(changed(ip))
        arm(ip, True)
        # the disk's write-back of earlier rounds throttles whatever writes next: each write here starts clean
        ip.run_cell_magic("mpi", "", "os.sync() if rank == 0 else None\ncomm.Barrier()")
        ip.run_cell_magic("mpi", "", "data += 1.0")
        time.sleep(3)  # idle: the snapshot is taken meanwhile
        taken = ip.run_cell_magic("mpi", "", "last_snapshot()")
        big["background"].append(slowest([value[0][4] for value in taken.values()]))
        print("snapshot phases, per rank (ms):", {rank: {k: round(v * 1e3) for k, v in value[1].items()}
                                                  for rank, value in taken.items()})
        ip.run_cell_magic("mpi", "", "os.sync() if rank == 0 else None\ncomm.Barrier()")
        big["write"].append(slowest(ip.run_cell_magic("mpi", "", "write_plain()")))
        for key in (("restore", "read") if number % 2 else ("read", "restore")):
            call = "restore_back()" if key == "restore" else "read_plain()"
            big[key].append(slowest(ip.run_cell_magic("mpi", "", call)))
    ip.run_line_magic("mpi", "stop")

    deaths = {size: death(ip, magics, size, args.rounds) for size in (2, 8)}

    def median(key, runs):
        return statistics.median(runs[key])

    ratio = statistics.median(a / b for a, b in zip(healthy["on"], healthy["off"]))
    noise = statistics.median(a / b for a, b in zip(healthy["again"], healthy["off"]))
    worst = statistics.median(a / b for a, b in zip(healthy["lag 0"], healthy["off"]))
    waited = statistics.median(max(0.0, a - b) for a, b in zip(big["on"], big["off"]))
    background, write = median("background", big), median("write", big)
    restore, read = median("restore", big), median("read", big)
    rows = [MARK, f"Keeping every rank's variables for a restart after a death: snapshots on and off in the same "
            f"world, arms alternating, medians over {args.rounds} rounds (`python benchmarks/snapshots.py --rounds "
            f"{args.rounds}`, {datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores; {load.summary()}):",
            "", "| case | anchor | mpinb | anchor time | mpinb / anchor |", "|---|---|---|---|---|",
            f"| healthy cell round trip, N=2, a small model and its optimizer kept | snapshots off | "
            f"{median('on', healthy) * 1e3:.2f} ms | {median('off', healthy) * 1e3:.2f} ms | {ratio:.3f} "
            f"(goal ≤ 1.03; off again / off: {noise:.3f}) |",
            f"| the same, snapshot_lag = 0: every cell waits for the snapshot of the one before | snapshots off | "
            f"{median('lag 0', healthy) * 1e3:.2f} ms | {median('off', healthy) * 1e3:.2f} ms | {worst:.3f} |",
            f"| snapshot of 100 MB changed on each of 4 ranks, taken in the background, the slowest rank | each "
            f"rank writing 100 MB to a new file in the same folder, together | {background * 1e3:.0f} ms | "
            f"{write * 1e3:.0f} ms | {background / write:.2f} (goal ≤ 1) |",
            f"| the same, snapshot_lag = 0: what the next cell waits (on − off) | the same write | "
            f"{waited * 1e3:.0f} ms | {write * 1e3:.0f} ms | {waited / write:.2f} |",
            f"| restoring 100 MB per rank, 4 ranks, the slowest | reading the 100 MB file | {restore * 1e3:.0f} ms | "
            f"{read * 1e3:.0f} ms | {restore / read:.2f} (goal ≤ 1) |", ""]
    rows += ["From a rank's death to the world running again with every rank's variables (each rank: the small "
             "model, its optimizer and 10 MB of float64), medians:", "",
             "| ranks | death reported | dead world stopped | new world started | numpy and torch imported | "
             "variables restored | in all |", "|---|---|---|---|---|---|---|"]
    for size, parts in deaths.items():
        medians = {part: statistics.median(values) for part, values in parts.items()}
        total = statistics.median(sum(values) for values in zip(*parts.values()))
        rows.append(f"| {size} | " + " | ".join(f"{medians[part]:.2f} s" for part in parts) + f" | {total:.2f} s |")
    rows.append(MARK)
    publish("\n".join(rows), args.markdown, MARK)


if __name__ == "__main__":
    main()
