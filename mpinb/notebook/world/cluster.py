"""Start, stop, restart and inspect one MPI world: ipyparallel engines launched by a single ``mpiexec``, here or
inside a batch job (``launchers.py``)."""

import atexit
import logging
import socket
import tempfile
import time
import weakref

import psutil

from ...errors import BadArguments, MPIError, StartInterrupted
from ...wire.channel import Channel
from .. import stops
from . import ipp, leftovers, mpis
from .kept_state import KeptState
from .launchers import Placement
from .leftovers import Footprint
from .lifecycle import Lifecycle, State
from .liveness import Liveness
from .reaper import end_processes, remove_world_files, signal_all
from .startup import StartRace, Startup, heartbeat_period

log = logging.getLogger("mpinb")

_live_worlds = weakref.WeakSet()


RANK_MEMORY = 60 << 20  # what one rank's process holds before user code runs (measured: 55 MB unique, 93 MB RSS)


def check_size(size, placement=None):
    """*size* as an int if a world can have that many ranks; else ``BadArguments`` saying why and what to do.

    Ranks that all run on this host (no hostfile, no batch job) must fit in its available memory.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise BadArguments(f"-n takes a number of ranks, at least 1, not {size!r}")
    placement = placement or Placement()
    if not placement.batch and not placement.hostfile:
        available = psutil.virtual_memory().available
        if size * RANK_MEMORY > available:
            raise BadArguments(
                f"-n {size}: {size} ranks on this host would need about {_gigabytes(size * RANK_MEMORY)} of memory "
                f"before running anything (each rank is a Python process of about {RANK_MEMORY >> 20} MB), and "
                f"{_gigabytes(available)} is available; ask for at most {max(1, available // RANK_MEMORY)} ranks "
                "here, or spread them over hosts (--hostfile) or a batch job (--launcher slurm)"
            )
    return size


def _gigabytes(n):
    return f"{n / 1e9:.1f} GB" if n < 1e12 else f"{n / 1e12:.1f} TB"


class World:
    """An MPI world of ``size`` ranks, one ipyparallel engine per rank, all under one ``mpiexec``.

    Parameters
    ----------
    size : int
        Number of MPI ranks (``mpiexec -n size``).
    mpi : str, default: the MPI of *mpiexec*, else of the ``mpiexec`` beside this Python, else on PATH
        Which MPI: ``"mpich"``, ``"openmpi"``, ``"impi"`` (its launcher is looked for beside this Python and on
        PATH) or the path of an ``mpiexec``. The ranks' mpi4py loads the library installed with that launcher
        (``MPI4PY_LIBMPI``, set for the ranks only); a launcher and a library of different MPIs are refused
        before launch.
    mpiexec : str, optional
        Name or path of the launcher; its family is read from ``mpiexec --version``.
    mpi_library : str, optional
        The libmpi the ranks load, when it is not installed beside the launcher.
    mpiexec_args : list of str, default ``[]``
        Extra arguments for ``mpiexec``. Open MPI's ``--allow-run-as-root`` (as root) and ``--oversubscribe``
        (more ranks than cores here) are added by mpinb.
    placement : Placement, default ``Placement()`` (mpiexec on this host)
        Where the ranks run: ``Placement(launcher="slurm", partition="debug", time="00:30:00")`` submits a
        batch job of ``size`` tasks that runs ``mpiexec`` inside its allocation (see ``launchers.py``).
    ip : str, default ``"127.0.0.1"``
        Address the controller and the cell channel listen on. Loopback keeps the world private to this
        machine; ranks on other hosts need an address of this host they can reach (or ``"0.0.0.0"``: every
        interface). Whatever the address, every message is signed with the world's key and the connection
        files are readable by their owner only.
    heartbeat_ms : int, default ``heartbeat_period(size)``
        Controller ↔ engine heartbeat period: 100 ms up to 12 ranks, 8 ms per rank above, at most 500. A rank's
        registration completes on the first beat after it connects, so a short period starts worlds sooner
        (4 ranks: 2.2-2.4 s at 500 ms, 1.6-1.8 s at 100); a long one costs idle worlds less CPU (64 idle ranks:
        the controller and ranks use 16% of a core more at 100 ms than at 500). Whatever the period, a rank
        is given up after 3.5 s without heartbeats.
    start_timeout : float, default 60
        Seconds to wait for every rank to register before giving up (and stopping what started).
    progress : bool or callable, default True
        Say how each start goes (controller, ranks registered, connection): on stderr with ``True``, or through
        the :class:`mpinb.widgets.views.Progress` the callable returns for each start (the magics' shows in the
        notebook).
    threads : int, default 0
        Threads each rank's math libraries (OpenMP, BLAS, torch, TensorFlow) may use: 0 gives every rank an equal
        share of its host's cores (as ``torchrun`` does); a negative number leaves the libraries' defaults, which
        on a host shared by several ranks oversubscribe its cores.

    Example
    -------
    >>> world = World(2).start()
    >>> world.ranks
    [0, 1]
    >>> world.stop()
    """

    def __init__(self, size, *, mpi=None, mpiexec=None, mpi_library=None, mpiexec_args=(), placement=None,
                 ip="127.0.0.1", heartbeat_ms=None, start_timeout=60.0, progress=True, threads=0):
        self.placement = placement or Placement()
        self.kept_state = KeptState()  # every rank's snapshots, across this world's starts
        self.size = check_size(size, self.placement)
        self.mpiexec = mpiexec
        self.mpi_choice, self.mpi_library = mpi, mpi_library
        self.mpi = None  # the mpis.MPI resolved at start
        self.heartbeat_ms = None  # the period of the last start
        self.mpiexec_args = list(mpiexec_args)
        self.ip = ip
        self.loopback = ip.startswith("127.") or ip == "localhost"
        self.launcher = self.placement.start()  # what starts the ranks where they run, and watches them there
        self.heartbeat_choice = heartbeat_ms  # None: heartbeat_period(size) at each start
        self.start_timeout = float(start_timeout)
        self.progress = progress
        self._line = None  # the Progress of a start under way
        self.threads = int(threads)
        self.cluster = None
        self.client = None
        self.channel = None
        self.engines = {}  # rank -> engine id
        self.identities = {}  # rank -> {"rank", "size", "host", "pid", "mpi"}
        self.started_at = None
        self.stack_files = {}  # rank -> file its stacks are dumped to on SIGUSR2
        self.status_dir = None  # where each rank's launcher writes how its engine ended
        self._prepared_at = 0.0  # when this start's status folder was made (leftovers.marked)
        self.lifecycle = Lifecycle()  # its state (starting, idle, running, ...), why it last ended, and when it died
        self.warned = set()  # what was said once about this world's ranks (replicas that drifted apart)
        self.liveness = Liveness(self)  # which ranks have ended
        self.footprint = Footprint()  # what it started on this host and would leave there

    # ------------------------------------------------------------------ lifecycle

    @property
    def running(self):
        return self.cluster is not None and self.client is not None

    @property
    def ranks(self):
        return sorted(self.engines)

    @property
    def died_in(self):
        """The In[N] a rank of this world died during, once one did (``None`` before)."""
        return self.lifecycle.died_in

    @property
    def state(self):
        """Where the world is in its lifecycle (``lifecycle.State``): stopped, starting, idle, running,
        recovering, stopping or dead."""
        return self.lifecycle.state

    def start(self):
        """Launch the controller and ``mpiexec -n size`` engines; return ``self`` once every rank answers.

        ipyparallel picks free ports before the processes bind them, so on a busy machine another connection
        can take one in between ("Address already in use"); such a start is retried once with new ports.
        """
        try:
            return self._start()
        except StartRace as race:
            log.warning("%s; starting again", race.reason)
            return self._start()

    def _start(self):
        self.lifecycle.move(State.STARTING)
        self.lifecycle.died_in = None
        try:
            Startup(self).run()  # a failed start stops what it launched (the world is stopped)
        except StartInterrupted:
            self.lifecycle.ended = "its start was interrupted"
            raise
        self.kept_state.came_up()
        self.started_at = time.time()
        self.lifecycle.move(State.IDLE)
        self.lifecycle.ended = None
        return self

    # ------------------------------------------------------------------ a start's parts (startup.py)
    # Startup hands each part over as soon as it is made: a start that fails or is stopped half-way is rolled
    # back by stop(), which ends whatever the world holds.

    def resolve_mpi(self):
        """The MPI this start launches (``mpis.MPI``): the one asked for, else the one found (``mpis.resolve``)."""
        self.mpi = mpis.resolve(self.mpi_choice, self.mpiexec, self.mpi_library)
        return self.mpi

    def prepare(self):
        """This start's heartbeat period, and the folder its ranks' launchers write how each engine ended in
        (removed at stop)."""
        self.heartbeat_ms = int(self.heartbeat_choice or heartbeat_period(self.size))
        self.status_dir = tempfile.mkdtemp(prefix="mpinb-world-")
        self._prepared_at = time.time() - 1.0  # before anything of this start runs (start times are rounded)

    def launching(self, cluster):
        """This start's ipyparallel *cluster*, configured, nothing launched yet: from now on the world is stopped
        when the kernel exits."""
        self.cluster = cluster
        _live_worlds.add(self)

    def launched(self):
        """The controller and ``mpiexec`` (or the batch job) are launched: a reaper watches their processes at
        once, so that a killed kernel leaves nothing, also while the ranks register."""
        self.launcher.launched(self.job_id() or "")
        self.footprint.watch(ipp.launched_processes(self.cluster), self.status_dir,
                             cancel=self.launcher.cancel_command(), kept_state=self.kept_state)

    def connect_client(self):
        """ipyparallel's client of the controller, once it wrote its connection files."""
        self.client = self.cluster.connect_client_sync()
        return self.client

    def registered(self, engines, identities):
        """Every rank registered and was told its rank: *engines* ``{rank: engine id}``, *identities* ``{rank:
        who}``. The reaper now watches the ranks' processes too, and the shared memory they mapped is noted
        (removed at stop if a rank that died left it)."""
        self.engines, self.identities = engines, identities
        self.footprint.registered(ipp.launched_processes(self.cluster) + self.launcher.rank_processes(self))
        self.footprint.watch(self.footprint.processes, self.status_dir,  # again, watching what started since too
                             cancel=self.launcher.cancel_command(), kept_state=self.kept_state)

    def open_channel(self, secret):
        """The cell channel to the ranks, its messages signed with *secret* (``None``: encrypted instead)."""
        self.channel = Channel(self.ip, secret=secret)
        return self.channel

    def connected(self, stack_files):
        """Every rank's agent is connected to the channel; *stack_files* ``{rank: path}`` is where each dumps its
        stacks on SIGUSR2."""
        self.stack_files = stack_files

    @property
    def processes(self):
        """The processes this world started that run while it does (the controller, ``mpiexec`` and what it
        started, the engines, a batch job's ranks on this host), as ``psutil.Process``; empty once stopped."""
        return list(self.footprint.processes)

    # ------------------------------------------------------------------ stop

    def stop(self, *, kill=False):
        """Stop every process this world started, and every process they started on this host (detached from their
        session or not); those that do not exit in time are killed by pid.

        *kill* kills the ranks at once (they are known to be stuck, so waiting for them is pointless). A Stop
        (SIGINT) meanwhile waits for it: a stop cut half-way would leave processes nobody can end.
        """
        with stops.deferred():
            self.lifecycle.move(State.STOPPING)
            try:
                self._stop(kill)
            finally:
                self.lifecycle.move(State.STOPPED)

    def _stop(self, kill):
        silent = self.liveness.silent_hosts() if self.launcher.watches_hosts else set()
        cluster, client, channel = self.cluster, self.client, self.channel
        self.cluster = self.client = self.channel = None
        if channel is not None:
            channel.close()
        processes = self.footprint.processes or (ipp.launched_processes(cluster) if cluster is not None else [])
        self.footprint.note_shared_files(processes)  # ranks still alive map them now
        if cluster is not None:
            cluster.log.setLevel(logging.ERROR)  # also for a world that failed to start: mpinb said why
        if kill:
            controller = ipp.process(cluster.controller) if cluster is not None else None
            signal_all([p for p in processes if controller is None or p.pid != controller.pid], "kill")
        if client is not None:
            client.close()
        outputs = [ipp.output_file(launcher) for launcher in
                   ([cluster.controller, *cluster.engines.values()] if cluster is not None else ())]
        if cluster is not None:
            # engines first, then the controller: stopped together (stop_cluster), engines that lose their
            # controller mid-shutdown take ~3 s longer to exit (measured: 3.5 s against 0.4 s for 2 ranks)
            for stop in (cluster.stop_engines_sync, cluster.stop_controller_sync):  # a batch launcher scancels
                try:
                    stop()
                except Exception as exc:  # noqa: BLE001 - a half-dead world must still be cleaned up
                    log.warning("stopping the cluster reported: %s", exc)
        self.launcher.stopped(unreachable=silent)
        end_processes(processes, grace=5)
        if self.status_dir:  # what the listed processes started that was not listed: the controller's schedulers
            # forked while a failed start was stopped, a process a rank detached from its session
            strays = leftovers.marked(self.status_dir, self._prepared_at)
            signal_all(strays, "terminate")
            end_processes(strays, grace=2)
        self.footprint.remove_shared_files()
        self.footprint.release_reaper(self.kept_state)
        if cluster is not None:
            leftovers.remove_files(ipp.connection_files(cluster) + [path for path in outputs if path])
            ipp.end_event_thread(cluster)
        # also the files of ranks that never said hello (their pids are known all the same)
        remove_world_files(self.status_dir, [process.pid for process in processes], self.stack_files.values())
        self.status_dir = None
        self.stack_files = {}
        self.footprint.processes = []
        self.engines = {}
        _live_worlds.discard(self)

    def restart(self, size=None, *, kill=False):
        """Stop this world and start a fresh one (same size unless *size* is given); returns ``self``.

        A Stop while the world stops lets the stop finish and starts nothing; a Stop while it starts rolls the
        start back; either way :class:`~mpinb.errors.StartInterrupted` says so, and no world is running."""
        size = self.size if size is None else check_size(size, self.placement)  # before anything is stopped
        with stops.deferred():
            pressed = stops.presses()
            self.stop(kill=kill)
            self.size = size
            if stops.presses() > pressed:
                self.lifecycle.ended = "its restart was interrupted"
                raise StartInterrupted(f"the restart was interrupted while the world stopped: its {self.size} ranks "
                                       "are stopped and none was started, so no world is running")
            return self.start()

    # ------------------------------------------------------------------ use

    @property
    def view(self):
        """ipyparallel's ``DirectView`` of every rank, in rank order (``view.scatter``, ``view.pull``, ``%px``).

        Blocking by default. Its targets are engine ids, listed by rank, so what it scatters goes to ranks in
        order; ipyparallel labels its own output by engine id (``[stdout:0]``), mpinb's cells by rank.
        """
        if not self.running:
            raise MPIError("no MPI world is running: %mpi start -n N starts one")
        view = self.client.direct_view(targets=[self.engines[rank] for rank in self.ranks])
        view.block = True
        return view

    def dead_ranks(self, ranks=None):
        """Ranks among *ranks* (default: all) whose engine has ended (:meth:`Liveness.dead_ranks`)."""
        return self.liveness.dead_ranks(self.ranks if ranks is None else list(ranks))

    def is_remote(self, rank):
        """Whether *rank* runs on another host than the notebook's."""
        return not self.local_ranks([rank])

    def local_ranks(self, ranks):
        """Those of *ranks* that run on the notebook's host (their pids mean something here)."""
        here = socket.gethostname()
        return [rank for rank in ranks if self.identities.get(rank, {}).get("host") == here]

    def hosts(self):
        """``{host: [ranks]}`` in order of each host's lowest rank."""
        hosts = {}
        for rank in self.ranks:
            hosts.setdefault(self.identities[rank]["host"], []).append(rank)
        return hosts

    # ------------------------------------------------------------------ internals

    def job_id(self):
        """The batch job the ranks run in, as its scheduler numbers it, or ``None``."""
        for launcher in (self.cluster.engines.values() if self.cluster is not None else ()):
            if ipp.job_id(launcher):
                return ipp.job_id(launcher)
        return None

@atexit.register
def _stop_all_worlds():
    for world in list(_live_worlds):
        world.stop()
