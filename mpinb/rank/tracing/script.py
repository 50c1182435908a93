"""Tracing a script under plain ``mpiexec`` (no notebook): every MPI call of the script traced, and each rank's
spans written as a Chrome trace file when it exits."""

import os
import sys
import time

from .intercept import install
from .ledger import BUFFER, now_ns, state


def script_trace(path):
    """Under plain mpiexec with ``MPINB_TRACE=trace-{rank}.json``: trace every MPI call of the script and write
    this rank's Chrome-trace file at exit."""
    import atexit

    from mpi4py import MPI

    from ...wire import chrome_trace as chrome

    install(MPI)
    rank = MPI.COMM_WORLD.rank
    state.start(buffer=int(os.environ.get("MPINB_TRACE_BUFFER", 10 * BUFFER)))
    offset = time.time_ns() - now_ns()

    def write():
        spans, _ = state.drain()
        target = path.format(rank=rank)
        try:
            chrome.write(target, chrome.events(rank, spans, offset_ns=offset))
        except OSError as exc:  # at exit: one line, not a traceback of mpinb's
            print(f"[mpinb] rank {rank}: cannot write the trace to {target} ({exc})", file=sys.stderr)

    atexit.register(write)
