"""What a launcher is to a world: the one place that knows how its ranks start somewhere, what is watched there
while they run, and what is left to end once they stop.

Every launcher starts the ranks with a single ``mpiexec -n N``, so they form one MPI world whatever starts them.
"""

import os
import signal
import socket


OPTIONS = ("partition", "time", "account", "scheduler_args")  # what a placement may ask beyond -n and a hostfile


class Launcher:
    """One way of starting a world's ranks; a world holds one, made from its
    :class:`~mpinb.notebook.world.launchers.Placement`, for all its starts.

    A package adds one by subclassing this and naming the class in its ``mpinb.launchers`` entry points
    (``toy = toy_launcher:Toy``); ``%mpi start --launcher toy`` then uses it. Every method has a default that suits
    ranks this kernel starts itself; a launcher that hands them to a scheduler overrides what the job changes.

    Attributes
    ----------
    name : str
        What ``--launcher`` calls it.
    batch : bool, default False
        The ranks run in a job a scheduler places, not as processes this kernel started.
    options : tuple of str, default ``()``
        Those of :data:`OPTIONS` it takes.
    """

    name = ""
    batch = False
    options = ()

    def __init__(self, placement):
        self.placement = placement

    # ------------------------------------------------------------------ before a start

    def validate(self):
        """Raise ``BadArguments`` for what the placement lacks that this launcher needs (a hostfile)."""

    def check(self):
        """Raise ``BadArguments`` when what the launcher runs is not here (a scheduler's submit command)."""

    @property
    def all_here(self):
        """Whether every rank runs on the notebook's host."""
        return not self.batch and not self.placement.hostfile

    def describe(self, job_id=None):
        """How the ranks were placed, for ``%mpi status`` (``""`` for plain mpiexec here)."""
        return f"hosts from {self.placement.hostfile}" if self.placement.hostfile else ""

    # ------------------------------------------------------------------ start

    def configure(self, config, *, mpiexec, mpiexec_args, engine_cmd, environment, workdir):
        """Fill ipyparallel's *config* so that one ``mpiexec`` (with *mpiexec_args*) starts *engine_cmd* on every
        rank with *environment*; return the engine launcher (name or class) for ``Cluster(engines=...)``.
        *workdir* is this start's own folder."""
        raise NotImplementedError

    def launched(self, job_id):
        """The ranks were launched (*job_id*: the batch job that holds them, else ``""``)."""

    def waiting(self, world, output):
        """While the ranks register, asked every half second: ``None`` when the launcher has nothing to say, or
        ``(text, queued)``: what the start waits for, and whether the ranks are not placed yet (the start's
        timeout counts from when they are). Raises ``MPIError`` or ``BadArguments`` when they never will be;
        *output* gives what the launcher printed."""
        return None

    def cancel_command(self):
        """The shell command that ends what this launcher started if the kernel dies (the reaper runs it), or
        ``None`` when ending the processes is enough."""
        return None

    # ------------------------------------------------------------------ while the ranks run

    def rank_processes(self, world):
        """Processes of *world*'s ranks on this host that this kernel did not start itself (``[]``: it started
        them all, under ``mpiexec``)."""
        return []

    def interrupt(self, world, ranks):
        """Send SIGINT to *world*'s *ranks*: by pid when they run on this host, else through ipyparallel."""
        local = world.local_ranks(ranks)
        for rank in local:
            try:
                os.kill(world.identities[rank]["pid"], signal.SIGINT)
            except ProcessLookupError:
                pass
        remote = [world.engines[rank] for rank in ranks if rank not in local]
        if remote:
            world.client.send_signal(signal.SIGINT, targets=remote, block=False)

    @property
    def watches_hosts(self):
        """Whether hosts that stopped answering matter to how the world stops (:meth:`stopped`)."""
        return False

    def lost_hosts(self, hosts, *, within=2.0):
        """``{host: why}`` for those of *hosts* the launcher knows are lost; asked at most every *within* s."""
        return {}

    def time_warning(self):
        """A warning that the ranks' time is nearly up, once; else ``None``."""
        return None

    def time_left(self):
        """How long the ranks may still run, for ``%mpi status`` (``""``: no limit)."""
        return ""

    def ended(self):
        """What ended the ranks when the launcher's side ended them (a time limit, a preemption), else ``""``."""
        return ""

    # ------------------------------------------------------------------ stop

    def stopped(self, *, unreachable=()):
        """The world's processes were stopped; *unreachable*: hosts whose ranks had all stopped answering."""


def is_this_host(host):
    """Whether *host* names this machine (its name, ``localhost``, or one of its addresses)."""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()) or host.startswith("127."):
        return True
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return False
    return address.startswith("127.") or address in _addresses()


def _addresses():
    import psutil

    return {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
