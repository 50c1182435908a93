"""An mpi4py communicator for ``%mpi who``: described and hashed by its name and size (a handle does not pickle,
and its address means nothing on another rank)."""

import sys

from .digests import hasher, short
from .text import clip


def is_comm(value):
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and isinstance(value, mpi.Comm)


def describe_comm(comm, entry):
    """*entry* for *comm*: its name and size in words, and a digest of them."""
    mpi = sys.modules["mpi4py.MPI"]
    if comm == mpi.COMM_NULL:
        entry["summary"], entry["hash"] = "COMM_NULL", short(hasher(entry["type"], "COMM_NULL"))
        return
    name, size = comm.Get_name(), comm.Get_size()
    entry["summary"] = clip(f"{name or 'unnamed'}, size {size}")
    entry["hash"] = short(hasher(entry["type"], name, size))
