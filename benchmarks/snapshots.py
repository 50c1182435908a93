"""What keeping every rank's variables for a restart after a death costs: snapshots on and off, and the disk.

    python benchmarks/snapshots.py [--rounds 9] [--markdown benchmarks/RESULTS.md]

Snapshots are switched per arm in the same world (the rank's agent keeps or drops its ``Snapshots``), the arms
alternating for --rounds rounds:
  healthy cell   2 ranks (one per core), a namespace of a small model, its Adam optimizer and a few numbers: the
                 round trip of ``%%mpi step += 1``, blocks of 10, on / off (goal: within 3%).
  100 MB changed 4 ranks, each with 100 MB of float64: a cell that adds 1 to all of it, then an empty cell (the
                 next cell waits for the snapshot): on − off, against each rank writing 100 MB to a file in the
                 same folder at the same time (goal: no more).
  restore        reading a rank's snapshot of those 100 MB back (``snapshots.restore``), against reading the
                 100 MB file, timed on each rank, the slowest (goal: no more).
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
def restore_back():
    from mpinb.rank import snapshots
    kept = snapshots.current()
    kept.wait()
    cell = kept.last[0]
    comm.Barrier()
    tic = time.perf_counter()
    snapshots.restore(os.path.dirname(kept.root), cell, rank, {})
    return time.perf_counter() - tic
"""
# the rank's agent keeps its Snapshots, or drops them (put aside on the module, not in the namespace kept)
SWITCH = ("(lambda agent, kept: (setattr(kept, 'aside', getattr(kept, 'aside', None) or agent.snapshots), "
          "setattr(agent, 'snapshots', kept.aside if {on} else None)))("
          "__import__('mpinb.rank.agent', fromlist=['Agent'])._agent, "
          "__import__('mpinb.rank.snapshots', fromlist=['Snapshots']))\npass")


def arm(ip, on):
    ip.run_cell_magic("mpi", "", SWITCH.format(on=on))


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


def slowest(values):
    return max(values.values() if isinstance(values, dict) else values)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--markdown", help="replace the snapshots section of this file with the table")
    args = parser.parse_args()
    logging.getLogger("ipyparallel").setLevel(logging.ERROR)
    load = OtherLoad()
    ip = shell()
    magics = ip.magics_manager.registry["MPIMagics"]
    magics.threads_per_rank = 1

    ip.run_line_magic("mpi", "start -n 2")
    ip.run_cell_magic("mpi", "", SMALL)
    healthy = {"on": [], "off": [], "again": []}
    arms = [("on", True), ("off", False), ("again", False)]
    for number in range(args.rounds):
        for name, on in arms[number % 3:] + arms[:number % 3]:
            arm(ip, on)
            healthy[name].append(trips(ip, "step += 1"))
    ip.run_line_magic("mpi", "stop")

    ip.run_line_magic("mpi", "start -n 4")
    ip.run_cell_magic("mpi", "", BIG)
    big = {"on": [], "off": [], "write": [], "restore": [], "read": []}
    for number in range(args.rounds):
        for name, on in ([("on", True), ("off", False)] if number % 2 else [("off", False), ("on", True)]):
            arm(ip, on)
            big[name].append(changed(ip))
        arm(ip, True)
        big["write"].append(slowest(ip.run_cell_magic("mpi", "", "write_plain()")))
        big["restore"].append(slowest(ip.run_cell_magic("mpi", "", "restore_back()")))
        big["read"].append(slowest(ip.run_cell_magic("mpi", "", "read_plain()")))
    ip.run_line_magic("mpi", "stop")

    def median(key, runs):
        return statistics.median(runs[key])

    ratio = statistics.median(a / b for a, b in zip(healthy["on"], healthy["off"]))
    noise = statistics.median(a / b for a, b in zip(healthy["again"], healthy["off"]))
    cost = statistics.median(max(0.0, a - b) for a, b in zip(big["on"], big["off"]))
    write, restore, read = median("write", big), median("restore", big), median("read", big)
    rows = [MARK, f"Keeping every rank's variables for a restart after a death: snapshots on and off in the same "
            f"world, arms alternating, medians over {args.rounds} rounds (`python benchmarks/snapshots.py --rounds "
            f"{args.rounds}`, {datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores; {load.summary()}):",
            "", "| case | anchor | mpinb | anchor time | mpinb / anchor |", "|---|---|---|---|---|",
            f"| healthy cell round trip, N=2, a small model and its optimizer kept | snapshots off | "
            f"{median('on', healthy) * 1e3:.2f} ms | {median('off', healthy) * 1e3:.2f} ms | {ratio:.3f} "
            f"(goal ≤ 1.03; off again / off: {noise:.3f}) |",
            f"| a cell changing 100 MB on each of 4 ranks, then the next cell: on − off | each rank writing 100 MB "
            f"to a file in the same folder, together | {cost * 1e3:.0f} ms | {write * 1e3:.0f} ms | "
            f"{cost / write:.2f} (goal ≤ 1) |",
            f"| restoring 100 MB per rank, 4 ranks, the slowest | reading the 100 MB file | {restore * 1e3:.0f} ms | "
            f"{read * 1e3:.0f} ms | {restore / read:.2f} (goal ≤ 1) |", MARK]
    publish("\n".join(rows), args.markdown, MARK)


if __name__ == "__main__":
    main()
