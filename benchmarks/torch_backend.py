"""The ``"mpi4py"`` torch.distributed backend against raw mpi4py and gloo, side by side in one job per world size.

    python benchmarks/torch_backend.py [--ranks 2 4] [--rounds 5] [--markdown benchmarks/RESULTS.md]

Each job runs under plain mpiexec with one torch thread per rank, large tensors in huge pages and ``trace_torch``
installed as in every mpinb world (each ``dist.*`` call noted in the ledger). Its default group is the mpi4py
backend's; gloo is a group over the same ranks (``new_group(backend="gloo")``); raw is
``comm.Allreduce(MPI.IN_PLACE, array, MPI.SUM)`` on the tensor's own memory (a numpy view of it). Arms take turns,
each round in another shuffled order; a value is the median over rounds of the mean of a round's calls (64 MB of
them at 1 MB and more), timed on rank 0 after a barrier.
  large     ``dist.all_reduce`` of 1, 4, 16 and 64 MB of float32 against raw ``MPI.Allreduce`` (the ratio), torch's
            floor (``dist.all_reduce`` as torch has it over a group whose ``allreduce`` is only that
            ``MPI.Allreduce``: what torch's own Python costs every backend) and gloo;
  small     the fixed cost of a call below 1 MB (4 B, 1 KB, 64 KB): µs per ``dist.all_reduce`` for the backend
            (with the check that the ranks agree, the default, and without it), raw mpi4py and gloo;
  DDP step  ``zero_grad``, forward, ``backward()``, ``step()`` of SGD with DDP's default buckets: a small CNN
            (3 conv layers and a linear head, batch 32 of 3×32×32) and an MLP with ResNet-18's 11.7 M
            parameters (45 MB of gradients), the backend against gloo.
  busy      the 2-rank job again with one core kept busy by another process this script starts (stopped by its
            pid at the end), as ``busy.py`` does for the allreduce rows: the same ratios, idle and busy.
"""

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARK = "<!-- torch backend -->"
ON_RANKS = "MPINB_TORCH_BACKEND_OUT"
LARGE = [1 << 20, 4 << 20, 16 << 20, 64 << 20]
SMALL = [4, 1 << 10, 64 << 10]


def models():
    import torch

    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                              torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                              torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(64 * 8 * 8, 10))
    width = 1024  # 11 layers of 1024 × 1024 (+ bias): 11.5 M parameters, ResNet-18's 11.7 M
    mlp = torch.nn.Sequential(*[layer for _ in range(11) for layer in (torch.nn.Linear(width, width),
                                                                       torch.nn.ReLU())][:-1])
    return {"cnn": (cnn, (32, 3, 32, 32), 10), "resnet18-sized": (mlp, (8, width), width)}


def ranks_main(rounds, out):
    import copy

    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import mpinb.torch as mt
    from mpinb.rank.tracing import trace_torch
    from mpinb.rank.torch_backend import agreement

    torch.set_num_threads(1)
    trace_torch.install(dist)
    mt.init_process_group("mpi4py")
    gloo = dist.new_group(backend="gloo")
    comm, rank, size = MPI.COMM_WORLD.Dup(), dist.get_rank(), dist.get_world_size()

    def timed(call, repeat):
        comm.Barrier()
        tic = time.perf_counter()
        for _ in range(repeat):
            call()
        return (time.perf_counter() - tic) / repeat

    bare = Bare(comm)
    floor = trace_torch.original["all_reduce"]  # torch's own, without mpinb's ledger

    def backend(tensor, checked=True):
        def call():
            agreement.checked = checked
            dist.all_reduce(tensor)
            agreement.checked = True
        return call

    results = {"large": {}, "small": {}, "ddp": {}}
    for nbytes in LARGE:
        tensor = torch.ones(nbytes // 4)
        array = tensor.numpy()  # the tensor's own memory: a numpy array of its own lies elsewhere, and MPI's
        # copies in and out of it took 1.25-1.5x as long at 4 and 16 MB
        arms = {"backend": backend(tensor), "raw": lambda a=array: comm.Allreduce(MPI.IN_PLACE, a, MPI.SUM),
                "floor": lambda t=tensor: floor(t, group=bare),
                "gloo": lambda t=tensor: dist.all_reduce(t, group=gloo)}
        # 64 MB through each arm per measurement: a few calls of 1 MB would time the barrier's skew, not the call
        repeat = max(4, (64 << 20) // nbytes)
        results["large"][nbytes] = _rounds(arms, rounds, lambda call, repeat=repeat: timed(call, repeat))
    for nbytes in SMALL:
        tensor = torch.ones(max(1, nbytes // 4))
        array = tensor.numpy()
        arms = {"backend": backend(tensor), "unchecked": backend(tensor, checked=False),
                "raw": lambda a=array: comm.Allreduce(MPI.IN_PLACE, a, MPI.SUM),
                "floor": lambda t=tensor: floor(t, group=bare),
                "gloo": lambda t=tensor: dist.all_reduce(t, group=gloo)}
        results["small"][nbytes] = _rounds(arms, rounds, lambda call: timed(call, 200))
    loss_fn = torch.nn.CrossEntropyLoss()
    for name, (module, shape, classes) in models().items():
        torch.manual_seed(0)
        generator = torch.Generator().manual_seed(1 + rank)
        x = torch.randn(*shape, generator=generator)
        y = torch.randint(0, classes, (shape[0],), generator=generator)
        arms = {}
        for arm, group in (("backend", None), ("gloo", gloo)):
            model = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(module), process_group=group)
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

            def step(model=model, optimizer=optimizer):
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
            step()
            step()  # DDP rebuilds its buckets after the first step
            arms[arm] = step
        results["ddp"][name] = _rounds(arms, rounds, lambda call: timed(call, 5))
    if rank == 0:
        Path(out).write_text(json.dumps({"size": size, "torch": torch.__version__, "results": results}))
    comm.Barrier()
    mt.destroy_process_group()


def Bare(comm):
    """A process group whose ``allreduce`` is one ``MPI.Allreduce`` on the tensor's memory and nothing else: torch's
    ``dist.all_reduce`` over it costs what torch's own Python costs every backend on top of the MPI call."""
    import torch.distributed as dist
    from mpi4py import MPI

    from mpinb.rank.torch_backend import work

    class BareGroup(dist.ProcessGroup):
        def allreduce(self, tensors, opts=None):
            comm.Allreduce(MPI.IN_PLACE, tensors[0].numpy(), MPI.SUM)
            return work.Done(tensors)

    return BareGroup(comm.Get_rank(), comm.Get_size())


def _rounds(arms, rounds, measure):
    """``{arm: median seconds}`` over *rounds* rounds, arms in a shuffled order each round (the same on every
    rank: one seed). A rotation would run each arm after the same one every round, and the call after gloo's is
    slower (why, not measured): the backend, run after gloo, was 1.3x the floor at 16 MB on the tensor they share,
    and 1.0x after another arm."""
    names = list(arms)
    times = {name: [] for name in names}
    shuffled = random.Random(len(names))
    measure(arms[names[0]])  # warm up
    for _ in range(rounds):
        order = shuffled.sample(names, len(names))
        for name in order:
            times[name].append(measure(arms[name]))
    return {name: statistics.median(values) for name, values in times.items()}


def _size(nbytes):
    return f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB" if nbytes >= 1 << 10 else f"{nbytes} B"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--markdown", help="replace the torch-backend section of this file with the tables")
    parser.add_argument("--no-busy", dest="busy", action="store_false", help="leave out the busy-machine job")
    args = parser.parse_args()
    if os.environ.get(ON_RANKS):
        here = Path(__file__).resolve().parent  # benchmarks/profile.py would be the standard library's profile
        sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != here]
        return ranks_main(args.rounds, os.environ[ON_RANKS])
    from results import OtherLoad, one_core_busy, publish

    from mpinb.notebook.world.mpis import default_mpiexec

    load = OtherLoad()
    jobs, took = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        def run_job(ranks):
            out = os.path.join(folder, f"{ranks}.json")
            command = [default_mpiexec(), "-n", str(ranks), sys.executable, __file__, "--rounds", str(args.rounds)]
            environment = {"THP_MEM_ALLOC_ENABLE": "1", **os.environ, ON_RANKS: out, "OMP_NUM_THREADS": "1"}
            subprocess.run(command, check=True, env=environment)
            return json.loads(Path(out).read_text())

        for ranks in args.ranks:
            tic = time.perf_counter()
            jobs[ranks] = run_job(ranks)
            took[ranks] = time.perf_counter() - tic
        others = load.summary()
        busy = None
        if args.busy and 2 in jobs:
            with one_core_busy():
                busy = run_job(2)
    first = next(iter(jobs.values()))
    rows = [MARK, f"The `mpi4py` torch.distributed backend (`rank/torch_backend/`) against raw mpi4py and gloo, "
            f"in one job per world size under plain mpiexec, one torch thread per rank, arms taking turns in a "
            f"shuffled order, medians "
            f"over {args.rounds} rounds (`python benchmarks/torch_backend.py --rounds {args.rounds}`, "
            f"{datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores, torch {first['torch']}, "
            + ", ".join(f"{ranks} ranks {seconds:.0f} s" for ranks, seconds in took.items())
            + f"; {others}). More ranks than cores time the scheduler as much as the backend.", "",
            "`dist.all_reduce` of float32, 1 MB and more: the backend against `MPI.Allreduce` of the same bytes "
            "(raw), and against torch's floor: `dist.all_reduce` as torch has it, without mpinb's ledger, over a "
            "group whose `allreduce` is that `MPI.Allreduce` on the tensor and nothing else (what torch's Python "
            "costs any backend)", "",
            "| ranks | bytes | backend | raw MPI.Allreduce | backend / raw | floor | floor / raw | backend / floor "
            "| gloo | gloo / backend |", "|---|---|---|---|---|---|---|---|---|---|"]
    for ranks, job in jobs.items():
        for nbytes, arms in job["results"]["large"].items():
            rows.append(f"| {ranks} | {_size(int(nbytes))} | {arms['backend'] * 1e3:.2f} ms | "
                        f"{arms['raw'] * 1e3:.2f} ms | {arms['backend'] / arms['raw']:.2f} | "
                        f"{arms['floor'] * 1e3:.2f} ms | {arms['floor'] / arms['raw']:.2f} | "
                        f"{arms['backend'] / arms['floor']:.2f} | {arms['gloo'] * 1e3:.2f} ms | "
                        f"{arms['gloo'] / arms['backend']:.2f} |")
    rows += ["", "Below 1 MB, µs per `dist.all_reduce` (the fixed cost: Python, the ledger, and the backend's "
             "check that the ranks agree, one `Allgather` of 4 numbers)", "",
             "| ranks | bytes | backend | backend without the check | raw mpi4py Allreduce | floor | gloo |",
             "|---|---|---|---|---|---|---|"]
    for ranks, job in jobs.items():
        for nbytes, arms in job["results"]["small"].items():
            rows.append(f"| {ranks} | {_size(int(nbytes))} | {arms['backend'] * 1e6:.1f} | "
                        f"{arms['unchecked'] * 1e6:.1f} | {arms['raw'] * 1e6:.1f} | {arms['floor'] * 1e6:.1f} | "
                        f"{arms['gloo'] * 1e6:.1f} |")
    rows += ["", "A DDP training step (DDP's default 25 MB buckets)", "",
             "| ranks | model | backend | gloo | gloo / backend |", "|---|---|---|---|---|"]
    for ranks, job in jobs.items():
        for name, arms in job["results"]["ddp"].items():
            rows.append(f"| {ranks} | {name} | {arms['backend'] * 1e3:.1f} ms | {arms['gloo'] * 1e3:.1f} ms | "
                        f"{arms['gloo'] / arms['backend']:.2f} |")
    if busy is not None:
        rows += ["", "The 2-rank job idle (the rows above) and again with one core kept busy by another process: "
                 "backend / raw at each size, µs per 4 B call, and a DDP step's gloo / backend", "",
                 "| machine | 1 MB | 4 MB | 16 MB | 64 MB | 4 B: backend, raw, gloo | DDP cnn | DDP resnet18-sized |",
                 "|---|---|---|---|---|---|---|---|"]
        for label, results in (("idle", jobs[2]["results"]), ("one core kept busy", busy["results"])):
            large = " | ".join(f"{arms['backend'] / arms['raw']:.2f}" for arms in results["large"].values())
            small = results["small"][str(SMALL[0])]
            ddp = " | ".join(f"{arms['gloo'] / arms['backend']:.2f}" for arms in results["ddp"].values())
            rows.append(f"| {label} | {large} | {small['backend'] * 1e6:.0f}, {small['raw'] * 1e6:.0f}, "
                        f"{small['gloo'] * 1e6:.0f} µs | {ddp} |")
    rows.append(MARK)
    publish("\n".join(rows), args.markdown, MARK)


if __name__ == "__main__":
    main()
