"""mpinb against its anchors, side by side in one run on one machine; prints a table of ratios.

    python benchmarks/bench.py [--sizes 2,4,8] [--reps 30] [--starts 3] [--markdown benchmarks/RESULTS.md]

Rows:
  round trip   a trivial cell (`pass`) on every rank: `%%mpi` vs ipyparallel's `%%px --block` on the *same*
               world (same engines, same controller), the two interleaved call by call, median of --reps.
  cold start   from nothing to the first rank output at N=4: `%%mpi -n 4` + print vs
               `ipyparallel.Cluster(engines="mpi").start_and_connect_sync()` + `%%px` print, interleaved,
               median of --starts.
"""

import argparse
import datetime
import logging
import os
import platform
import statistics
import sys
import time

import ipyparallel as ipp
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from mpinb.preflight import default_mpiexec


def clock(fn):
    tic = time.perf_counter()
    fn()
    return time.perf_counter() - tic


def round_trip(ip, magics, size, reps):
    ip.run_line_magic("mpi", f"start -n {size}")
    view = magics.world.client[:]
    view.block = True
    view.activate()
    mpinb_cell = lambda: ip.run_cell_magic("mpi", "", "pass")  # noqa: E731
    px_cell = lambda: ip.run_cell_magic("px", "", "pass")  # noqa: E731
    for _ in range(5):
        mpinb_cell(), px_cell()
    ours, anchor = [], []
    for _ in range(reps):
        ours.append(clock(mpinb_cell))
        anchor.append(clock(px_cell))
    ip.run_line_magic("mpi", "stop")
    return statistics.median(ours), statistics.median(anchor)


def cold_start(ip, size, starts):
    config = Config()
    config.MPILauncher.mpi_cmd = [default_mpiexec()]

    def ours():
        ip.run_cell_magic("mpi", f"-n {size}", "print('ready')")

    clusters = []

    def anchor():
        cluster = ipp.Cluster(engines="mpi", n=size, log_level=logging.WARNING, config=config)
        clusters.append(cluster)
        client = cluster.start_and_connect_sync()
        client[:].execute("print('ready')", block=True)

    mine, theirs = [], []
    for _ in range(starts):
        mine.append(clock(ours))
        ip.run_line_magic("mpi", "stop")
        theirs.append(clock(anchor))
        clusters.pop().stop_cluster_sync()
    return statistics.median(mine), statistics.median(theirs)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2,4,8", help="world sizes for the round trip (default 2,4,8)")
    parser.add_argument("--reps", type=int, default=30, help="round trips per size and side (default 30)")
    parser.add_argument("--starts", type=int, default=3, help="cold starts per side (default 3)")
    parser.add_argument("--markdown", help="also write the table, with the machine, to this file")
    args = parser.parse_args()

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "mpinb")
    magics = ip.magics_manager.registry["MPIMagics"]
    rows = []
    trips = {}
    for size in [int(s) for s in args.sizes.split(",")]:
        ours, anchor = round_trip(ip, magics, size, args.reps)
        trips[size] = ours
        rows.append((f"round trip, N={size}", "%%px --block, same world", ours, anchor))
    ours, anchor = cold_start(ip, 4, args.starts)
    rows.append(("cold start to first output, N=4", "Cluster.start_and_connect_sync + %%px", ours, anchor))

    lines = ["| case | anchor | mpinb | anchor time | mpinb / anchor |", "|---|---|---|---|---|"]
    for case, what, mine, theirs in rows:
        lines.append(f"| {case} | {what} | {_fmt(mine)} | {_fmt(theirs)} | {mine / theirs:.2f} |")
    sizes = sorted(trips)
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        lines.append(f"| round-trip growth N={lo}→{hi} ({hi / lo:g}× ranks) | linear would be {hi / lo:g}× | "
                     f"{trips[hi] / trips[lo]:.2f}× | | |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        import ipyparallel
        import mpi4py
        from mpi4py import MPI

        machine = (f"{platform.node()}: {platform.machine()}, {os.cpu_count()} cores, {platform.system()} "
                   f"{platform.release()}; Python {platform.python_version()}, ipyparallel {ipyparallel.__version__}, "
                   f"mpi4py {mpi4py.__version__}, {' '.join(MPI.Get_library_version().split()[:3])}")
        with open(args.markdown, "w") as out:
            out.write(f"# Benchmark results\n\nLatest `make bench` ({' '.join(sys.argv[1:])}), "
                      f"{datetime.date.today()}, on {machine}.\n\nMedians; ratios below 1 mean mpinb is faster.\n\n"
                      f"{table}\n")


def _fmt(seconds):
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


if __name__ == "__main__":
    main()
