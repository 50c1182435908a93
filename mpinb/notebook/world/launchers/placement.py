"""Where a world's ranks run, as the user asked it (everything ``%mpi start`` takes beyond ``-n``), and the
launcher that does it (``registry.py``)."""

import os
from dataclasses import dataclass

from ....errors import BadArguments
from .base import OPTIONS, is_this_host
from .registry import batch_names, resolve


@dataclass
class Placement:
    """How and where to start a world's ranks (everything ``%mpi start`` takes beyond ``-n``).

    Parameters
    ----------
    launcher : str, default ``"mpi"``
        ``mpi``: ``mpiexec`` on this host (with *hostfile*, also on the hosts listed there). ``ssh``: the same,
        with *hostfile* required: mpiexec reaches its hosts over ssh. ``slurm``, ``pbs``, ``sge``, ``lsf``: a
        batch job of N tasks that runs ``mpiexec`` inside its allocation. A package may add more through the
        ``mpinb.launchers`` entry points (:class:`~mpinb.notebook.world.launchers.Launcher`).
    hostfile : str, optional
        Hosts for ``mpiexec`` (``mpiexec --hostfile``: one host per line, ``host:slots`` for MPICH).
    partition, time, account : str, optional
        The job's partition (queue), time limit (``HH:MM:SS``) and account, for a batch launcher.
    scheduler_args : list of str, default ``[]``
        More directives for the job script, each as on the command line (``--gres=gpu:1``, ``-l mem=4gb``).
    """

    launcher: str = "mpi"
    hostfile: str = None
    partition: str = None
    time: str = None
    account: str = None
    scheduler_args: tuple = ()

    def __post_init__(self):
        self.launcher = (self.launcher or "mpi").lower()
        self.scheduler_args = list(self.scheduler_args or ())
        kind = resolve(self.launcher)
        if self.hostfile:
            self.hostfile = os.path.abspath(os.path.expanduser(self.hostfile))
            if not os.path.isfile(self.hostfile):
                raise BadArguments(f"hostfile not found: {self.hostfile}")
        kind(self).validate()
        asked = [name for name in OPTIONS if getattr(self, name) and name not in kind.options]
        if asked:
            raise BadArguments(f"{', '.join(asked)} only mean something to a batch launcher "
                               f"(--launcher {'|'.join(batch_names())}), not to {self.launcher!r}")

    def start(self):
        """A new :class:`~mpinb.notebook.world.launchers.Launcher` of this placement: a world holds one."""
        return resolve(self.launcher)(self)

    @property
    def batch(self):
        """Whether the ranks run in a batch job."""
        return resolve(self.launcher).batch

    def describe(self, job_id=None):
        """How the ranks were placed, for ``%mpi status`` (``""`` for plain mpiexec here)."""
        return self.start().describe(job_id)

    def hostfile_args(self):
        """``mpiexec``'s arguments for the hostfile, if any."""
        return ["--hostfile", self.hostfile] if self.hostfile else []

    def remote_hosts(self):
        """Hosts of *hostfile* other than this one (their ranks need a controller they can reach)."""
        if not self.hostfile:
            return []
        hosts = []
        with open(self.hostfile) as listing:
            for line in listing:
                host = line.split("#")[0].strip().split(":")[0].split()[:1]
                if host and not is_this_host(host[0]):
                    hosts.append(host[0])
        return hosts
