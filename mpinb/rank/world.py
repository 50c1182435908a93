"""Rank-side set-up of a world: predefine ``comm``, ``rank``, ``size`` and report who we are."""

import os
import socket


def init_world(namespace=None):
    """Put ``comm``, ``rank`` and ``size`` into *namespace* and return this rank's identity.

    *namespace* defaults to the IPython user namespace of the engine this runs in.
    """
    from mpi4py import MPI

    if namespace is None:
        from IPython import get_ipython

        namespace = get_ipython().user_ns
    comm = MPI.COMM_WORLD
    namespace.update(comm=comm, rank=comm.rank, size=comm.size, MPI=MPI)
    return identity()


def identity():
    """This rank's place in the world: rank, size, host, pid and the MPI library in use."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    return {
        "rank": comm.rank,
        "size": comm.size,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "mpi": " ".join(MPI.Get_library_version().split("\n")[0].split()),
    }
