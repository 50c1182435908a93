"""Launchers by name: mpinb's own, and those other packages add through the ``mpinb.launchers`` entry points
(``toy = toy_launcher:Toy``, read when a name is looked up, so a package installed meanwhile is found)."""

from importlib.metadata import entry_points

from ....errors import BadArguments
from .base import Launcher
from .batch import GridEngine, Lsf, Pbs
from .local import Mpiexec, Ssh
from .slurm import Slurm

GROUP = "mpinb.launchers"
OWN = {kind.name: kind for kind in (Mpiexec, Ssh, Slurm, Pbs, GridEngine, Lsf)}
# ipyparallel launchers that start engines one by one: they cannot make one MPI world
NOT_MPI = ("local", "sshproxy", "winhpc", "htcondor", "batch")


def names():
    """Every launcher's name: mpinb's own, then the entry points'."""
    return tuple(OWN) + tuple(sorted({point.name for point in entry_points(group=GROUP)} - set(OWN)))


def batch_names():
    """The names of mpinb's own batch launchers."""
    return tuple(name for name, kind in OWN.items() if kind.batch)


def resolve(name):
    """The :class:`Launcher` class called *name*; ``BadArguments`` saying which there are when none is."""
    if name in OWN:
        return OWN[name]
    if name in NOT_MPI:
        raise BadArguments(f"ipyparallel's {name!r} launcher starts engines one by one, so they would not form "
                           f"one MPI world; use one of: {', '.join(names())}")
    for point in entry_points(group=GROUP, name=name):
        kind = point.load()
        if not (isinstance(kind, type) and issubclass(kind, Launcher)):
            raise BadArguments(f"the {GROUP} entry point {name!r} ({point.value}) is not a Launcher class")
        return kind
    raise BadArguments(f"unknown launcher {name!r}; choose one of: {', '.join(names())}")
