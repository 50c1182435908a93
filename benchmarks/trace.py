"""What noting every mpi4py call costs, under plain mpiexec: mpi4py's own communicator against mpinb's traced one.

    python benchmarks/trace.py [--rounds 60] [--calls 2000] [--blocks 60] [--steps 20] [--markdown PATH]

Arms, side by side in the same ranks (the traced communicator is ``MPI.COMM_WORLD`` after
``rank/tracing/intercept.install``, the untraced one mpi4py's own ``COMM_WORLD`` kept before it):
  untraced      mpi4py's communicator.
  ledger only   the traced one as on every notebook rank: the ledger and the mirror file on, spans off.
  spans on      the traced one with spans recorded into the ring (``%%mpi --trace``), drained between loops.
Cases:
  empty call    N=1 (``mpiexec -n 1``): ``comm.Barrier()``, ``comm.allreduce(1)``, ``Irecv`` + ``Isend`` of 8 bytes
                to self + ``Request.Waitall``, and ``comm.Allreduce`` of 64 KB (the buffer path the training step
                takes), each in loops of --calls calls, the arms alternating loop by loop for --rounds rounds:
                per call, the median over rounds, and the traced cost minus the untraced one (median of the
                rounds' differences ± half their interquartile range; goal: under 2 µs).
  training step N=2: ~4.5 ms of compute (a float32 matmul sized here to take that long, the fastest of 30 with
                both ranks at it, one thread per rank) then 10 ``comm.Allreduce`` of 64 KB of float32; blocks of
                --steps steps, the arms alternating block by block (order rotated each round) for --blocks
                rounds: median step time per arm, and the ratio traced / untraced as the median of each round's
                ratio of block medians, mean over ranks (goal: under 1.02). The noise row times a second
                untraced arm against the first: what "no difference" reads.
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

import numpy as np
from results import OtherLoad, publish

MARK = "<!-- trace overhead -->"
ARMS = ("untraced", "ledger", "spans")
ARM_TEXT = {"ledger": "ledger only (mirror on, spans off)", "spans": "spans on (%%mpi --trace)"}
STEP_ARMS = ("untraced", "untraced again", "ledger", "spans")
REDUCES = 10
FLOATS = 16384  # 64 KB of float32
COMPUTE_S = 4.5e-3
SINGLE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                        "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")}


def _setup():
    """mpi4py's COMM_WORLD and Request, then the traced ones, with the mirror file on as on a notebook rank."""
    from mpi4py import MPI

    from mpinb.rank import tracing

    plain, plain_request = MPI.COMM_WORLD, MPI.Request
    tracing.install(MPI)
    handle, mirror = tempfile.mkstemp(prefix="mpinb-ledger-bench-")
    os.close(handle)
    tracing.state.mirror_to(mirror)
    comms = {"untraced": (plain, plain_request), "untraced again": (plain, plain_request),
             "ledger": (MPI.COMM_WORLD, MPI.Request), "spans": (MPI.COMM_WORLD, MPI.Request)}
    return MPI, tracing.state, comms, mirror


def _arm(state, arm):
    if arm == "spans":
        state.start()
    else:
        state.stop()


def _loop(op, comm, request, calls, timer):
    """*calls* calls of *op* on *comm*, seconds per call."""
    if op == "Barrier":
        call = comm.Barrier
        tic = timer()
        for _ in range(calls):
            call()
    elif op == "allreduce":
        call = comm.allreduce
        tic = timer()
        for _ in range(calls):
            call(1)
    elif op == "Allreduce":
        from mpi4py import MPI

        call, grads, summed, total = comm.Allreduce, np.ones(FLOATS, np.float32), np.empty(FLOATS, np.float32), MPI.SUM
        tic = timer()
        for _ in range(calls):
            call(grads, summed, total)
    else:
        send, receive = np.ones(1), np.empty(1)
        isend, irecv, waitall = comm.Isend, comm.Irecv, request.Waitall
        tic = timer()
        for _ in range(calls):
            waitall([irecv(receive, 0, 7), isend(send, 0, 7)])
    return (timer() - tic) / calls


def worker_empty(args):
    MPI, state, comms, mirror = _setup()
    results = {}
    for op in ("Barrier", "allreduce", "Allreduce", "Isend+Irecv+Waitall"):
        times = {arm: [] for arm in ARMS}
        for arm in ARMS:  # warm up
            _arm(state, arm)
            _loop(op, *comms[arm], args.calls // 10, time.perf_counter)
        for _ in range(args.rounds):
            for arm in ARMS:
                _arm(state, arm)
                times[arm].append(_loop(op, *comms[arm], args.calls, time.perf_counter))
                state.drain()
        state.stop()
        results[op] = times
    os.unlink(mirror)
    print(json.dumps({"empty": results, "library": MPI.Get_library_version().split("\n")[0].strip()}))


def _quick(samples):
    """The fastest sample: what the work takes when the machine's other jobs leave it alone."""
    return min(samples)


def _calibrate(comm, timer):
    """The side of the square float32 matmul that takes COMPUTE_S on every rank at once, here."""
    n = 256
    for _ in range(5):
        a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
        out = np.empty_like(a)
        for _ in range(5):
            np.matmul(a, b, out=out)
        comm.Barrier()
        samples = []
        for _ in range(30):
            tic = timer()
            np.matmul(a, b, out=out)
            samples.append(timer() - tic)
        took = comm.allreduce(_quick(samples)) / comm.size
        n = max(64, round(n * (COMPUTE_S / took) ** (1 / 3)))
    return n


def worker_step(args):
    MPI, state, comms, mirror = _setup()
    plain = comms["untraced"][0]
    timer = time.perf_counter
    n = _calibrate(plain, timer)
    a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
    out = np.empty_like(a)
    grads, summed = np.ones(FLOATS, dtype=np.float32), np.empty(FLOATS, dtype=np.float32)

    def block(comm, steps):
        allreduce, matmul, total = comm.Allreduce, np.matmul, MPI.SUM
        times = []
        for _ in range(steps):
            tic = timer()
            matmul(a, b, out=out)
            for _ in range(REDUCES):
                allreduce(grads, summed, total)
            times.append(timer() - tic)
        return times

    compute = []
    for _ in range(30):
        tic = timer()
        np.matmul(a, b, out=out)
        compute.append(timer() - tic)
    for arm in STEP_ARMS:  # warm up
        _arm(state, arm)
        block(comms[arm][0], args.steps // 5)
    times = {arm: [] for arm in STEP_ARMS}  # per round: this rank's step times in that round's block
    for round_ in range(args.blocks):
        shift = round_ % len(STEP_ARMS)
        for arm in STEP_ARMS[shift:] + STEP_ARMS[:shift]:
            _arm(state, arm)
            plain.Barrier()
            times[arm].append(block(comms[arm][0], args.steps))
            state.drain()
    state.stop()
    everyone = plain.gather({"times": times, "compute": _quick(compute), "n": n}, root=0)
    os.unlink(mirror)
    if plain.rank == 0:
        print(json.dumps({"step": everyone}))


def _launch(mpiexec, size, case, args):
    command = [mpiexec, "-n", str(size), sys.executable, os.path.abspath(__file__), "--worker", case,
               "--rounds", str(args.rounds), "--calls", str(args.calls), "--blocks", str(args.blocks),
               "--steps", str(args.steps)]
    env = dict(os.environ, **SINGLE_THREAD)
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _us(seconds):
    return f"{seconds * 1e6:.2f} µs"


def _ms(seconds):
    return f"{seconds * 1e3:.3f} ms"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60, help="rounds of the empty-call loops")
    parser.add_argument("--calls", type=int, default=2000, help="calls per empty-call loop")
    parser.add_argument("--blocks", type=int, default=60, help="rounds of training-step blocks")
    parser.add_argument("--steps", type=int, default=20, help="steps per block")
    parser.add_argument("--markdown", help="replace the trace-overhead section of this file with the table")
    parser.add_argument("--worker", choices=("empty", "step"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return (worker_empty if args.worker == "empty" else worker_step)(args)
    import mpi4py

    from mpinb.notebook.world.mpis import default_mpiexec

    mpiexec = default_mpiexec()
    load = OtherLoad()
    empty = _launch(mpiexec, 1, "empty", args)
    step = _launch(mpiexec, 2, "step", args)["step"]
    others = load.summary()
    rows = []
    for op, times in empty["empty"].items():
        base = statistics.median(times["untraced"])
        what = {"Barrier": "comm.Barrier()", "allreduce": "comm.allreduce(1)",
                "Allreduce": "comm.Allreduce of 64 KB float32 (not empty: the buffer path)",
                "Isend+Irecv+Waitall": "Irecv + Isend 8 B to self + Request.Waitall"}[op]
        for arm in ("ledger", "spans"):
            cost = statistics.median(times[arm])
            differences = [t - u for t, u in zip(times[arm], times["untraced"])]
            extra = statistics.median(differences)
            low, _, high = statistics.quantiles(differences, n=4)
            calls = 3 if op == "Isend+Irecv+Waitall" else 1  # one exchange is three calls
            each = "per exchange (3 calls)" if calls == 3 else "per call"
            rows.append(f"| {what}, N=1, {ARM_TEXT[arm]}, {each} | mpi4py's communicator | {_us(cost)} | "
                        f"{_us(base)} | {cost / base:.2f} |")
            goal = "goal < 2 µs" if calls == 1 else f"goal < {2 * calls} µs (2 µs a call)"
            spread = f"{(high - low) * 1e6 / 2:.2f}"  # half the interquartile range of the differences
            rows.append(f"| the same, traced − untraced | {goal} | {_us(extra)} ± {spread} | | |")
    anchor = statistics.median(t for rank in step for block in rank["times"]["untraced"] for t in block)
    compute = statistics.mean(rank["compute"] for rank in step)
    label = f"training step (~{compute * 1e3:.1f} ms matmul + {REDUCES} Allreduce of 64 KB float32), N=2"
    for arm, text in (("ledger", ARM_TEXT["ledger"]), ("spans", ARM_TEXT["spans"]),
                      ("untraced again", "noise floor: untraced in both arms")):
        ours = statistics.median(t for rank in step for block in rank["times"][arm] for t in block)
        ratio = statistics.mean(statistics.median(statistics.median(o) / statistics.median(u) for o, u in
                                                  zip(rank["times"][arm], rank["times"]["untraced"]))
                                for rank in step)
        rows.append(f"| {label}, {text} | the same step, mpi4py's communicator | {_ms(ours)} | {_ms(anchor)} | "
                    f"{ratio:.4f} |")
    machine = (f"{platform.node()}: {platform.machine()}, {os.cpu_count()} cores, {platform.system()} "
               f"{platform.release()}; Python {platform.python_version()}, mpi4py {mpi4py.__version__}, "
               f"numpy {np.__version__}, {' '.join(empty['library'].split()[:3])}")
    command = " ".join(["python benchmarks/trace.py"] + [f"--{k} {getattr(args, k)}" for k in
                                                           ("rounds", "calls", "blocks", "steps")])
    header = (f"What noting every MPI call costs under plain mpiexec, medians (`{command}`, {datetime.date.today()}, "
              f"on {machine}); traced = `MPI.COMM_WORLD` after `rank/tracing/intercept.install`, "
              f"untraced = mpi4py's own, in the same ranks, arms interleaved; {others}:")
    table = [MARK, header, "",
             "| case | anchor | mpinb | anchor time | mpinb / anchor |", "|---|---|---|---|---|", *rows, MARK]
    publish("\n".join(table), args.markdown, MARK)


if __name__ == "__main__":
    main()
