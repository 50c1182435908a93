"""Rank-side set-up of a world: predefine ``comm``, ``rank``, ``size`` and report who we are."""

import os
import socket

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def init_world(namespace=None, *, threads=0):
    """Put ``comm``, ``rank`` and ``size`` into *namespace*, share the cores, put torch's large tensors in huge
    pages (:func:`large_tensors_in_huge_pages`), give the rank ``torchrun``'s environment, and return this rank's
    identity.

    *namespace* defaults to the IPython user namespace of the engine this runs in. *threads* is how many threads
    each rank's math libraries (OpenMP, BLAS, torch, TensorFlow) may use: 0 gives each rank an equal share of
    the cores of its host, as ``torchrun`` does, so ranks sharing a host do not oversubscribe it; a negative
    number leaves the libraries' own defaults. A thread variable already in the environment is kept.
    ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``LOCAL_RANK`` and the rest a ``torchrun`` worker has are set as
    :func:`~mpinb.rank.process_group.torchrun_environment` says (it imports no torch), so ``env://`` works in
    every cell; each world, a restarted one too, has a port and a run id of its own.
    """
    from mpi4py import MPI

    from .process_group import torchrun_environment

    share_cores(MPI.COMM_WORLD, threads)
    large_tensors_in_huge_pages()
    torchrun_environment(comm=MPI.COMM_WORLD)  # before tracing: mpinb's own collectives stay out of the ledger

    if namespace is None:
        from IPython import get_ipython

        namespace = get_ipython().user_ns
    from .guards import guard_world
    from .tracing import install

    install(MPI)  # every MPI call noted: collectives checked for mismatches, spans under %%mpi --trace
    not_a_shell()
    engine_log_errors_only()
    comm = MPI.COMM_WORLD
    namespace.update(comm=comm, rank=comm.rank, size=comm.size, MPI=MPI)
    guard_world(MPI, namespace)
    return identity()


def large_tensors_in_huge_pages():
    """torch's CPU tensors of 2 MB and more in the kernel's transparent huge pages, as numpy's arrays of 4 MB and
    more already are: MPI reads and writes a tensor's memory through fewer page-table entries (16 MB through
    ``MPI.Allreduce`` between 2 ranks took 7.8 ms from torch's memory, 6.7 to 7.0 ms from numpy's, and 6.5 ms with
    this). torch reads ``THP_MEM_ALLOC_ENABLE`` at its first allocation, so it is set before the user's code runs;
    one the user set is kept (``THP_MEM_ALLOC_ENABLE=0`` turns it off)."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def not_a_shell():
    """A rank is a process MPI started, not an interactive shell: the prompts IPython's engine set (``sys.ps1``,
    which "scripts can use to decide if they are running interactively") go, so that training code which asks
    (Lightning's ``_IS_INTERACTIVE``, which refuses ``strategy="ddp"`` in a shell) runs as under ``mpiexec``."""
    import sys

    for name in ("ps1", "ps2", "ps3"):
        if hasattr(sys, name):
            delattr(sys, name)


def engine_log_errors_only():
    """ipyparallel's engine logs its heartbeat warnings (``No heartbeat in the last 600 ms``) whenever its controller
    is slow to ping, as on a busy machine, and they came out in the user's cells as the rank's output: the engine is
    mpinb's machinery, whose liveness mpinb watches and reports itself. Its log keeps its errors only."""
    import logging

    from ipyparallel.engine.app import IPEngine

    if IPEngine.initialized():
        IPEngine.instance().log.setLevel(logging.ERROR)


def share_cores(comm, threads=0):
    """Set each math library's thread count for this rank (see :func:`init_world`); return it, or ``None``."""
    if threads < 0:
        return None
    if threads == 0:
        from mpi4py import MPI

        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        ranks_here = local.size
        local.Free()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = max(1, cores // ranks_here)
    for name in THREAD_VARIABLES:
        os.environ.setdefault(name, str(threads))
    threads = int(os.environ["OMP_NUM_THREADS"])
    import sys

    if "torch" in sys.modules:  # read its variable at import: already imported, it is told directly
        sys.modules["torch"].set_num_threads(threads)
    return threads


def identity():
    """This rank's place in the world: rank, size, host, pid (and its launcher's, the process mpiexec started and
    names when it ends) and the MPI library in use."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    return {
        "rank": comm.rank,
        "size": comm.size,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "parent": os.getppid(),
        "mpi": " ".join(MPI.Get_library_version().replace("\0", " ").split("\n")[0].split()),  # Open MPI ends in NUL
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or None,
    }
