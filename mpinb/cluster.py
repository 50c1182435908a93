"""Start, stop, restart and inspect one MPI world: ipyparallel engines launched by a single ``mpiexec``."""

import atexit
import logging
import os
import signal
import socket
import sys
import tempfile
import time
import weakref

import psutil
from IPython.core.error import UsageError

from .channel import Channel
from .errors import MPIError
from .gather import Receiver
from .preflight import find_mpiexec, mpi_library
from .rank import agent
from .rank import world as rank_world
from .reaper import end_processes, remove_world_files, signal_all

log = logging.getLogger("mpinb")

_live_worlds = weakref.WeakSet()

# Keep MPI's own traffic on loopback too (libfabric's tcp/sockets providers, UCX), unless asked otherwise.
LOOPBACK_ENV = {"FI_TCP_IFACE": "lo", "FI_SOCKETS_IFACE": "lo", "UCX_NET_DEVICES": "lo"}


class World:
    """An MPI world of ``size`` ranks, one ipyparallel engine per rank, all under one ``mpiexec``.

    Parameters
    ----------
    size : int
        Number of MPI ranks (``mpiexec -n size``).
    mpiexec : str, default: the ``mpiexec`` beside this Python, else the one on PATH
        Name or path of the launcher; point it at a system MPI (Open MPI, Intel MPI) to use that MPI.
    mpiexec_args : list of str, default ``[]``
        Extra arguments for ``mpiexec``, e.g. ``["--oversubscribe"]`` for Open MPI.
    ip : str, default ``"127.0.0.1"``
        Address the controller listens on. Loopback keeps the world private to this machine.
    heartbeat_ms : int, default 500
        Controller ↔ engine heartbeat period; registration completes on the first beat.
    start_timeout : float, default 60
        Seconds to wait for every rank to register before giving up (and stopping what started).
    progress : bool, default True
        Show a progress bar while ranks come up.

    Example
    -------
    >>> world = World(2).start()
    >>> world.ranks
    [0, 1]
    >>> world.stop()
    """

    def __init__(self, size, *, mpiexec=None, mpiexec_args=(), ip="127.0.0.1", heartbeat_ms=500,
                 start_timeout=60.0, progress=True):
        if int(size) < 1:
            raise UsageError(f"a world needs at least 1 rank, not {size}")
        self.size = int(size)
        self.mpiexec = mpiexec
        self.mpiexec_args = list(mpiexec_args)
        self.ip = ip
        self.heartbeat_ms = int(heartbeat_ms)
        self.start_timeout = float(start_timeout)
        self.progress = progress
        self.cluster = None
        self.client = None
        self.channel = None
        self.engines = {}  # rank -> engine id
        self.identities = {}  # rank -> {"rank", "size", "host", "pid", "mpi"}
        self.started_at = None
        self.receiver = None  # readers of the ranks' shared-memory arenas (--gather)
        self.stack_files = {}  # rank -> file its stacks are dumped to on SIGUSR2
        self.status_dir = None  # where each rank's launcher writes how its engine ended
        self._reaper = None
        self._processes = []
        self._shared_files = set()

    # ------------------------------------------------------------------ lifecycle

    @property
    def running(self):
        return self.cluster is not None and self.client is not None

    @property
    def ranks(self):
        return sorted(self.engines)

    def start(self):
        """Launch the controller and ``mpiexec -n size`` engines; return ``self`` once every rank answers.

        ipyparallel picks free ports before the processes bind them, so on a busy machine another connection
        can take one in between ("Address already in use"); such a start is retried once with new ports.
        """
        try:
            return self._start()
        except MPIError as exc:
            if "Address already in use" not in str(exc):
                raise
            log.warning("a port was taken while the world started; starting again with new ports")
            return self._start()

    def _start(self):
        import ipyparallel as ipp
        from traitlets.config import Config

        mpiexec = find_mpiexec(self.mpiexec)
        mpi_library(sys.executable)
        config = Config()
        config.MPILauncher.mpi_cmd = [mpiexec]
        config.MPILauncher.mpi_args = self.mpiexec_args
        # each rank runs its engine under a parent that records how it ended (rank/launch.py)
        config.MPIEngineSetLauncher.engine_cmd = [sys.executable, "-m", "mpinb.rank.launch"]
        self.status_dir = tempfile.mkdtemp(prefix="mpinb-world-")
        environment = {"MPINB_STATUS_DIR": self.status_dir}
        if self.ip.startswith("127.") or self.ip == "localhost":
            environment.update(LOOPBACK_ENV)
        config.MPIEngineSetLauncher.environment = environment
        self.cluster = ipp.Cluster(
            engines="mpi",
            n=self.size,
            controller_ip=self.ip,
            controller_args=[f"--HeartMonitor.period={self.heartbeat_ms}", "--HubFactory.db_class=NoDB"],
            delay=0,
            shutdown_atexit=False,
            log_level=logging.WARNING,
            config=config,
        )
        _live_worlds.add(self)
        try:
            self.cluster.start_controller_sync()
            self.cluster.start_engines_sync(self.size)
            self.client = self.cluster.connect_client_sync()
            self._wait_for_engines()
            self._processes = self._launched_processes()
            self._start_reaper()
            everyone = self.client.direct_view(targets=list(self.client.ids))
            self._learn_ranks(everyone)
            self._shared_files = self._mapped_shared_files()
            self._open_channel(everyone)
        except BaseException:
            self.stop()
            raise
        # from now on mpinb reports what happens to the ranks itself; ipyparallel would add a warning with every
        # engine's start-up log whenever mpiexec ends non-zero (a rank died, or the world was stopped)
        self.cluster.log.setLevel(logging.ERROR)
        self.started_at = time.time()
        return self

    def stop(self, *, kill=False):
        """Stop every process this world started; those that do not exit in time are killed by pid.

        *kill* kills the ranks at once (they are known to be stuck, so waiting for them is pointless).
        """
        cluster, client, channel = self.cluster, self.client, self.channel
        self.cluster = self.client = self.channel = None
        if channel is not None:
            channel.close()
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None
        processes = self._processes or (self._launched_processes(cluster) if cluster is not None else [])
        self._shared_files |= self._mapped_shared_files(processes)  # ranks still alive map them now
        if cluster is not None:
            cluster.log.setLevel(logging.ERROR)  # also for a world that failed to start: mpinb said why
        if kill:
            controller = getattr(getattr(cluster, "controller", None), "pid", None)
            signal_all([process for process in processes if process.pid != controller], "kill")
        if client is not None:
            client.close()
        if cluster is not None:
            try:
                cluster.stop_cluster_sync()
            except Exception as exc:  # noqa: BLE001 - a half-dead world must still be cleaned up
                log.warning("stopping the cluster reported: %s", exc)
        end_processes(processes, grace=5)
        self._remove_shared_files()
        if self._reaper is not None:
            self._reaper.kill()
            self._reaper.wait(timeout=5)
            self._reaper = None
        # also the files of ranks that never said hello (their pids are known all the same)
        remove_world_files(self.status_dir, [process.pid for process in processes], self.stack_files.values())
        self.status_dir = None
        self.stack_files = {}
        self._processes = []
        self.engines = {}
        _live_worlds.discard(self)

    def restart(self, size=None, *, kill=False):
        """Stop this world and start a fresh one (same size unless *size* is given); returns ``self``."""
        self.stop(kill=kill)
        if size is not None:
            self.size = int(size)
        return self.start()

    # ------------------------------------------------------------------ use

    def interrupt(self, ranks=None):
        """Send SIGINT to *ranks*: by pid when they run on this host, else through ipyparallel."""
        ranks = self.ranks if ranks is None else list(ranks)
        local = self._local(ranks)
        for rank in local:
            try:
                os.kill(self.identities[rank]["pid"], signal.SIGINT)
            except ProcessLookupError:
                pass
        remote = [self.engines[rank] for rank in ranks if rank not in local]
        if remote:
            self.client.send_signal(signal.SIGINT, targets=remote, block=False)

    def launcher_output(self):
        """What mpiexec printed so far (Hydra's reports of failed processes among it)."""
        texts = []
        for launcher in (self.cluster.engines.values() if self.cluster is not None else ()):
            path = getattr(launcher, "output_file", "")
            if path and os.path.exists(path):
                with open(path, errors="replace") as output:
                    texts.append(output.read())
        return "\n".join(texts)

    def on_this_host(self, ranks=None):
        """Whether *ranks* (default: all) run on the notebook's host, so they can share memory with it."""
        ranks = self.ranks if ranks is None else list(ranks)
        return len(self._local(ranks)) == len(ranks)

    def dead_ranks(self, ranks=None):
        """Ranks among *ranks* whose engine process on this host has exited."""
        local = self._local(self.ranks if ranks is None else ranks)
        return [rank for rank in local if not psutil.pid_exists(self.identities[rank]["pid"])]

    def _local(self, ranks):
        """Those of *ranks* that run on the notebook's host (their pids mean something here)."""
        here = socket.gethostname()
        return [rank for rank in ranks if self.identities.get(rank, {}).get("host") == here]

    def status(self):
        """One row per rank: ``{"rank", "host", "pid", "state"}``, state being idle, busy or dead."""
        queues = {}
        alive_ids = set(self.client.ids) if self.running else set()
        if self.running and self._controller_alive():
            queues = self.client.queue_status(targets=[e for e in self.engines.values() if e in alive_ids])
        rows = []
        dead = set(self.dead_ranks())
        for rank in self.ranks:
            who = self.identities[rank]
            eid = self.engines[rank]
            if eid not in alive_ids or rank in dead:
                state = "dead"
            else:
                state = "busy" if queues.get(eid, {}).get("queue", 0) else "idle"
            rows.append({"rank": rank, "host": who["host"], "pid": who["pid"], "state": state})
        return rows

    def describe(self):
        """A one-line summary: size, MPI library, mpiexec."""
        if not self.engines:
            return "no MPI world is running"
        mpi = self.identities[self.ranks[0]]["mpi"]
        return f"MPI world of {self.size} rank{'s' if self.size != 1 else ''} ({mpi}) via {find_mpiexec(self.mpiexec)}"

    # ------------------------------------------------------------------ internals

    def _wait_for_engines(self):
        from tqdm.auto import tqdm

        deadline = time.monotonic() + self.start_timeout
        bar = tqdm(total=self.size, desc="starting MPI ranks", unit="rank", leave=False, mininterval=0.25,
                   disable=not self.progress)
        try:
            while True:
                up = len(self.client.ids)
                if up > bar.n:
                    bar.update(up - bar.n)
                if up >= self.size:
                    return
                self._check_launchers()
                if time.monotonic() > deadline:
                    raise MPIError(
                        f"only {up} of {self.size} ranks registered within {self.start_timeout:g} s; "
                        f"raise %config MPIMagics.start_timeout or check the mpiexec output:\n{self._launcher_output()}"
                    )
                time.sleep(0.02)
        finally:
            bar.close()

    def _check_launchers(self):
        for name, launcher in [("controller", self.cluster.controller), *self.cluster.engines.items()]:
            process = getattr(launcher, "process", None)
            if process is not None and not _is_alive(process):
                what = "the ipyparallel controller" if name == "controller" else "mpiexec"
                raise MPIError(f"{what} exited while the world was starting:\n{self._launcher_output()}")

    def _launcher_output(self):
        chunks = []
        for launcher in [self.cluster.controller, *self.cluster.engines.values()]:
            try:
                text = launcher.get_output()
            except Exception:  # noqa: BLE001 - output is a courtesy; the error is raised anyway
                text = ""
            if text:
                chunks.append("\n".join(text.strip().splitlines()[-20:]))
        return "\n".join(chunks) or "(no output)"

    def _launched_processes(self, cluster=None):
        cluster = cluster or self.cluster
        processes = []
        for launcher in [cluster.controller, *cluster.engines.values()]:
            process = getattr(launcher, "process", None)
            if process is None:
                continue
            try:
                processes.append(process)
                processes.extend(process.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        return processes

    def _open_channel(self, view):
        self.channel = Channel(self.ip)
        self.receiver = Receiver()
        view.apply_sync(agent.start, cells=self.channel.cells_url, events=self.channel.events_url,
                        key=self.channel.key)
        self.stack_files = self.channel.wait_for_ranks(self.ranks, timeout=self.start_timeout)

    def _start_reaper(self):
        """A watcher that ends this world's processes if this process dies without stopping it (rank/reaper)."""
        import subprocess

        items = []
        for process in self._processes:
            try:
                items.append(f"{process.pid}:{process.create_time()}")
            except psutil.NoSuchProcess:
                pass
        self._reaper = subprocess.Popen([sys.executable, "-m", "mpinb.reaper", str(os.getpid()), self.status_dir, *items],
                                        start_new_session=True, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _mapped_shared_files(self, processes=None):
        """Shared-memory files the ranks here have mapped (MPI's own segments among them)."""
        files = set()
        for process in self._processes if processes is None else processes:
            try:
                maps = process.memory_maps()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            files.update(m.path for m in maps if m.path.startswith("/dev/shm/") and not m.path.endswith("(deleted)"))
        return files

    def _remove_shared_files(self):
        """MPI removes its segments at MPI_Finalize; a rank that died cannot, so what is left once every process
        of the world is gone is removed here (only files these ranks had mapped)."""
        for path in self._shared_files:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._shared_files = set()

    def _controller_alive(self):
        process = getattr(self.cluster.controller, "process", None)
        return process is None or _is_alive(process)

    def _learn_ranks(self, view):
        replies = view.apply_async(rank_world.init_world).get(timeout=self.start_timeout)
        sizes = {who["size"] for who in replies}
        ranks = sorted(who["rank"] for who in replies)
        if sizes != {self.size} or ranks != list(range(self.size)):
            raise MPIError(
                f"mpiexec started {len(replies)} processes but MPI sees world sizes {sorted(sizes)}: this mpiexec "
                "does not belong to the MPI library mpi4py was built with. Use the mpiexec of that MPI "
                "(%mpi start --mpiexec PATH), or rebuild mpi4py against this one."
            )
        self.engines = {who["rank"]: eid for eid, who in zip(view.targets, replies)}
        self.identities = {who["rank"]: who for who in replies}


def _is_alive(process):
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@atexit.register
def _stop_all_worlds():
    for world in list(_live_worlds):
        world.stop()
