"""Where ipyparallel spends CPU on one apply round trip to every engine: CPU ms per call, per process.

    python benchmarks/px_cpu_profile.py [N] [--calls 200]

Starts a plain ipyparallel MPI cluster of N engines, makes --calls blocking ``view.apply_sync(noop)`` calls and
prints the CPU time each process (this client, the controller's processes, mpiexec, every engine) used per call.
"""

import argparse
import logging
import time

import ipyparallel as ipp
import psutil


def noop():
    return None


def cpu_seconds(processes):
    used = {}
    for key, process in processes.items():
        try:
            times = process.cpu_times()
            used[key] = times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return used


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("n", type=int, nargs="?", default=8)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    cluster = ipp.Cluster(engines="mpi", n=args.n, log_level=logging.ERROR)
    client = cluster.start_and_connect_sync()
    try:
        view = client[:]
        me = psutil.Process()
        processes = {("this client", me.pid): me}
        for child in me.children(recursive=True):
            processes[(" ".join(child.cmdline()[:3])[-45:], child.pid)] = child
        for _ in range(10):
            view.apply_sync(noop)
        before, tic = cpu_seconds(processes), time.perf_counter()
        for _ in range(args.calls):
            view.apply_sync(noop)
        wall, after = time.perf_counter() - tic, cpu_seconds(processes)
        print(f"N={args.n}: {wall / args.calls * 1e3:.2f} ms wall per call; CPU ms per call by process:")
        total = 0.0
        for key in after:
            used = (after[key] - before.get(key, after[key])) / args.calls * 1e3
            total += used
            if used >= 0.05:
                print(f"  {used:6.2f}  {key[0]} (pid {key[1]})")
        print(f"  {total:6.2f}  in all")
    finally:
        cluster.stop_cluster_sync()


if __name__ == "__main__":
    main()
