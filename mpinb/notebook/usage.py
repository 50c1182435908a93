"""How the magics are used: ``%mpi``'s help, a magic's line split as a shell would, and mpinb's errors about what
was asked shown as IPython shows a magic's."""

import functools
import shlex

from IPython.core.error import UsageError

from ..errors import BadArguments, NoMPI
from .debug import visual_debugger

MPI_HELP = """Start, stop and inspect the MPI world.

Usage::

    %mpi start [-n N] [--mpi mpich|openmpi|impi|PATH] [--mpiexec PATH] [--mpiexec-arg ARG ...] [--ip ADDRESS]
               [--launcher {mpi,ssh,slurm,pbs,sge,lsf}] [--hostfile FILE]
               [--partition P] [--time HH:MM:SS] [--account A] [--scheduler-arg ARG ...]
    %mpi stop
    %mpi restart [-n N] [--fresh]
    %mpi status
    %mpi output
    %mpi metrics [--run NAME]
    %mpi grads MODEL
    %mpi view
    %mpi trace
    %mpi who
    %mpi stacks [RANKS]
    %mpi debug R [--panel]
    %mpi debug --rank R
    %mpi inject [KIND --rank R [--at N] [--delay S] [--scale X] | clear]
    %mpi run [-n N] [--timeout S] [--trace] FILE [ARGS ...]

``start`` launches N ranks (default ``MPIMagics.default_ranks``) with mpiexec, one ipyparallel engine
per rank; ``comm``, ``rank`` and ``size`` are predefined on each. ``--launcher slurm`` (or pbs, sge,
lsf) submits a batch job of N tasks that runs that mpiexec inside its allocation; ``%mpi stop`` cancels
it. Ranks on other hosts need ``--ip``: the controller listens on loopback unless told otherwise.
``restart`` gives new processes, of a new size with ``-n``, and every rank's variables come back as of
the last cell every rank finished (``--fresh``: none), after a rank died (a segfault, kill -9,
``MPI_Abort``) too, and what could not be kept is listed. ``status`` lists rank, host, pid and
state. ``output`` shows the last cell's output rank by rank. ``metrics`` shows the charts and per-rank
table of everything ``mpinb.report()`` sent in this world (``mpinb.metrics()`` gives it as a DataFrame).
``grads MODEL`` compares a ``torch.nn.Module`` across ranks: per layer, each rank's gradient norm and
the largest difference of gradients and weights to rank 0's, flagging the layers where ranks disagree.
``view`` makes the world's ipyparallel view (``mpinb.view()``) the one ``%px`` runs on.
``trace`` shows the timeline and summary of the last ``%%mpi --trace`` cell again (``mpinb.trace()``
gives it as a DataFrame). ``who`` lists every name on the ranks, flagging those that differ. ``stacks``
shows where each rank is, its Python frames merged with its native ones (py-spy's, when installed: the
MPI call, gloo's allreduce, the lock it waits on), one line each naming the place. ``debug R`` opens pdb
in rank R's last failed cell, its prompt answered in the notebook; ``breakpoint()`` in a cell opens the
same prompt for the rank that reaches it. With JupyterLab's debugger switched on, breakpoints clicked in
a ``%%mpi`` cell stop the ranks, and the panel shows rank 0 (``debug --rank R``: rank R);
``debug R --panel`` shows rank R's last failed cell there. ``inject`` plants a fault on rank R for
teaching, acted on at its collectives (``straggler``, ``kill``, ``stall``, ``nan``, ``perturb``;
``--at N``: its Nth collective from now); alone it lists them, ``clear`` removes them. ``run FILE
ARGS`` runs a script on every rank as ``__main__`` with ``sys.argv`` set, as ``mpiexec python FILE
ARGS`` would, as a cell (its output, errors, Stop), its globals kept for the next cell.
The world stops with the kernel.

Examples
--------
::

    In [1]: %load_ext mpinb
    In [2]: %mpi start -n 4
    MPI world of 4 ranks started in 2.6 s (MPICH Version: 5.0.2)
    In [3]: %mpi status
    MPI world of 4 ranks (MPICH Version: 5.0.2) via /env/bin/mpiexec
    rank  host  pid    state
       0  vm    81512  idle
    ...
    In [4]: %mpi start --mpi openmpi
    In [5]: %mpi stop
    In [6]: %mpi start -n 64 --launcher slurm --partition gpu --time 1:00:00 --ip 0.0.0.0
"""


def helped(text):
    """The method it decorates, with *text* as its docstring: the help ``%mpi?`` shows and the reference pages
    read."""
    def documented(method):
        method.__doc__ = text
        return method
    return documented


def usage_errors(method):
    """*method* with mpinb's errors about what was asked (bad arguments, no usable MPI) shown as IPython shows a
    magic's: a one-line ``UsageError``; the kernel's own debugger never stops in it (the user's code runs on the
    ranks, where the debugger panel follows it)."""
    @functools.wraps(method)
    def shown(*args, **kwargs):
        try:
            with visual_debugger.kernel_untraced():
                return method(*args, **kwargs)
        except (BadArguments, NoMPI) as exc:
            raise UsageError(str(exc)) from None
    return shown


def split(line, magic):
    """*line* split as a shell would; unbalanced quotes are a ``UsageError``."""
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"{magic} {line}: {str(exc).lower()} (close the quote, or escape it with \\)") from None
