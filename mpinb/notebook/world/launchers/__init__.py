"""Where a world's ranks run: one class per launcher (``mpiexec`` here or over ssh, a Slurm, PBS, Grid Engine or LSF
job, or one a package adds through the ``mpinb.launchers`` entry points), each owning how the ranks start, what is
watched while they run and what is ended when they stop; and the user's :class:`Placement` of them."""

from .base import Launcher, is_this_host
from .local import Mpiexec, Ssh
from .batch import SCHEDULERS, Scheduler
from .placement import Placement
from .registry import GROUP, names, resolve

LAUNCHERS = names()  # those there are when mpinb is imported: the choices %mpi start and its %config name

__all__ = ["GROUP", "LAUNCHERS", "SCHEDULERS", "Launcher", "Mpiexec", "Placement", "Scheduler", "Ssh", "is_this_host",
           "names", "resolve"]
