"""--gather through shared memory against the memory's own limits, and what the inspector adds.

    python benchmarks/gather.py [--reps 9] [--keep 50] [--markdown PATH]

One 4-rank world on this host, 32 MB of float32 per rank (128 MB in all). The arms, interleaved --reps times
(order rotated each round), each a median with its spread (the interquartile range):
  gather          `%%mpi --gather x --no-inspect` (cell `pass`): the values arrive as views of the ranks'
                  shared-memory segments; the only copy is each rank's, into its segment.
  inspect         the same with the inspector (statistics on the ranks, each rank compared with the first).
  ..., in sync    the same two arms for ``y``, the same values on every rank (replicas in sync).
  gather, read    the same, then every value read once (`max` of each rank's view, one thread per core): the
                  least any inspector in the notebook pays, the first touch of each page of the views included.
  memcpy          one `np.copyto` of 128 MB in this process (the anchor the targets are written against).
  memcpy, cores   the same 128 MB copied by one thread per core at once: what the ranks' copies, which run in
                  parallel, can reach at best on this machine.
Memory: the notebook's resident memory (psutil) after one gather whose values are read in full, against the
payload; and after --keep gathers that rebind the name each time (only the last kept), against the first.
"""

import argparse
import contextlib
import datetime
import gc
import io
import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
from results import OtherLoad, publish, shell

from mpinb.wire.array_stats import HISTOGRAM_SAMPLE

MARK = "<!-- gather limits -->"
RANKS, FLOATS = 4, 8 << 20  # 32 MB of float32 per rank


def spread(values):
    """``(median, interquartile range)``."""
    quartiles = statistics.quantiles(values, n=4)
    return statistics.median(values), quartiles[2] - quartiles[0]


def parallel_copy(pool, target, source, workers):
    step = -(-source.size // workers)
    for done in [pool.submit(np.copyto, target[i:i + step], source[i:i + step]) for i in range(0, source.size, step)]:
        done.result()


def gather_and_read(ip, pool, name="x"):
    ip.run_cell_magic("mpi", f"--gather {name} --no-inspect", "pass")
    list(pool.map(np.max, [ip.user_ns[name][r] for r in range(RANKS)]))


def read_all(ip):
    ip.run_cell(f"_ = [float(x[r].sum()) for r in range({RANKS})]")


def inspector_parts(ip, pool, reps):
    """Where the inspector's time goes, on the last gather's views, each part alone (``{part: (median, iqr)}``):
    the one pass of notebook/models/scan.py, the histograms' samples, and every value read once (the floor)."""
    from mpinb.notebook.models.scan import scan
    from mpinb.wire.array_stats import HISTOGRAM_SAMPLE, histogram

    views = {rank: np.asarray(ip.user_ns["x"][rank]).ravel() for rank in range(RANKS)}

    def histograms():
        for flat in views.values():
            histogram(flat[::-(-flat.size // HISTOGRAM_SAMPLE)], float(flat[0]), float(flat[0]))

    parts = {"scan": lambda: scan(views), "histograms": histograms,
             "read once": lambda: list(pool.map(np.max, views.values()))}
    times = {name: [] for name in parts}
    for _ in range(reps):
        for name, part in parts.items():
            tic = time.perf_counter()
            part()
            times[name].append(time.perf_counter() - tic)
    return {name: spread(values) for name, values in times.items()}


def memory(ip, keep):
    """Resident growth after one gather read in full, and after *keep* more that rebind ``x``."""
    process = psutil.Process()
    ip.run_cell("x = None")
    gc.collect()
    base = process.memory_info().rss
    ip.run_cell_magic("mpi", "--gather x --no-inspect", "x[:1] = 0")
    read_all(ip)
    gc.collect()
    one = process.memory_info().rss - base
    for step in range(keep):
        ip.run_cell_magic("mpi", "--gather x --no-inspect", f"x[:1] = {step}")
        read_all(ip)
        gc.collect()
    return one, process.memory_info().rss - base


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=9, help="interleaved repetitions per arm (default 9)")
    parser.add_argument("--keep", type=int, default=50, help="gathers in the memory row (default 50)")
    parser.add_argument("--markdown", help="also put the table in this file (its own section)")
    args = parser.parse_args()
    load = OtherLoad()
    ip = shell()
    with contextlib.redirect_stdout(io.StringIO()):
        ip.run_line_magic("mpi", f"start -n {RANKS}")
    ip.run_cell_magic("mpi", "", f"import numpy as np\nx = np.full({FLOATS}, rank, dtype=np.float32)\n"
                                 f"y = (np.arange({FLOATS}) % 1000).astype(np.float32)")
    payload = RANKS * FLOATS * 4
    one, kept = memory(ip, args.keep)
    source = np.ones(RANKS * FLOATS, dtype=np.float32)
    target = np.zeros_like(source)
    workers = os.cpu_count() or 1
    pool = ThreadPoolExecutor(workers)
    arms = {
        "gather": lambda: ip.run_cell_magic("mpi", "--gather x --no-inspect", "pass"),
        "inspect": lambda: ip.run_cell_magic("mpi", "--gather x", "pass"),
        "gather, read": lambda: gather_and_read(ip, pool),
        "inspect, in sync": lambda: ip.run_cell_magic("mpi", "--gather y", "pass"),
        "gather, read, in sync": lambda: gather_and_read(ip, pool, "y"),
        "memcpy": lambda: np.copyto(target, source),
        "memcpy, cores": lambda: parallel_copy(pool, target, source, workers),
    }
    times = {name: [] for name in arms}
    names = list(arms)
    with contextlib.redirect_stdout(io.StringIO()):
        for _ in range(2):  # warm: segments sized, pages touched
            for arm in arms.values():
                arm()
        for round_ in range(args.reps):
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                tic = time.perf_counter()
                arms[name]()
                times[name].append(time.perf_counter() - tic)
        assert all((ip.user_ns["x"][r][1:] == r).all() for r in range(RANKS))
        parts = inspector_parts(ip, pool, args.reps)
        ip.run_line_magic("mpi", "stop")
    pool.shutdown()
    (gather, g_iqr), (inspect, i_iqr) = spread(times["gather"]), spread(times["inspect"])
    (memcpy, m_iqr), (cores, c_iqr) = spread(times["memcpy"]), spread(times["memcpy, cores"])
    read, r_iqr = spread(times["gather, read"])
    (synced, s_iqr), (synced_read, sr_iqr) = spread(times["inspect, in sync"]), spread(times["gather, read, in sync"])
    ms = lambda s, iqr: f"{s * 1e3:.2f} ms ± {iqr * 1e3 / 2:.2f}"  # noqa: E731 - half the IQR
    mb = payload / 2**20
    rows = [
        ("| case | limit or anchor | mpinb | limit time | mpinb / limit | target |"),
        ("|---|---|---|---|---|---|"),
        (f"| --gather 32 MB float32 per rank, N={RANKS} ({mb:.0f} MB) | one memcpy of {mb:.0f} MB | "
         f"{ms(gather, g_iqr)} | {ms(memcpy, m_iqr)} | {gather / memcpy:.2f} | ≤ 0.5 |"),
        (f"| the same | memcpy of {mb:.0f} MB by {workers} threads (the ranks' copies at best) | "
         f"{ms(gather, g_iqr)} | {ms(cores, c_iqr)} | {gather / cores:.2f} | |"),
        (f"| --gather with the inspector, N={RANKS} | --gather --no-inspect | {ms(inspect, i_iqr)} | "
         f"{ms(gather, g_iqr)} | {inspect / gather:.2f} | ≤ 1.25 |"),
        (f"| the same | --gather, then every value read once by {workers} threads (the least an inspector pays) | "
         f"{ms(inspect, i_iqr)} | {ms(read, r_iqr)} | {inspect / read:.2f} | |"),
        (f"| --gather with the inspector, N={RANKS}, replicas in sync (every rank's values the same, as after an "
         f"allreduce) | --gather, then every value read once by {workers} threads | {ms(synced, s_iqr)} | "
         f"{ms(synced_read, sr_iqr)} | {synced / synced_read:.2f} | |"),
        (f"| the inspector's one pass (notebook/models/scan.py: min, max, sum, sum of squares and the difference to rank 0 "
         f"in 1 MB blocks, {workers} threads; 7 numpy passes over each block, 6 for rank 0, 3 for a block that holds rank 0's values), alone | every value read "
         f"once by {workers} threads, alone | {ms(*parts['scan'])} | {ms(*parts['read once'])} | "
         f"{parts['scan'][0] / parts['read once'][0]:.2f} | |"),
        (f"| the inspector's histograms (a strided sample of {HISTOGRAM_SAMPLE:,} values per rank), alone | the same "
         f"| {ms(*parts['histograms'])} | {ms(*parts['read once'])} | "
         f"{parts['histograms'][0] / parts['read once'][0]:.2f} | |"),
        (f"| notebook's resident growth, one gather read in full | the payload ({mb:.0f} MB) | "
         f"{one / 2**20:.0f} MB | {mb:.0f} MB | {one / payload:.2f} | ≤ 1.1 |"),
        (f"| the same after {args.keep} more gathers, only the last kept | after one | {kept / 2**20:.0f} MB | "
         f"{one / 2**20:.0f} MB | {kept / one:.2f} | ≤ 1.2 |"),
    ]
    header = (f"{MARK}\n## --gather against the memory's limits\n\n`python benchmarks/gather.py "
              f"--reps {args.reps} --keep {args.keep}`, {datetime.date.today()}, {platform.node()}, "
              f"{os.cpu_count()} cores; medians ± half the interquartile range over {args.reps} interleaved "
              f"rounds; {load.summary()}.\n\n")
    publish(header + "\n".join(rows) + f"\n{MARK}", args.markdown, MARK)


if __name__ == "__main__":
    main()
