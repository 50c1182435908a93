"""Which of a world's ranks have ended: on the notebook's host, a read of each engine process's state; on other
hosts, what ipyparallel's hub says (or all of them, when the local mpiexec that ran them has exited)."""

import time

import psutil

from ...wire.ranks import label_ranks
from . import ipp
from .reaper import alive, has_ended


class Liveness:
    """The dead-rank checks of *world* (a :class:`~mpinb.notebook.world.cluster.World`, read only: its ``identities``,
    ``engines``, ``client``, ``cluster``, ``launcher`` and :meth:`local_ranks`)."""

    def __init__(self, world):
        self.world = world
        self.processes = {}  # rank -> psutil.Process of its engine on this host, made on first check
        self.checked = (None, set(), set())  # when dead_ranks last asked, about which ranks, which were dead

    def dead_ranks(self, ranks):
        """Ranks among *ranks* whose engine has ended: on this host, its process has exited; on another host,
        ipyparallel's hub unregistered it (its heartbeats stopped for ``HEARTBEAT_SILENCE_MS``: the
        process ended, or its host cannot be reached)."""
        dead = self.dead_here(ranks) + self.dead_elsewhere(ranks)
        self.checked = (time.monotonic(), set(ranks), set(dead))
        return sorted(dead)

    def dead_ranks_lately(self, ranks, within):
        """:meth:`dead_ranks`, read afresh on this host (a killed rank is known before the next cell is sent,
        however soon), and for ranks on other hosts what the hub said less than *within* seconds ago (cells run
        back to back do not ask it each time; a rank dying meanwhile is found by the cell's own checks)."""
        when, checked, dead = self.checked
        if when is not None and time.monotonic() - when < within and checked.issuperset(ranks) and not dead:
            return sorted(self.dead_here(ranks))
        return self.dead_ranks(ranks)

    def ended_with(self, dead, until):
        """*dead*, and those of the world's other ranks that end before the wall-clock time *until*: mpiexec ends
        the rest of a job once a rank died, which takes a moment (an engine whose cell holds its event loop is
        killed ``TERM_GRACE`` s after mpiexec's SIGTERM, ``rank/launch.py``). Returns once every rank has ended."""
        ranks = self.world.ranks
        while len(dead) < len(ranks) and time.time() < until:
            time.sleep(0.05)
            dead = sorted(set(dead) | set(self.dead_ranks(ranks)))
        return dead

    def dead_here(self, ranks):
        """Those of *ranks* on this host whose engine process has ended: one read of each process's state."""
        dead = []
        for rank in self.world.local_ranks(ranks):
            pid = self.world.identities[rank]["pid"]
            process = self.processes.get(rank)
            if process is None or process.pid != pid:
                try:
                    process = self.processes[rank] = psutil.Process(pid)
                except psutil.NoSuchProcess:
                    dead.append(rank)
                    continue
            if has_ended(process):
                dead.append(rank)
        return dead

    def dead_elsewhere(self, ranks):
        """Those of *ranks* on other hosts that ipyparallel's hub unregistered (or all of them, where the local
        mpiexec that ran them has exited)."""
        world = self.world
        local = set(world.local_ranks(ranks))
        remote = [rank for rank in ranks if rank not in local and rank in world.engines]
        if not remote or world.client is None:
            return []
        registered = set(world.client.ids)  # reads the hub's unregistration notices first
        gone = [rank for rank in remote if world.engines[rank] not in registered]
        # a node Slurm says is lost (its slurmd silent, the node down): its ranks may go on answering heartbeats
        # for long, cut off from the rest of the job, which Slurm ends; they are lost now
        hosts = {rank: world.identities.get(rank, {}).get("host") for rank in remote}
        lost = world.launcher.lost_hosts(sorted({host for host in hosts.values() if host}))
        gone += [rank for rank in remote if hosts[rank] in lost and rank not in gone]
        # Open MPI ends the whole job as soon as one rank dies, the engines' nannies with it: the hub
        # would hear of it only when the heartbeats stop, but the local mpiexec has exited by then
        return remote if len(gone) < len(remote) and self.launcher_ended() else gone

    def launcher_ended(self):
        """Whether an ``mpiexec`` this process started has exited: its ranks on other hosts are ended or cut off."""
        cluster = self.world.cluster
        processes = [ipp.process(launcher) for launcher in cluster.engines.values()] if cluster else []
        return any(process is not None and not alive(process) for process in processes)

    def dead_text(self):
        """``rank 1 died during In[4]`` (or ``ranks 0-1 died``) when some of the world's ranks are gone, else
        ``None``."""
        world = self.world
        dead = world.dead_ranks() if world.running else []
        if not dead:
            return None
        died_in = world.lifecycle.died_in
        during = f" during In[{died_in}]" if died_in is not None else ""
        return f"{label_ranks(dead)} died{during}"

    def silent_hosts(self):
        """Hosts other than this one all of whose ranks ipyparallel's hub unregistered (their heartbeats stopped)."""
        world = self.world
        if world.client is None:
            return set()
        try:
            registered = set(world.client.ids)
        except Exception:  # noqa: BLE001 - a client half gone: nothing known, so stop waits as usual
            return set()
        ranks = {}
        for rank in world.ranks:
            if world.is_remote(rank):
                ranks.setdefault(world.identities.get(rank, {}).get("host"), []).append(rank)
        return {host for host, on in ranks.items()
                if host and all(world.engines.get(rank) not in registered for rank in on)}
