"""Healthy cells, this checkout against another one (a git worktree of an earlier commit), side by side.

    python benchmarks/healthy.py --baseline DIR [--rounds 3] [--label TEXT] [--markdown benchmarks/RESULTS.md]

What keeping a world after a failure (and debugging on the ranks) may cost the cells that do not fail: each
round starts a 2-rank world (one per core here: more ranks than cores measure the scheduler) with this
checkout's mpinb and twice with the baseline's (``PYTHONPATH``), in rotating order, and times in it
  trivial cell   ``%%mpi pass``, round trip, median of 30;
  training step  10 float32 matmuls of 200 x 200 (one thread per rank), each followed by a ``comm.Allreduce`` of 64 KB,
                 per step, median of 7 blocks of 20 steps, timed on rank 0;
  16 MB Allreduce  ``comm.Allreduce`` of 4 M float32, median of 30, timed on rank 0.
The ratio is the median over rounds of this checkout's time over the baseline's (goal: within 3%); the noise
row is the baseline's second run over its first: what "no difference" reads.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from results import publish

MARK = "<!-- healthy cells -->"
STEP = """
import time, numpy as np
a = np.random.rand(200, 200).astype(np.float32)
grad = np.ones(16384, dtype=np.float32)
out = np.empty_like(grad)
def step():
    for _ in range(10):
        a @ a
        comm.Allreduce(grad, out)
def block(n=20):
    comm.Barrier()
    tic = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - tic) / n
sorted(block() for _ in range(7))[3]
"""
BIG = """
big, total = np.ones(1 << 22, dtype=np.float32), np.empty(1 << 22, dtype=np.float32)
def reduce_big():
    comm.Barrier()
    tic = time.perf_counter()
    comm.Allreduce(big, total)
    return time.perf_counter() - tic
sorted(reduce_big() for _ in range(30))[15]
"""


def worker():
    """Run in a fresh process with the checkout to measure first on ``PYTHONPATH``; print one JSON line."""
    import logging

    from IPython.core.interactiveshell import InteractiveShell

    logging.getLogger("ipyparallel").setLevel(logging.ERROR)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "mpinb")
    magics = ip.magics_manager.registry["MPIMagics"]
    magics.threads_per_rank = 1
    ip.run_line_magic("mpi", "start -n 2")
    trips = []
    for _ in range(30):
        tic = time.perf_counter()
        ip.run_cell_magic("mpi", "", "pass")
        trips.append(time.perf_counter() - tic)
    step = ip.run_cell_magic("mpi", "", STEP)[0]
    big = ip.run_cell_magic("mpi", "", BIG)[0]
    ip.run_line_magic("mpi", "stop")
    print("RESULT " + json.dumps({"trivial": statistics.median(trips), "step": step, "big": big}), flush=True)


def measure(checkout):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout))
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker"], env=env, cwd=checkout,
                          capture_output=True, text=True, timeout=600)
    line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"the worker for {checkout} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads(line[7:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a checkout (git worktree) of the commit to compare with")
    parser.add_argument("--label", default="", help="what the baseline is, for the table")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", help="replace the healthy-cells section of this file with the table")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker()
    if not args.baseline:
        parser.error("--baseline DIR is required (e.g. git worktree add /tmp/base <commit>)")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs = {"this": [], "baseline": [], "again": []}
    for number in range(args.rounds):
        order = [("this", here), ("baseline", args.baseline), ("again", args.baseline)]
        for name, checkout in order[number % 3:] + order[:number % 3]:
            runs[name].append(measure(checkout))
            print(f"round {number + 1} {name}: {runs[name][-1]}", file=sys.stderr)
    rows = [MARK, f"Healthy cells, this checkout against {args.label or args.baseline}, N=2, medians over "
            f"{args.rounds} alternating rounds (`python benchmarks/healthy.py --baseline DIR --rounds {args.rounds}`, "
            f"{datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores):", "",
            "| case | baseline | this checkout | ratio (goal ≤ 1.03) | noise: baseline again / baseline |",
            "|---|---|---|---|---|"]
    names = {"trivial": "trivial cell round trip", "step": "training step: matmuls + 10 Allreduce of 64 KB",
             "big": "Allreduce of 16 MB"}
    for key, name in names.items():
        ratio = statistics.median(a[key] / b[key] for a, b in zip(runs["this"], runs["baseline"]))
        base = statistics.median(run[key] for run in runs["baseline"])
        this = statistics.median(run[key] for run in runs["this"])
        noise = statistics.median(a[key] / b[key] for a, b in zip(runs["again"], runs["baseline"]))
        rows.append(f"| {name} | {base * 1e3:.2f} ms | {this * 1e3:.2f} ms | {ratio:.3f} | {noise:.3f} |")
    rows.append(MARK)
    publish("\n".join(rows), args.markdown, MARK)


if __name__ == "__main__":
    main()
