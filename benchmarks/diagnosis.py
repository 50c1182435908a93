"""Time to diagnosis: how soon after a fault the notebook shows who failed and where every rank is, and how soon
the cell ends (a stuck world restarted included), against the limits the fault itself sets.

    python benchmarks/diagnosis.py [--runs 3] [--markdown benchmarks/RESULTS.md]

Cases, each through ``%%mpi`` on a real world in one IPython shell, median of --runs:
  deadlock      two ranks in ``comm.recv`` from each other, ``--timeout 5``: the clock starts at the timeout.
  error         rank 1 raises while rank 0 waits in ``comm.Barrier()``: the clock starts at the raise.
  stop          the Stop button (``KeyboardInterrupt`` in the notebook) while both ranks wait in ``comm.recv``:
                the clock starts at the interrupt.
  memory        rank 3 of 4 raises ``MemoryError`` (a 1 TB allocation) while the others wait in ``Barrier``.
  mismatch      ranks 0, 2, 3 in ``Bcast``, rank 1 in ``Allreduce`` (no flag, no timeout): the clock starts with
                the cell; the ranks are found in different collectives after ``collective_wait`` (1 s) of waiting.
  mismatch, pickle-based   rank 1 of 2 in ``comm.allreduce``, rank 0 in ``comm.bcast``: the waiting rank holds the
                GIL, so it is read from its mirror file and its stack, not asked.
  DDP uneven inputs   a DDP model, 6 batches on rank 0 and 5 on rank 1: rank 0 waits in its sixth backward for a
                gradient bucket rank 1 never sends (without mpinb, gloo's timeout ends it after 120 s).
  DDP order     rank 0 ``dist.all_reduce`` then ``dist.broadcast``, rank 1 the other way round.
  DDP sizes     ``dist.all_reduce`` of 4 elements on rank 0, 8 on rank 1: gloo aborts a rank at once, the world is
                restarted (not kept, by the backend's doing).
  DDP unused parameters   rank 0 uses layer ``a``, rank 1 layer ``b`` of one DDP model: DDP's error at the second
                forward, with the parameters named.
  DDP order, DDP sizes, mpi4py backend   the same two cells on the group ``mt.init_process_group()`` makes on CPUs
                (``rank/torch_backend/``), whose collectives agree with each other before they start.
The diagnosis is on screen when the notebook has printed where each rank is ("blocked in", or the failing
rank's exception, or the mismatch); the limits are 1 s for the diagnosis (3 s for a mismatch, 1 s of which is
``collective_wait``) and 6 s for the whole cell.
"""

import _thread
import argparse
import io
import statistics
import sys
import threading
import time

from results import publish, shell

MARK = "<!-- diagnosis -->"
DEADLOCK = "if rank == 0:\n    comm.recv(source=1)\nelse:\n    comm.recv(source=0)"
CASES = {
    "deadlock": (2, DEADLOCK, "--timeout 5", "timeout"),
    "error": (2, "import time\nif rank == 1:\n    raise ValueError('bad input on rank 1')\ncomm.Barrier()", "",
              "start"),
    "stop": (2, DEADLOCK, "", "interrupt"),
    "memory": (4, "import numpy as np\nif rank == 3:\n    np.ones(1 << 40)\ncomm.Barrier()", "", "start"),
    "mismatch": (4, "import numpy as np\nif rank == 1:\n    comm.Allreduce(np.zeros(4, 'f'), np.zeros(4, 'f'))\n"
                 "else:\n    comm.Bcast(np.zeros(4), root=0)", "", "start"),
    "mismatch, pickle-based": (2, "x = comm.allreduce(1) if rank == 1 else comm.bcast(1, root=0)", "", "start"),
}
# gloo, asked for: the results were measured on it, the default before the mpi4py backend
DDP = ("import torch, torch.distributed as dist\nimport mpinb.torch as mt\nmt.init_process_group(\"gloo\")\n"
       "torch.manual_seed(0)\nmodel = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))\n"
       "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nbatches = [torch.randn(8, 4) for _ in range(11)][rank::2]\n"
       "class Two(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
       "        self.a, self.b = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)\n"
       "    def forward(self, x):\n        return self.a(x) if rank == 0 else self.b(x)\n")
DDP_CASES = {
    "DDP uneven inputs": (2, "for x in batches:\n    opt.zero_grad()\n    model(x).sum().backward()\n    opt.step()",
                          "", "start"),
    "DDP order": (2, "t = torch.ones(4)\nif rank == 0:\n    dist.all_reduce(t)\n    dist.broadcast(t, src=0)\nelse:\n"
                  "    dist.broadcast(t, src=0)\n    dist.all_reduce(t)", "", "start"),
    "DDP sizes": (2, "dist.all_reduce(torch.ones(4 if rank == 0 else 8))", "", "start"),
    "DDP unused parameters": (2, "two = torch.nn.parallel.DistributedDataParallel(Two())\nfor _ in range(2):\n"
                              "    two(batches[0]).sum().backward()", "", "start"),
}
# the same on the mpi4py backend, mpinb.torch's default on CPUs: every torch collective is checked against the other
# ranks' before it starts, so a mismatch is named at once and nothing aborts
BACKEND_CASES = {f"{name}, mpi4py backend": DDP_CASES[name] for name in ("DDP order", "DDP sizes")}
CASES.update(DDP_CASES)
CASES.update(BACKEND_CASES)
LIMITS = {"mismatch": 3.0, "mismatch, pickle-based": 3.0, "DDP uneven inputs": 3.0, "DDP order": 3.0}
TRIGGER_AFTER = {"timeout": 5.0, "interrupt": 1.0, "start": 0.0}


_group = {}  # id of the world -> the backend its process group was made with


class Stamped(io.TextIOBase):
    """A stream that notes when the first diagnosis was written to it."""

    def __init__(self, inner):
        self.inner, self.first = inner, None

    def write(self, text):
        if self.first is None and any(word in text for word in ("blocked in", "Error", "failed",
                                                                 "different collectives")):
            self.first = time.monotonic()
        return self.inner.write(text)

    def flush(self):
        self.inner.flush()


def run_case(ip, name):
    size, code, line, trigger = CASES[name]
    magics = ip.magics_manager.registry["MPIMagics"]
    backend = "mpi4py" if name in BACKEND_CASES else "gloo"
    if magics.world is None or not magics.world.running or magics.world.size != size or \
            (name in BACKEND_CASES or name in DDP_CASES) and _group.get(id(magics.world)) not in (None, backend):
        ip.run_line_magic("mpi", "stop") if magics.world is not None and magics.world.running else None
        ip.run_line_magic("mpi", f"start -n {size}")
        _group.clear()
    if name in DDP_CASES or name in BACKEND_CASES:
        # idempotent: the process group is made once per world
        setup = DDP.replace('mt.init_process_group("gloo")', f'mt.init_process_group("{backend}")')
        ip.run_cell(f"%%mpi\n{setup}")
        _group[id(magics.world)] = backend
    pids = [magics.world.identities[rank]["pid"] for rank in magics.world.ranks]
    out, err = Stamped(sys.stdout), Stamped(sys.stderr)
    sys.stdout, sys.stderr = out, err
    timer = None
    if trigger == "interrupt":
        timer = threading.Timer(TRIGGER_AFTER["interrupt"], _thread.interrupt_main)
        timer.start()
    started = time.monotonic()
    try:
        ip.run_cell(f"%%mpi {line}\n{code}")  # the cell shows its error as a notebook would
    finally:
        ended = time.monotonic()
        sys.stdout, sys.stderr = out.inner, err.inner
    at = started + TRIGGER_AFTER[trigger]
    shown = min(t for t in (out.first, err.first, ended) if t is not None)
    dead = not magics.world.running or magics.world.dead_ranks()
    kept = not dead and [magics.world.identities[rank]["pid"] for rank in magics.world.ranks] == pids
    if dead:
        ip.run_line_magic("mpi", "restart")
    return shown - at, ended - at, kept


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES), help="only these cases")
    parser.add_argument("--markdown", help="replace the time-to-diagnosis section of this file with the table")
    args = parser.parse_args()
    ip = shell()
    results = {}
    for name in args.cases:
        runs = [run_case(ip, name) for _ in range(args.runs)]
        results[name] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs),
                         sum(r[2] for r in runs))
        print(f"{name}: diagnosis {results[name][0]:.2f} s, cell ended {results[name][1]:.2f} s", file=sys.stderr)
    ip.run_line_magic("mpi", "stop")
    rows = [MARK, f"Time to diagnosis, median of {args.runs} (`python benchmarks/diagnosis.py --runs {args.runs}`; "
            "seconds after the timeout, the failure, the Stop button, or for a mismatch the start of the cell):", "",
            "| case | diagnosis on screen | limit | ratio | cell ended (recovery or restart included) | limit | ratio "
            "| world and variables kept |",
            "|---|---|---|---|---|---|---|---|"]
    for name, (shown, ended, kept) in results.items():
        limit = LIMITS.get(name, 1.0)
        rows.append(f"| {name} | {shown:.2f} s | {limit:g} s | {shown / limit:.2f} | {ended:.2f} s | 6 s | "
                    f"{ended / 6:.2f} | {kept} of {args.runs} runs |")
    rows.append(MARK)
    publish("\n".join(rows), args.markdown, MARK)


if __name__ == "__main__":
    main()
