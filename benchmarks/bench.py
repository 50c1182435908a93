"""mpinb against its anchors, side by side in one run on one machine; prints a table of ratios.

    python benchmarks/bench.py [--sizes 2,4,8] [--reps 30] [--starts 3] [--markdown benchmarks/RESULTS.md]

Rows:
  round trip   a trivial cell (`pass`) on every rank: `%%mpi` vs ipyparallel's `%%px --block` on the *same*
               world (same engines, same controller), interleaved in blocks of 10 cells (each block after
               one untimed cell), median of --reps blocks; and against the goals of 1 ms at N=2, 2 ms at N=8.
  cold start   from nothing to the first rank output at N=4: `%%mpi -n 4` + print vs
               `ipyparallel.Cluster(engines="mpi").start_and_connect_sync()` + `%%px` print, interleaved,
               median of --starts.
  report       a ~5 ms training step (MLP forward, backward, SGD; one torch thread per rank) with
               `mpinb.report(loss=..., lr=...)` every step vs the same step without, on the same ranks in the
               same cell, blocks of --steps alternating --blocks times; the ratio is the median of adjacent
               blocks' ratios, mean over N=2 ranks. The notebook side runs the live widget view as in
               JupyterLab. The noise row runs the same with neither arm reporting: what "no difference" reads.
               The CPU row adds up the time spent inside report() and the CPU time of the rank's outbox thread
               (psutil) over the reporting blocks: the cost itself, below the wall-clock noise.
  live view    4 ranks each reporting 2,000 times a second for --flood seconds: widget messages the notebook
               sends per second vs reports per second arriving.
  gather       32 MB of float32 per rank at N=2 and 4: `%%mpi --gather x --no-inspect` (cell `pass`) vs
               ipyparallel's `view.pull("x")` on the same world vs one in-process memcpy (`np.copyto` into a
               preallocated array) of the same total bytes; interleaved, median of --gathers. With the
               inspector on (statistics computed on the ranks) as a separate row.
  allreduce    an ~11.7 M-parameter gradient set with ResNet-18's 62 parameter shapes, N=2, median of
               --allreduces: `mpinb.torch.allreduce_gradients` (25 MB buckets) vs one flat `MPI.Allreduce` of
               the same bytes (the bound) vs one `Allreduce` per parameter vs torch.distributed gloo
               `all_reduce` of the same buckets vs DDP (backward with its gloo reduction, minus plain backward);
               and `compression="fp16"` against the float32 call.
  scaling      a small CNN training step (two conv layers and two linear ones, 0.55 M parameters, batch 32 of
               3×32×32 per rank, one torch thread per rank): 1 rank vs 2 ranks with allreduce_gradients (weak
               scaling efficiency = t1 / t2); the same 2 ranks without any communication (what two busy ranks
               on this machine cost each other); and the overlapped DistributedOptimizer vs the blocking one.
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
from results import OtherLoad
from traitlets.config import Config

from mpinb.notebook.world.mpis import default_mpiexec


class Sample(list):
    """Repeated timings of one arm: the median, and half the interquartile range as its spread."""

    @property
    def median(self):
        return statistics.median(self)

    @property
    def spread(self):
        if len(self) < 2:
            return 0.0
        quartiles = statistics.quantiles(self, n=4)
        return (quartiles[2] - quartiles[0]) / 2


def _value(x):
    return x.median if isinstance(x, Sample) else x


def clock(fn):
    tic = time.perf_counter()
    fn()
    return time.perf_counter() - tic


BLOCK = 10  # round trips timed together
ROUND_TRIP_GOALS = {2: 1e-3, 8: 2e-3}  # seconds


def round_trip(ip, magics, size, reps):
    ip.run_line_magic("mpi", f"start -n {size}")
    view = magics.world.client[:]
    view.block = True
    view.activate()
    mpinb_cell = lambda: ip.run_cell_magic("mpi", "", "pass")  # noqa: E731
    px_cell = lambda: ip.run_cell_magic("px", "", "pass")  # noqa: E731
    def block(cell):
        """One cell per BLOCK, timed together after one untimed cell: what the other side left running (the
        engines' IOPub messages after a %%px, say) settles first, so each side is timed in its steady state."""
        cell()
        return clock(lambda: [cell() for _ in range(BLOCK)]) / BLOCK

    for _ in range(2):
        block(mpinb_cell), block(px_cell)
    ours, anchor = [], []
    for _ in range(reps):
        ours.append(block(mpinb_cell))
        anchor.append(block(px_cell))
    ip.run_line_magic("mpi", "stop")
    return Sample(ours), Sample(anchor)


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
    return Sample(mine), Sample(theirs)


TRAIN = """
import statistics, time, torch, mpinb
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))

def train_step():
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss

for _ in range(20):
    train_step()
import psutil, threading
outbox = next(thread for thread in threading.enumerate() if thread.name == "mpinb-outbox")

def outbox_cpu():
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id == outbox.native_id)

pairs, in_report, reporting_seconds, outbox_before = [], 0.0, 0.0, outbox_cpu()
for block in range({blocks}):
    seconds = {{}}
    for arm in ("a", "b") if block % 2 == 0 else ("b", "a"):
        reporting = arm == "a" and {report}
        tic = time.perf_counter()
        for step in range({steps}):
            loss = train_step()
            if reporting:
                inside = time.perf_counter()
                mpinb.report(loss=loss, lr=0.01)
                in_report += time.perf_counter() - inside
        seconds[arm] = (time.perf_counter() - tic) / {steps}
        reporting_seconds += seconds[arm] * {steps} if reporting else 0
    pairs.append((seconds["a"], seconds["b"]))
cost = (in_report + outbox_cpu() - outbox_before) / reporting_seconds if {report} else 0.0
(statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs),
 statistics.median(a / b for a, b in pairs), cost)
"""

FLOOD = """
import time, mpinb
t0, sent = time.perf_counter(), 0
while sent < {total}:
    mpinb.report(step=sent, loss=rank + sent * 1e-6)
    sent += 1
    ahead = t0 + sent / {rate} - time.perf_counter()
    if ahead > 0:
        time.sleep(ahead)
"""


def report_overhead(ip, magics, size, blocks, steps):
    """Step times with report() (arm a) and without (arm b), and the same with neither arm reporting (the
    noise floor): ``[(a, b, median a/b of adjacent blocks, share of a's time spent in report() and the
    rank's outbox thread), ...]``, each averaged over the ranks."""
    magics.live_view = "widgets"
    ip.run_line_magic("mpi", f"start -n {size}")
    results = []
    for report in (True, False):
        medians = ip.run_cell_magic("mpi", "", TRAIN.format(blocks=blocks, steps=steps, report=report))
        results.append(tuple(statistics.mean(m[i] for m in medians.values()) for i in range(4)))
    ip.run_line_magic("mpi", "stop")
    return results


def live_view_rate(ip, magics, size, rate, seconds):
    """Widget messages per second the notebook sent, and reports per second that reached it."""
    magics.live_view = "widgets"
    ip.run_line_magic("mpi", f"start -n {size}")
    tic = time.perf_counter()
    ip.run_cell_magic("mpi", "", FLOOD.format(total=rate * seconds, rate=rate))
    elapsed = time.perf_counter() - tic
    live = magics.live
    ip.run_line_magic("mpi", "stop")
    return live.view.messages / elapsed, live.records / elapsed, live.refreshes / elapsed


def gather_bandwidth(ip, magics, size, reps):
    """Median seconds of --gather (without and with the inspector), view.pull and memcpy of size × 32 MB."""
    import numpy as np

    ip.run_line_magic("mpi", f"start -n {size}")
    ip.run_cell_magic("mpi", "", "import numpy as np\nx = np.full(8 * 2**20, rank, dtype=np.float32)")
    view = magics.world.client[:]
    source = np.ones(size * 8 * 2**20, dtype=np.float32)
    target = np.zeros_like(source)
    cases = {
        "gather": lambda: ip.run_cell_magic("mpi", "--gather x --no-inspect", "pass"),
        "inspect": lambda: _quietly(lambda: ip.run_cell_magic("mpi", "--gather x", "pass")),
        "pull": lambda: view.pull("x", block=True),
        "memcpy": lambda: np.copyto(target, source),
    }
    times = {name: [] for name in cases}
    for _ in range(3):  # the first gathers size the arenas and the notebook's allocations
        for case in cases.values():
            case()
    for _ in range(reps):
        for name, case in cases.items():
            times[name].append(clock(case))
    assert all(np.array_equal(ip.user_ns["x"][r], np.full(8 * 2**20, r, dtype=np.float32)) for r in range(size))
    ip.run_line_magic("mpi", "stop")
    return {name: Sample(values) for name, values in times.items()}, source.nbytes


def _quietly(fn):
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        fn()


RESNET18 = """
import statistics, time, torch, numpy as np
import torch.distributed as dist
import mpinb.torch as mt
from mpi4py import MPI
torch.set_num_threads(1)

def resnet18_shapes():
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    channels = 64
    for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for block in range(2):
            first = block == 0
            shapes += [(width, channels if first else width, 3, 3), (width,), (width,), (width, width, 3, 3), (width,),
                       (width,)]
            if first and (stride != 1 or channels != width):
                shapes += [(width, channels, 1, 1), (width,), (width,)]
        channels = width
    return shapes + [(1000, 512), (1000,)]

params = [torch.nn.Parameter(torch.zeros(shape)) for shape in resnet18_shapes()]
for p in params:
    p.grad = torch.randn_like(p)
named = [(str(i), p) for i, p in enumerate(params)]
total = sum(p.numel() for p in params)
flat = np.random.rand(total).astype(np.float32)
mt.init_process_group("gloo")
from mpinb.rank.data_parallel.flat_buffers import buckets_of
buckets = [torch.cat([p.grad.reshape(-1) for _, p in bucket]) for bucket in buckets_of(named, bucket_bytes=25 << 20)]

class Everything(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.params = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(p.shape)) for p in params])
    def forward(self):
        return sum(p.sum() for p in self.params)

plain = Everything()
ddp = torch.nn.parallel.DistributedDataParallel(Everything())
cases = {
    "bucketed": lambda: mt.allreduce_gradients(named),
    "fp16": lambda: mt.allreduce_gradients(named, compression="fp16"),
    "flat": lambda: comm.Allreduce(MPI.IN_PLACE, flat),
    "per_parameter": lambda: [comm.Allreduce(MPI.IN_PLACE, p.grad.numpy()) for p in params],
    "gloo": lambda: [dist.all_reduce(b) for b in buckets],
    "ddp": lambda: ddp().backward(),
    "plain_backward": lambda: plain().backward(),
}
times = {name: [] for name in cases}
for repeat in range(REPS + 2):
    for name, case in cases.items():
        comm.Barrier()
        tic = time.perf_counter()
        case()
        comm.Barrier()
        if repeat >= 2:
            times[name].append(time.perf_counter() - tic)
result = dict(times)  # every repetition: the notebook reports the median and the spread
result["bytes"] = total * 4
result
"""

CNN_STEP = """
import statistics, time, torch
import mpinb.torch as mt
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
    torch.nn.Linear(64 * 8 * 8, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
sgd = torch.optim.SGD(model.parameters(), lr=0.01)
blocking = mt.DistributedOptimizer(sgd, model)
overlapped = mt.DistributedOptimizer(sgd, model, overlap=True, bucket_mb=1)
overlapped.reducer.remove()  # hooks only while it is measured

def steps(opt, n):
    comm.Barrier()
    tic = time.perf_counter()
    for _ in range(n):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    comm.Barrier()
    return (time.perf_counter() - tic) / n

times = {"blocking": [], "overlapped": [], "independent": []}
steps(blocking, 3)
for block in range(BLOCKS):
    times["blocking"].append(steps(blocking, STEPS))
    if size > 1:
        times["independent"].append(steps(sgd, STEPS))  # the same work with no communication at all
        overlapped.reducer = mt.GradientAllreducer(model, bucket_mb=1)
        times["overlapped"].append(steps(overlapped, STEPS))
        overlapped.reducer.remove()
{name: values for name, values in times.items() if values}
"""


def allreduce_rows(ip, reps):
    ip.run_line_magic("mpi", "start -n 2")
    result = ip.run_cell_magic("mpi", "", RESNET18.replace("REPS", str(reps)))[0]
    ip.run_line_magic("mpi", "stop")
    return {name: Sample(values) if isinstance(values, list) else values for name, values in result.items()}


def scaling_rows(ip, blocks, steps):
    code = CNN_STEP.replace("BLOCKS", str(blocks)).replace("STEPS", str(steps))
    ip.run_line_magic("mpi", "start -n 1")
    one = ip.run_cell_magic("mpi", "", code)[0]
    ip.run_line_magic("mpi", "restart -n 2")
    two = ip.run_cell_magic("mpi", "", code)[0]
    ip.run_line_magic("mpi", "stop")
    return Sample(one["blocking"]), Sample(two["blocking"]), Sample(two["overlapped"]), Sample(two["independent"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2,4,8", help="world sizes for the round trip (default 2,4,8)")
    parser.add_argument("--reps", type=int, default=30, help="round trips per size and side (default 30)")
    parser.add_argument("--starts", type=int, default=3, help="cold starts per side (default 3)")
    parser.add_argument("--blocks", type=int, default=60, help="alternating blocks per arm, report row (default 60)")
    parser.add_argument("--steps", type=int, default=20, help="training steps per block, report row (default 20)")
    parser.add_argument("--flood", type=int, default=5, help="seconds of 4 × 2,000 reports/s, live view row")
    parser.add_argument("--gathers", type=int, default=7, help="repetitions per gather case (default 7)")
    parser.add_argument("--allreduces", type=int, default=15, help="repetitions per allreduce case (default 15)")
    parser.add_argument("--markdown", help="also write the table, with the machine, to this file")
    args = parser.parse_args()

    load = OtherLoad()
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

    reporting, noise = report_overhead(ip, magics, 2, args.blocks, args.steps)
    rows.append(("training step with mpinb.report() every step, N=2", "same step without report()", *reporting[:3]))
    rows.append(("noise floor: the same, neither arm reporting", "same step without report()", *noise[:3]))
    messages, reports, refreshes = live_view_rate(ip, magics, 4, 2000, args.flood)
    magics.live_view = "auto"
    reduced = allreduce_rows(ip, args.allreduces)
    mb = reduced["bytes"] / 2**20
    for name, anchor in (("flat", f"one flat MPI.Allreduce of the {mb:.0f} MB (the bound)"),
                         ("per_parameter", "one MPI.Allreduce per parameter (62)"),
                         ("gloo", "torch.distributed gloo all_reduce, same buckets")):
        rows.append((f"allreduce_gradients, ResNet-18 gradients ({mb:.0f} MB), N=2", anchor, reduced["bucketed"],
                     reduced[name]))
    rows.append((f"allreduce_gradients(compression='fp16'), ResNet-18 gradients ({mb:.0f} MB), N=2",
                 "allreduce_gradients, float32", reduced["fp16"], reduced["bucketed"]))
    ddp_reduction = Sample(d - p for d, p in zip(reduced["ddp"], reduced["plain_backward"]))  # same repetition
    rows.append((f"allreduce_gradients, ResNet-18 gradients ({mb:.0f} MB), N=2",
                 "DDP (gloo): backward with its reduction − plain backward", reduced["bucketed"], ddp_reduction))
    one, two, overlapped, independent = scaling_rows(ip, 10, 5)
    rows.append(("CNN training step, N=2 with allreduce_gradients (weak scaling)", "the same step, N=1", two, one))
    rows.append(("CNN training step, N=2, no communication at all (what sharing the machine costs)",
                 "the same step, N=1", independent, one))
    rows.append(("CNN training step, N=2, DistributedOptimizer(overlap=True)", "the blocking one", overlapped, two))
    gathers = {size: gather_bandwidth(ip, magics, size, args.gathers) for size in (2, 4)}
    for size, (median, nbytes) in gathers.items():
        mb = nbytes / 2**20
        rows.append((f"--gather 32 MB float32 per rank, N={size} ({mb:.0f} MB)", "view.pull, same world",
                     median["gather"], median["pull"], None, nbytes))
        rows.append((f"--gather 32 MB float32 per rank, N={size} ({mb:.0f} MB)", f"memcpy of {mb:.0f} MB",
                     median["gather"], median["memcpy"], None, nbytes))
        rows.append((f"--gather with the inspector, N={size}", "--gather --no-inspect", median["inspect"],
                     median["gather"]))

    lines = ["| case | anchor | mpinb | anchor time | mpinb / anchor |", "|---|---|---|---|---|"]
    for case, what, mine, theirs, *extra in rows:
        ratio = extra[0] if extra and extra[0] is not None else _value(mine) / _value(theirs)
        if len(extra) > 1:  # a transfer: show bandwidths too
            nbytes = extra[1]
            lines.append(f"| {case} | {what} | {_fmt(mine)} ({nbytes / _value(mine) / 1e9:.2f} GB/s) | {_fmt(theirs)} "
                         f"({nbytes / _value(theirs) / 1e9:.2f} GB/s) | {ratio:.3f} |")
        else:
            lines.append(f"| {case} | {what} | {_fmt(mine)} | {_fmt(theirs)} | {ratio:.3f} |")
    lines.append(f"| CPU in report() calls + the rank's outbox thread, per step | the step | "
                 f"{reporting[3] * reporting[0] * 1e6:.1f} µs | {_fmt(reporting[0])} | {reporting[3]:.4f} |")
    lines.append(f"| live view, 4 ranks × 2,000 reports/s | reports/s arriving | {messages:.0f} widget msgs/s "
                 f"({refreshes:.1f} redraws/s) | {reports:.0f} reports/s | {messages / reports:.4f} |")
    sizes = sorted(trips)
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        lines.append(f"| round-trip growth N={lo}→{hi} ({hi / lo:g}× ranks) | linear would be {hi / lo:g}× | "
                     f"{trips[hi].median / trips[lo].median:.2f}× | | |")
    for size, goal in ROUND_TRIP_GOALS.items():
        if size in trips:
            lines.append(f"| round trip, N={size} | goal ≤ {_fmt(goal)} | {_fmt(trips[size].median)} | | "
                         f"{trips[size].median / goal:.2f} of the goal |")
    for size, (median, _) in gathers.items():
        lines.append(f"| --gather bandwidth ÷ memcpy bandwidth, N={size} | goal ≥ 0.25 | "
                     f"{median['memcpy'].median / median['gather'].median:.2f} | | |")
        lines.append(f"| --gather speed-up over view.pull, N={size} | goal ≥ 20× | "
                     f"{median['pull'].median / median['gather'].median:.1f}× | | |")
    lines.append(f"| allreduce_gradients speed ÷ flat Allreduce speed | goal ≥ 0.9 | "
                 f"{reduced['flat'].median / reduced['bucketed'].median:.2f} | | |")
    lines.append(f"| allreduce_gradients speed-up over gloo | goal ≥ 3× | "
                 f"{reduced['gloo'].median / reduced['bucketed'].median:.1f}× | | |")
    lines.append(f"| weak-scaling efficiency N=1→2 (t1 / t2) | goal ≥ 0.85 | {one.median / two.median:.2f} | | |")
    lines.append(f"| the same without communication (the machine's ceiling) | | "
                 f"{one.median / independent.median:.2f} | | |")
    table = "\n".join(lines)
    print(table)
    others = load.summary()
    print(f"During this run {others}.")
    if args.markdown:
        import ipyparallel
        import mpi4py
        from mpi4py import MPI

        machine = (f"{platform.node()}: {platform.machine()}, {os.cpu_count()} cores, {platform.system()} "
                   f"{platform.release()}; Python {platform.python_version()}, ipyparallel {ipyparallel.__version__}, "
                   f"mpi4py {mpi4py.__version__}, {' '.join(MPI.Get_library_version().split()[:3])}")
        with open(args.markdown, "w") as out:
            out.write(f"# Benchmark results\n\nLatest `make bench` ({' '.join(sys.argv[1:])}), "
                      f"{datetime.date.today()}, on {machine}. During the run {others}.\n\n"
                      "Medians ± half the interquartile range over "
                      "interleaved repetitions (where a row has one); ratios below 1 mean mpinb is faster.\n\n"
                      f"{table}\n")


def _fmt(seconds):
    """``1.81 ms``; a :class:`Sample` as its median ± half its interquartile range."""
    if isinstance(seconds, Sample):
        return f"{_fmt(seconds.median)} ± {_fmt(seconds.spread)}"
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


if __name__ == "__main__":
    main()
