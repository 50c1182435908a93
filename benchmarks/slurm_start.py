"""How long a world takes to start through Slurm against plain mpiexec on this host, side by side.

    python benchmarks/slurm_start.py [--ranks 2] [--starts 5] [--markdown benchmarks/RESULTS.md]

A single-node Slurm (tests/slurm_cluster.py: munged, slurmctld and slurmd started here and stopped at the end)
takes the job. Each round starts and stops one world of each kind, alternating; the table gives the median of
``World.start()`` (until every rank answers on the cell channel) and of ``World.stop()`` (for Slurm: until
``squeue`` no longer lists the job).
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from results import publish  # noqa: E402
from slurm_cluster import SlurmCluster  # noqa: E402

from mpinb.notebook.world.cluster import World  # noqa: E402
from mpinb.notebook.world.launchers import Placement  # noqa: E402

MARK = "<!-- slurm start -->"


def timed(ranks, launcher):
    world = World(ranks, placement=Placement(launcher=launcher), progress=False)
    tic = time.perf_counter()
    world.start()
    started = time.perf_counter() - tic
    tic = time.perf_counter()
    world.stop()
    return started, time.perf_counter() - tic


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--markdown", help="replace the Slurm section of this file with the table")
    args = parser.parse_args()
    times = {"mpi": [], "slurm": []}
    tic = time.perf_counter()
    with SlurmCluster() as cluster:
        up = time.perf_counter() - tic
        os.environ.update(cluster.env)
        for _ in range(args.starts):
            for launcher in ("mpi", "slurm"):
                times[launcher].append(timed(args.ranks, launcher))
    start = {k: statistics.median(t for t, _ in v) for k, v in times.items()}
    stop = {k: statistics.median(s for _, s in v) for k, v in times.items()}
    lines = [
        MARK,
        f"World start through Slurm, N={args.ranks}, median of {args.starts} alternating starts "
        f"(`python benchmarks/slurm_start.py --starts {args.starts}`; single-node Slurm "
        f"up in {up:.1f} s):",
        "",
        "| case | anchor | mpinb via Slurm | anchor time | Slurm / anchor |",
        "|---|---|---|---|---|",
        f"| world start, N={args.ranks} (sbatch → job running → every rank registered) | plain mpiexec here "
        f"| {start['slurm']:.2f} s | {start['mpi']:.2f} s | {start['slurm'] / start['mpi']:.2f} |",
        f"| world stop, N={args.ranks} (scancel → squeue empty) | plain mpiexec here "
        f"| {stop['slurm']:.2f} s | {stop['mpi']:.2f} s | {stop['slurm'] / stop['mpi']:.2f} |",
        MARK,
    ]
    publish("\n".join(lines), args.markdown, MARK)


if __name__ == "__main__":
    main()
