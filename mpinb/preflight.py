"""Checks made before launching a world, each failing with a message that says what to install or set."""

import functools
import os
import shutil
import subprocess
import sys

from IPython.core.error import UsageError

_PROBE = "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_library_version())"


def default_mpiexec():
    """The ``mpiexec`` installed beside this Python (the ``mpich`` wheel puts it there), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec") or "mpiexec"


def find_mpiexec(mpiexec=None):
    """Absolute path of *mpiexec* (a name or a path; ``None`` or ``""`` for the default), or a ``UsageError``."""
    wanted = mpiexec or default_mpiexec()
    found = shutil.which(os.path.expanduser(wanted))
    if found is None:
        raise UsageError(
            f"mpiexec not found: {wanted!r}.\n"
            "Install an MPI in this environment (pip install mpich, or conda install -c conda-forge mpich), "
            "or point mpinb at a system MPI: %mpi start --mpiexec /path/to/mpiexec, "
            "or %config MPIMagics.mpiexec = '/path/to/mpiexec'."
        )
    return os.path.abspath(found)


@functools.lru_cache(maxsize=8)
def mpi_library(python=sys.executable):
    """The MPI library mpi4py loads under *python*, as MPI reports it; a ``UsageError`` if it cannot load one."""
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"could not run {python} to check mpi4py: {exc}") from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise UsageError(
            f"mpi4py cannot load an MPI library in {python}:\n{tail}\n"
            "Install mpi4py with an MPI (pip install mpi4py mpich), or build mpi4py against your system MPI "
            "(env MPICC=/path/to/mpicc pip install --no-binary=mpi4py mpi4py)."
        )
    return done.stdout.strip().splitlines()[0]
