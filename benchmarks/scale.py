"""Worlds larger than the machine: 8 to 64 idle ranks on this host's cores (oversubscribed), each size one world.

    python benchmarks/scale.py [--sizes 8,16,32,64] [--reps 15] [--markdown PATH]

Per size, against a limit or anchor measured in the same run:
  start        `%%mpi -n N print('ready')` from no world to every rank's output, once, against
               `mpiexec -n N python -c "from mpi4py import MPI"` (ranks that start MPI and do nothing else).
  round trip   a trivial cell (`pass`) on every rank against ipyparallel's `%%px --block pass` on the same world,
               interleaved, medians of --reps.
  gather       `%%mpi --gather x --no-inspect` of 1 MB of float32 per rank against one in-process memcpy of the
               N MB, interleaved, medians of --reps.
  metrics      each rank calls `mpinb.report(step, loss=...)` 100 times in one cell, against the same loop
               without report; every one of the N x 100 values is checked to be in `mpinb.metrics()` when the
               cell returns.
The last line is the growth of the round trip from the smallest size to the largest (target: under 3x from 8 to 64).
"""

import argparse
import contextlib
import datetime
import io
import logging
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
from results import publish, shell

from mpinb.notebook.world.mpis import default_mpiexec

MARK = "<!-- scale -->"
FLOATS = 1 << 18  # 1 MB of float32 per rank
REPORTS = 100
REPORTING = f"for s in range({REPORTS}):\n    mpinb.report(s, run='scale', loss=1.0 / (s + 1) + rank)"
SILENT = f"for s in range({REPORTS}):\n    1.0 / (s + 1) + rank"


def clock(fn):
    tic = time.perf_counter()
    fn()
    return time.perf_counter() - tic


def interleaved(arms, reps):
    """``{name: median seconds}`` of the arms called in turn, order rotated each round, after one warm round."""
    names = list(arms)
    for arm in arms.values():
        arm()
    times = {name: [] for name in names}
    for round_ in range(reps):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            times[name].append(clock(arms[name]))
    return {name: (statistics.median(t), half_iqr(t)) for name, t in times.items()}


def half_iqr(values):
    quartiles = statistics.quantiles(values, n=4)
    return (quartiles[2] - quartiles[0]) / 2


def bare_mpiexec(size):
    command = [default_mpiexec(), "-n", str(size), sys.executable, "-c", "from mpi4py import MPI"]
    return clock(lambda: subprocess.run(command, check=True, stdout=subprocess.DEVNULL))


def one_size(ip, magics, size, reps):
    row = {"anchor start": bare_mpiexec(size)}
    with contextlib.redirect_stdout(io.StringIO()):
        row["start"] = clock(lambda: ip.run_cell_magic("mpi", f"-n {size}", "print('ready')"))
        view = magics.world.client[:]
        view.block = True
        view.activate()
        ip.run_cell_magic("mpi", "", f"import numpy as np, mpinb\nx = np.full({FLOATS}, rank, dtype=np.float32)")
        source = np.ones(size * FLOATS, dtype=np.float32)
        target = np.zeros_like(source)
        row.update(interleaved({
            "round trip": lambda: ip.run_cell_magic("mpi", "", "pass"),
            "px": lambda: ip.run_cell_magic("px", "", "pass"),
            "gather": lambda: ip.run_cell_magic("mpi", "--gather x --no-inspect", "pass"),
            "memcpy": lambda: np.copyto(target, source),
        }, reps))
        assert all((ip.user_ns["x"][r] == r).all() for r in range(size))
        arms = {"metrics": lambda: ip.run_cell_magic("mpi", "", REPORTING),
                "silent": lambda: ip.run_cell_magic("mpi", "", SILENT)}
        row.update(interleaved(arms, max(3, reps // 3)))
        frame = ip.run_cell("import mpinb; mpinb.metrics('scale')").result
        counts = frame.groupby("rank").size()
        assert len(counts) == size and (counts % REPORTS == 0).all() and counts.min() > 0, counts
        ip.run_line_magic("mpi", "stop")
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8,16,32,64", help="world sizes (default 8,16,32,64)")
    parser.add_argument("--reps", type=int, default=15, help="interleaved repetitions per arm (default 15)")
    parser.add_argument("--markdown", help="also put the table in this file (its own section)")
    args = parser.parse_args()
    logging.getLogger("ipyparallel").setLevel(logging.ERROR)
    ip = shell()
    magics = ip.magics_manager.registry["MPIMagics"]
    magics.start_timeout = 600.0
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = {}
    for size in sizes:
        rows[size] = one_size(ip, magics, size, args.reps)
        print(f"N={size}: {rows[size]}", file=sys.stderr)
    ms = lambda pair: f"{pair[0] * 1e3:.2f} ms ± {pair[1] * 1e3:.2f}"  # noqa: E731
    lines = ["| N | start (mpiexec alone) | round trip (%%px) | RT / %%px | gather 1 MB/rank (memcpy of N MB) | "
             "gather / memcpy | 100 reports per rank (same loop without) |",
             "|---|---|---|---|---|---|---|"]
    for size, r in rows.items():
        lines.append(
            f"| {size} | {r['start']:.2f} s ({r['anchor start']:.2f} s) | {ms(r['round trip'])} ({ms(r['px'])}) | "
            f"{r['round trip'][0] / r['px'][0]:.2f} | {ms(r['gather'])} ({ms(r['memcpy'])}) | "
            f"{r['gather'][0] / r['memcpy'][0]:.1f} | {ms(r['metrics'])} ({ms(r['silent'])}) |")
    small, large = sizes[0], sizes[-1]
    growth = rows[large]["round trip"][0] / rows[small]["round trip"][0]
    px_growth = rows[large]["px"][0] / rows[small]["px"][0]
    header = (f"{MARK}\n## Scale: {small} to {large} ranks on {os.cpu_count()} cores\n\n`python benchmarks/scale.py "
              f"--sizes {args.sizes} --reps {args.reps}`, {datetime.date.today()}, {platform.node()}; "
              f"medians ± half the interquartile range, arms interleaved; ranks idle between cells.\n\n")
    footer = (f"\n\nRound trip from N={small} to N={large}: {growth:.2f}x (target < 3x; %%px on the same worlds: "
              f"{px_growth:.2f}x).\n{MARK}")
    publish(header + "\n".join(lines) + footer, args.markdown, MARK)


if __name__ == "__main__":
    main()
