"""What keeping a world after a failure costs the cells that do not fail: its machinery on and off, in one world.

    python benchmarks/healthy.py [--rounds 12] [--markdown benchmarks/RESULTS.md]

Keeping a world (``recover.py``, ``rank/settle.py``) adds to healthy cells only what lets a stuck rank be let out
later: each blocking point-to-point call notes its arguments, and each rank's roll-call thread looks for
requests every 50 ms instead of 100 ms. Both are switched per arm, in the same 2-rank world (one rank per core
here: more ranks than cores measure the scheduler), the arms alternating for --rounds rounds:
  on    as every world runs now;
  off   no note of point-to-point calls, the roll call every 100 ms: as before worlds were kept;
  off'  the same as off again: what "no difference" reads (the noise row).
Cases:
  trivial cell   ``%%mpi pass``, round trip, blocks of 10;
  training step  10 float32 matmuls of 200 x 200 (one thread per rank), each followed by a ``comm.Allreduce``
                 of 64 KB, and a ``comm.sendrecv`` to the next rank, per step, a block of 20 steps timed on rank 0;
  16 MB Allreduce  ``comm.Allreduce`` of 4 M float32, median of 5, timed on rank 0.
The ratio is the median over rounds of each round's on / off (goal: within 3%).
"""

import argparse
import datetime
import logging
import os
import platform
import statistics
import time

from results import publish, shell

MARK = "<!-- healthy cells -->"
SETUP = """
import time, numpy as np
a = np.random.rand(200, 200).astype(np.float32)
grad, out = np.ones(16384, dtype=np.float32), np.empty(16384, dtype=np.float32)
big, total = np.ones(1 << 22, dtype=np.float32), np.empty(1 << 22, dtype=np.float32)
def block(n=20):
    comm.Barrier()
    tic = time.perf_counter()
    for _ in range(n):
        for _ in range(10):
            a @ a
            comm.Allreduce(grad, out)
        comm.sendrecv(rank, dest=(rank + 1) % size, source=(rank - 1) % size)
    return (time.perf_counter() - tic) / n
def reduce_big():
    times = []
    for _ in range(5):
        comm.Barrier()
        tic = time.perf_counter()
        comm.Allreduce(big, total)
        times.append(time.perf_counter() - tic)
    return sorted(times)[2]
"""
SWITCH = ("__import__('mpinb.rank.tracing', fromlist=['state']).state.note_p2p = {on}\n"
          "__import__('mpinb.rank.agent', fromlist=['Agent'])._agent.rollcall.every = {every}")


def arm(ip, on):
    ip.run_cell_magic("mpi", "", SWITCH.format(on=on, every=0.05 if on else 0.1))


def measure(ip):
    trips = []
    for _ in range(10):
        tic = time.perf_counter()
        ip.run_cell_magic("mpi", "", "pass")
        trips.append(time.perf_counter() - tic)
    return {"trivial": statistics.median(trips), "step": ip.run_cell_magic("mpi", "", "block()")[0],
            "big": ip.run_cell_magic("mpi", "", "reduce_big()")[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--markdown", help="replace the healthy-cells section of this file with the table")
    args = parser.parse_args()
    logging.getLogger("ipyparallel").setLevel(logging.ERROR)
    ip = shell()
    magics = ip.magics_manager.registry["MPIMagics"]
    magics.threads_per_rank = 1
    ip.run_line_magic("mpi", "start -n 2")
    ip.run_cell_magic("mpi", "", SETUP)
    runs = {"on": [], "off": [], "again": []}
    arms = [("on", True), ("off", False), ("again", False)]
    for number in range(args.rounds):
        for name, on in arms[number % 3:] + arms[:number % 3]:
            arm(ip, on)
            runs[name].append(measure(ip))
    arm(ip, True)
    ip.run_line_magic("mpi", "stop")
    rows = [MARK, f"Healthy cells with the machinery that keeps a world after a failure on and off, in one 2-rank "
            f"world, medians over {args.rounds} rounds, arms alternating (`python benchmarks/healthy.py --rounds "
            f"{args.rounds}`, {datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores):", "",
            "| case | off (as before) | on | on / off (goal ≤ 1.03) | noise: off again / off |",
            "|---|---|---|---|---|"]
    names = {"trivial": "trivial cell round trip", "step": "training step: 10 × (matmul + Allreduce of 64 KB) + "
             "sendrecv", "big": "Allreduce of 16 MB"}
    for key, name in names.items():
        ratio = statistics.median(a[key] / b[key] for a, b in zip(runs["on"], runs["off"]))
        noise = statistics.median(a[key] / b[key] for a, b in zip(runs["again"], runs["off"]))
        off, on = (statistics.median(run[key] for run in runs[which]) for which in ("off", "on"))
        rows.append(f"| {name} | {off * 1e3:.2f} ms | {on * 1e3:.2f} ms | {ratio:.3f} | {noise:.3f} |")
    rows.append(MARK)
    publish("\n".join(rows), args.markdown, MARK)


if __name__ == "__main__":
    main()
