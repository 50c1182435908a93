"""Native stacks: how long ``%mpi stacks`` takes to read every rank's Python and native frames with py-spy (one
py-spy per rank, ``native/py_spy.read``), against mpinb's Python-only capture (faulthandler dumps) of the same ranks.

    python benchmarks/native_stacks.py [--reps 5] [--markdown benchmarks/RESULTS.md]

For 2 and 8 ranks, all but the last wait in ``comm.Barrier()`` while the last waits (in Python) for this script
to finish reading; each capture is timed --reps times, the median kept, after one unmeasured read (a world just
started still spends its first seconds starting its ranks, on 2 cores). The goal: 8 ranks within 1 s.
"""

import argparse
import contextlib
import io
import os
import platform
import statistics
import tempfile
import threading
import time

from results import OtherLoad, publish, shell

MARK = "<!-- native stacks -->"
CELL = ("import os, time\nwhile rank == size - 1 and not os.path.exists({release!r}):\n    time.sleep(0.02)\n"
        "comm.Barrier()")
GOAL = 1.0


def measure(ip, size, reps):
    """``(%mpi stacks seconds, faulthandler capture seconds)``, medians, with *size* ranks in a Barrier."""
    from mpinb.notebook.diagnosis.diagnose import capture_stacks
    from mpinb.notebook.diagnosis.native import stacks

    magics = ip.magics_manager.registry["MPIMagics"]
    if magics.world is None or not magics.world.running:
        ip.run_line_magic("mpi", f"start -n {size}")
    elif magics.world.size != size:
        ip.run_line_magic("mpi", f"restart -n {size} --fresh")
    world = magics.world
    with contextlib.redirect_stdout(io.StringIO()):
        ip.run_cell_magic("mpi", "", "comm.Barrier()")  # every rank up and answering before the clock starts
    release = os.path.join(tempfile.mkdtemp(prefix="mpinb-bench-"), "release")
    native, python, texts = [], [], []

    def read():
        try:
            time.sleep(1.0)  # the cell on its way, the ranks in their Barrier
            stacks(world, world.ranks)  # unmeasured: a world just started is still busy starting its ranks
            for _ in range(reps):
                started = time.perf_counter()
                texts.append(stacks(world, world.ranks))
                native.append(time.perf_counter() - started)
                started = time.perf_counter()
                capture_stacks(world, world.ranks)
                python.append(time.perf_counter() - started)
        finally:
            open(release, "w").close()

    thread = threading.Thread(target=read)
    thread.start()
    with contextlib.redirect_stdout(io.StringIO()):
        ip.run_cell_magic("mpi", "--timeout 300", CELL.format(release=release))
    thread.join()
    in_mpi = sum("are in MPI_Barrier" in text or "is in MPI_Barrier" in text for text in texts)
    assert in_mpi == reps, f"the ranks were not read in their Barrier:\n{texts[-1]}"
    return statistics.median(native), statistics.median(python)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5, help="captures per case (default 5)")
    parser.add_argument("--markdown", help="also put the table in this file (its own section)")
    args = parser.parse_args()
    ip = shell()
    load = OtherLoad()
    results = {size: measure(ip, size, args.reps) for size in (2, 8)}
    ip.run_line_magic("mpi", "stop")
    rows = ["| ranks | %mpi stacks (py-spy: Python + native) | faulthandler capture (Python only) | ratio | goal "
            "| within it |", "|---|---|---|---|---|---|"]
    for size, (native, python) in results.items():
        rows.append(f"| {size} | {native * 1e3:.0f} ms | {python * 1e3:.0f} ms | {native / python:.1f}x | "
                    f"{GOAL:g} s | {'yes' if native <= GOAL else 'no'} |")
    header = (f"{MARK}\n## Native stacks\n\n`python benchmarks/native_stacks.py --reps {args.reps}`, "
              f"{time.strftime('%Y-%m-%d')}, on {platform.node()}: {os.cpu_count()} cores: every rank but the last "
              "in `comm.Barrier()` (MPICH's ranks spin there), medians; one py-spy per rank, each in a session of its "
              "own, all at once (as many as cores where the scheduler does not group by session); the ratio is that "
              "against mpinb's faulthandler "
              f"capture (Python frames only) of the same ranks in the same run ({load.summary()}).\n\n")
    publish(header + "\n".join(rows) + f"\n{MARK}", args.markdown, MARK)


if __name__ == "__main__":
    main()
