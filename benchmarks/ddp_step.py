"""What putting DDP's gradient allreduce in the ledger costs a training step: mpinb's hook on and off, in one job.

    python benchmarks/ddp_step.py [--rounds 16] [--blocks 3] [--markdown benchmarks/RESULTS.md]

On each rank ``trace_torch.install(torch.distributed)`` and ``trace_ddp.install(torch.nn.parallel.distributed)``
run first, as in every mpinb world; then ``mpinb.torch.init_process_group("gloo")``. Two DDP models of the same
architecture and weights are made per case, in one 2-rank job under plain ``mpiexec`` (one rank per core, one
torch thread per rank: more ranks than cores measure the scheduler), the arms alternating block by block, in
another order each round, for --rounds rounds:
  on    a model made by ``DistributedDataParallel(...)`` after the installs: each step noted in the ledger when
        its backward begins (a hook on the model's output, set after DDP's ``_post_forward``), with Stop held
        until that backward ends (``trace_ddp``), DDP's own C++ allreduce untouched;
  off   a model made by the ``__init__`` mpinb's wrapper wraps (``DistributedDataParallel.__init__.__wrapped__``),
        with DDP's own ``_pre_forward`` and ``_post_forward``: nothing noted, as without mpinb;
  off'  the off model again: what "no difference" reads (the noise row).
Cases (a step: ``zero_grad``, forward, ``loss.backward()``, ``optimizer.step()`` of SGD; rank 0 times blocks of
20 steps after a barrier, wall clock and its process's CPU time, all threads; an arm's value in a round is the
median of its --blocks blocks):
  small MLP         3 Linear layers 256 wide, batch 64, DDP's default buckets (one bucket per step);
  several buckets   16 Linear layers 362 wide (8.4 MB of parameters), batch 64, ``bucket_cap_mb=1``: the
                    several buckets per step (a communication hook per bucket, tried first, cost 8-12% here:
                    a separate division pass over each bucket, the GIL for each bucket's callback, and
                    ``dist.all_reduce``'s Python checks).
The ratio is the median over rounds of each round's on / off (goal: at most 1.02); the CPU ratio says the same of
rank 0's CPU time, which other processes on the machine disturb less than the wall clock.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

MARK = "<!-- ddp step -->"
RANKS, STEPS, BATCH = 2, 20, 64
CASES = {"mlp": "small MLP: 3 × Linear(256), batch 64",
         "buckets": "several buckets: 16 × Linear(362), 8.4 MB, bucket_cap_mb=1, batch 64"}
ON_RANKS = "MPINB_DDP_STEP_OUT"  # set for the ranks: where rank 0 writes its timings


def build(case):
    """The module, its input and target of *case*, and the DDP keywords (the same on every rank and arm)."""
    import torch

    layers, width = (3, 256) if case == "mlp" else (16, 362)
    stack = [torch.nn.Linear(width, width)]
    for _ in range(layers - 1):
        stack += [torch.nn.ReLU(), torch.nn.Linear(width, width)]
    return torch.nn.Sequential(*stack), width, {} if case == "mlp" else {"bucket_cap_mb": 1}


def ranks_main(rounds, blocks, out):
    """One rank of the job: both arms of both cases, alternating; rank 0 writes the timings to *out*."""
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn.parallel.distributed as ddp_module
    from mpi4py import MPI

    import mpinb.torch as mt
    from mpinb.rank import tracing
    from mpinb.rank.tracing import trace_ddp, trace_torch

    torch.set_num_threads(1)
    trace_torch.install(dist)
    trace_ddp.install(ddp_module)
    mt.init_process_group("gloo")  # the results measure gloo, the default before the mpi4py backend
    comm, rank = MPI.COMM_WORLD, dist.get_rank()
    DDP = ddp_module.DistributedDataParallel
    unwrapped = DDP.__init__.__wrapped__  # the __init__ trace_ddp.install wrapped: no hook, DDP's C++ allreduce
    assert unwrapped is not DDP.__init__

    def plain(module, **options):
        model = DDP.__new__(DDP)
        unwrapped(model, module, **options)
        for name in ("_pre_forward", "_post_forward"):  # DDP's own, where trace_ddp wraps them
            own = getattr(getattr(DDP, name), "__wrapped__", None)
            if own is not None:
                setattr(model, name, types.MethodType(own, model))
        return model

    setups = {}
    for case in CASES:
        torch.manual_seed(0)  # the same weights on every rank and in both arms
        module, width, options = build(case)
        on = DDP(copy.deepcopy(module), **options)
        off = plain(copy.deepcopy(module), **options)
        assert on in trace_ddp.models and off not in trace_ddp.models
        generator = torch.Generator().manual_seed(1 + rank)  # each rank its own batch
        x = torch.randn(BATCH, width, generator=generator)
        y = torch.randint(0, width, (BATCH,), generator=generator)
        setups[case] = {name: (model, torch.optim.SGD(model.parameters(), lr=1e-3), x, y)
                        for name, model in (("on", on), ("off", off))}
    loss_fn = torch.nn.CrossEntropyLoss()
    ledger = tracing.state.ledgers  # the default group's ledger counts the on arm's buckets

    def block(model, optimizer, x, y):
        """Seconds per step of one block on this rank: wall clock, and CPU of the process (all its threads)."""
        comm.Barrier()
        tic, cpu = time.perf_counter(), time.process_time()
        for _ in range(STEPS):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
        return (time.perf_counter() - tic) / STEPS, (time.process_time() - cpu) / STEPS

    buckets = {}
    for case in CASES:  # warm up both arms (DDP rebuilds its buckets after the first step) and count buckets
        for name in ("on", "off"):
            block(*setups[case][name])
            before = ledger["torch:default"].count
            block(*setups[case][name])
            buckets[case, name] = (ledger["torch:default"].count - before) / STEPS
    runs = {name: [] for name in ("on", "off", "again")}
    arms = [("on", "on"), ("off", "off"), ("again", "off")]
    for number in range(rounds):  # the arms alternate block by block, each round in another order
        order = arms[number % 3:] + arms[:number % 3]
        times = {(name, case): [] for name, _ in arms for case in CASES}
        for _ in range(blocks):
            for case in CASES:
                for name, model in order:
                    times[name, case].append(block(*setups[case][model]))
        for name, _ in arms:
            runs[name].append({case: [statistics.median(wall for wall, _ in times[name, case]),
                                      statistics.median(cpu for _, cpu in times[name, case])] for case in CASES})
    if rank == 0:
        Path(out).write_text(json.dumps({"runs": runs, "torch": torch.__version__,
                                         "buckets": {case: buckets[case, "on"] for case in CASES},
                                         "ledgered_off": {case: buckets[case, "off"] for case in CASES}}))
    comm.Barrier()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=3, help="blocks of 20 steps per arm, case and round")
    parser.add_argument("--markdown", help="replace the DDP-step section of this file with the table")
    args = parser.parse_args()
    if os.environ.get(ON_RANKS):
        here = Path(__file__).resolve().parent  # benchmarks/profile.py would be the standard library's profile
        sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != here]
        return ranks_main(args.rounds, args.blocks, os.environ[ON_RANKS])
    from results import OtherLoad, publish

    from mpinb.notebook.world.mpis import default_mpiexec

    load = OtherLoad()
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "timings.json")
        command = [default_mpiexec(), "-n", str(RANKS), sys.executable, __file__, "--rounds", str(args.rounds),
                   "--blocks", str(args.blocks)]
        tic = time.perf_counter()
        subprocess.run(command, check=True, env={**os.environ, ON_RANKS: out, "OMP_NUM_THREADS": "1"})
        took = time.perf_counter() - tic
        result = json.loads(Path(out).read_text())
    others = load.summary()
    runs = result["runs"]
    rows = [MARK, "A DDP training step with mpinb's ledger (`trace_ddp`: each step noted as its backward begins, "
            "Stop held until it ends, DDP's C++ allreduce untouched) on and off, in one 2-rank job under plain "
            "mpiexec (gloo, one torch thread per rank), "
            f"medians over {args.rounds} rounds of the median of {args.blocks} blocks of {STEPS} steps, arms "
            f"alternating (`python benchmarks/ddp_step.py --rounds {args.rounds} --blocks {args.blocks}`, "
            f"{datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores, torch {result['torch']}, "
            f"{took:.0f} s; {others}):", "",
            "| case | ledger entries per step | off (as without mpinb) | on (each step in the ledger) | "
            "on / off (goal ≤ 1.02) | noise: off' / off | CPU on / off | CPU noise |",
            "|---|---|---|---|---|---|---|---|"]
    for key, name in CASES.items():
        ratio, noise, cpu_ratio, cpu_noise = (
            statistics.median(a[key][which] / b[key][which] for a, b in zip(runs[arm], runs["off"]))
            for which in (0, 1) for arm in ("on", "again"))
        off, on = (statistics.median(run[key][0] for run in runs[which]) for which in ("off", "on"))
        rows.append(f"| {name} | {result['buckets'][key]:g} | {off * 1e3:.3f} ms | {on * 1e3:.3f} ms | "
                    f"{ratio:.3f} | {noise:.3f} | {cpu_ratio:.3f} | {cpu_noise:.3f} |")
    rows.append(MARK)
    publish("\n".join(rows), args.markdown, MARK)
    if any(result["ledgered_off"].values()):
        print(f"warning: the off arm's steps reached the ledger: {result['ledgered_off']}", file=sys.stderr)


if __name__ == "__main__":
    main()
