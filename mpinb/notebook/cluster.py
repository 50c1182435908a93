"""Start, stop, restart and inspect one MPI world: ipyparallel engines launched by a single ``mpiexec``, here or
inside a batch job (``launchers.py``)."""

import atexit
import logging
import os
import re
import signal
import socket
import sys
import tempfile
import time
import weakref
from pathlib import Path

import psutil

from ..errors import BadArguments, MPIError
from ..rank import agent
from ..rank import world as rank_world
from ..wire.channel import Channel
from ..wire.ranks import label_ranks
from . import ipp, mpis
from .gather import Receiver
from .launchers import Placement, SlurmJob, is_this_host
from .reaper import alive, end_processes, remove_world_files, signal_all

log = logging.getLogger("mpinb")

_live_worlds = weakref.WeakSet()

# Keep MPI's own traffic on loopback too (libfabric's tcp/sockets providers, UCX), unless asked otherwise.
LOOPBACK_ENV = {"FI_TCP_IFACE": "lo", "FI_SOCKETS_IFACE": "lo", "UCX_NET_DEVICES": "lo"}


# Reasons a pending Slurm job gives when it will never start without a change (squeue %R)
NEVER_RUNS = {
    "PartitionConfig": "the partition cannot give that many tasks (fewer ranks, or another --partition)",
    "PartitionNodeLimit": "more nodes than the partition allows (fewer ranks, or another --partition)",
    "PartitionTimeLimit": "a longer --time than the partition allows",
    "BadConstraints": "no node satisfies the job's constraints (check --scheduler-arg)",
    "InvalidAccount": "the --account is not valid",
    "InvalidQOS": "the QOS is not valid",
    "AccountNotAllowed": "the account may not use this partition",
    "QOSNotAllowed": "the QOS may not use this partition",
    "JobHeldAdmin": "an administrator holds the job",
    "JobHeldUser": "the job is held (scontrol release)",
}


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


# how long an engine's heartbeats may stop before the hub unregisters it: 3.5 s whatever the period, which a rank
# on a busy machine (64 ranks on 2 cores start in 20 s) does not reach by accident
HEARTBEAT_SILENCE_MS = 3500


def heartbeat_period(size):
    """The heartbeat period for a world of *size* ranks: 100 ms (a rank's registration completes on a beat, so
    worlds start sooner) up to 500 ms, so that the controller handles at most about 125 heartbeats a second."""
    return min(500, max(100, 8 * size))


def heartbeat_misses(period_ms):
    """Heartbeats an engine may miss in a row before the hub unregisters it, at *period_ms*."""
    return max(3, -(-HEARTBEAT_SILENCE_MS // max(1, int(period_ms))))


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
        self.size = check_size(size, self.placement)
        self.mpiexec = mpiexec
        self.mpi_choice, self.mpi_library = mpi, mpi_library
        self.mpi = None  # the mpis.MPI resolved at start
        self.mpiexec_args = list(mpiexec_args)
        self.ip = ip
        self.job = None  # the SlurmJob the ranks run in (Slurm launcher)
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
        self.receiver = None  # the notebook's end of the ranks' shared-memory segments (--gather)
        self.stack_files = {}  # rank -> file its stacks are dumped to on SIGUSR2
        self.status_dir = None  # where each rank's launcher writes how its engine ended
        self._reaper = None
        self._processes = []
        self._shared_files = set()
        self.shared_files_seen = set()  # every shared-memory file this world's ranks mapped (all removed at stop)

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
        except PortTaken:
            log.warning("a port was taken while the world started; starting again with new ports")
            return self._start()

    def _start(self):
        import ipyparallel as ipp
        from traitlets.config import Config

        self.mpi = mpi = mpis.resolve(self.mpi_choice, self.mpiexec, self.mpi_library)
        mpis.check(mpi, sys.executable)
        self.placement.check()
        remote = self.placement.remote_hosts()
        if remote and self.loopback:
            raise BadArguments(
                f"ranks on {', '.join(remote[:3])} cannot reach a controller that listens on {self.ip}: add "
                "--ip with an address of this host they can reach (or 0.0.0.0 for every interface)"
            )
        config = Config()
        self.heartbeat_ms = int(self.heartbeat_choice or heartbeat_period(self.size))
        self.status_dir = tempfile.mkdtemp(prefix="mpinb-world-")
        environment = {"MPINB_STATUS_DIR": self.status_dir, **mpi.environment()}
        if self.loopback:
            environment.update(LOOPBACK_ENV)
        local = not self.placement.batch and not self.placement.hostfile
        arguments = mpi.launcher_args(self.size, local=local, forward=sorted(environment)) + self.mpiexec_args
        # each rank runs its engine under a parent that records how it ended (rank/launch.py)
        # ipyparallel's nanny (a process per engine, a quarter of a second of CPU each to start) signals ranks on
        # other hosts; ranks on this one are signalled by pid
        engines = self.placement.configure(config, mpiexec=mpi.mpiexec, mpiexec_args=arguments,
                                           engine_cmd=[sys.executable, "-m", "mpinb.rank.launch",
                                                       f"--IPEngine.enable_nanny={not local}",
                                                       f"--IPEngine.wait_for_url_file={self.start_timeout:g}"],
                                           environment=environment, workdir=self.status_dir)
        self.cluster = ipp.Cluster(
            engines=engines,
            n=self.size,
            controller_ip=self.ip,
            controller_args=[f"--HeartMonitor.period={self.heartbeat_ms}", "--HubFactory.db_class=NoDB",
                             f"--HeartMonitor.max_heartmonitor_misses={heartbeat_misses(self.heartbeat_ms)}",
                             # off loopback, ipyparallel's own messages (which carry the channel's salt) are
                             # encrypted too, as the cell channel is
                             f"--IPController.enable_curve={not self.loopback}"],
            delay=0,
            # on this host, the ranks start while the controller does (they wait for its connection file)
            # rather than after it wrote the file, which ipyparallel otherwise waits for to pass it in their
            # environment
            send_engines_connection_env=not local,
            shutdown_atexit=False,
            cluster_file="",  # ipcluster's listing of running clusters: mpinb keeps its own (World)
            log_level=logging.WARNING,
            config=config,
        )
        _live_worlds.add(self)
        self._line = self._progress_line()
        try:
            self._say("starting the ipyparallel controller")
            self.cluster.start_controller_sync()
            self._say(f"launching {self.size} rank{'s' if self.size != 1 else ''} with {os.path.basename(mpi.mpiexec)}")
            self.cluster.start_engines_sync(self.size)
            job_id = self._job_id()
            if self.placement.launcher == "slurm" and job_id:
                self.job = SlurmJob(job_id)
            # from here on a killed kernel leaves nothing, also while the ranks register
            self._start_reaper(self._launched_processes())
            self.client = self.cluster.connect_client_sync()
            self._wait_for_engines()
            everyone = self.client.direct_view(targets=list(self.client.ids))
            self._learn_ranks(everyone)
            self._processes = self._launched_processes() + self._rank_processes()
            self._start_reaper()  # again, watching what started since too
            self._shared_files = self._mapped_shared_files()
            self._say("connecting to the ranks", force=True)
            self._open_channel(everyone)
        except BaseException:
            self._end_line()
            self.stop()
            raise
        self._end_line()
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
        job, self.job = self.job, None
        if job is not None and not job.wait_gone(timeout=60):
            log.warning("Slurm job %s is still in the queue (%s) a minute after scancel", job.job_id, job.state()[0])
        end_processes(processes, grace=5)
        self._remove_shared_files()
        if self._reaper is not None:
            self._reaper.kill()
            self._reaper.wait(timeout=5)
            self._reaper = None
        if cluster is not None:
            _remove_files(ipp.connection_files(cluster) + [path for path in outputs if path])
            ipp.end_event_thread(cluster)
        # also the files of ranks that never said hello (their pids are known all the same)
        remove_world_files(self.status_dir, [process.pid for process in processes], self.stack_files.values())
        self.status_dir = None
        self.stack_files = {}
        self._processes = []
        self.engines = {}
        _live_worlds.discard(self)

    def restart(self, size=None, *, kill=False):
        """Stop this world and start a fresh one (same size unless *size* is given); returns ``self``."""
        size = self.size if size is None else check_size(size, self.placement)  # before anything is stopped
        self.stop(kill=kill)
        self.size = size
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
        return len(self._local(ranks)) == len(ranks)

    def dead_ranks(self, ranks=None):
        """Ranks among *ranks* whose engine has ended: on this host, its process has exited; on another host,
        ipyparallel's hub unregistered it (its heartbeats stopped for ``HEARTBEAT_SILENCE_MS``: the
        process ended, or its host cannot be reached)."""
        ranks = self.ranks if ranks is None else list(ranks)
        local = set(self._local(ranks))
        dead = [rank for rank in ranks if rank in local and not alive(self.identities[rank]["pid"])]
        remote = [rank for rank in ranks if rank not in local and rank in self.engines]
        if remote and self.client is not None:
            registered = set(self.client.ids)  # reads the hub's unregistration notices first
            dead += [rank for rank in remote if self.engines[rank] not in registered]
        self._checked = (time.monotonic(), set(ranks), set(dead))
        return sorted(dead)

    def dead_ranks_lately(self, ranks=None, within=0.5):
        """:meth:`dead_ranks`, or what it found less than *within* seconds ago (cells run back to back do not
        read every rank's process state each time; a rank dying meanwhile is found by the cell's own checks)."""
        ranks = self.ranks if ranks is None else list(ranks)
        when, checked, dead = getattr(self, "_checked", (None, set(), set()))
        if when is not None and time.monotonic() - when < within and checked.issuperset(ranks) and not dead:
            return []
        return self.dead_ranks(ranks)

    def is_remote(self, rank):
        """Whether *rank* runs on another host than the notebook's."""
        return not self._local([rank])

    def _local(self, ranks):
        """Those of *ranks* that run on the notebook's host (their pids mean something here)."""
        here = socket.gethostname()
        return [rank for rank in ranks if self.identities.get(rank, {}).get("host") == here]

    def status(self):
        """One row per rank: ``{"rank", "host", "pid", "threads", "state"}``, state being idle, busy or dead."""
        queues = {}
        alive_ids = set(self.client.ids) if self.running else set()
        asked = [eid for eid in self.engines.values() if eid in alive_ids]
        if asked and self._controller_alive():
            try:
                queues = self.client.queue_status(targets=asked)
            except Exception as exc:  # noqa: BLE001 - engines unregistering as we ask: show them as they are
                log.debug("queue_status: %s", exc)
        rows = []
        dead = set(self.dead_ranks())
        for rank in self.ranks:
            who = self.identities[rank]
            eid = self.engines[rank]
            if eid not in alive_ids or rank in dead:
                state = "dead"
            else:
                # the hub counts a request until it has seen the reply, later than this client: with nothing
                # outstanding here, a count left is that lag (mpinb's own cells do not go through the hub)
                queued = queues.get(eid, {}).get("queue", 0) and self.client.outstanding
                state = "busy" if queued else "idle"
            rows.append({"rank": rank, "host": who["host"], "pid": who["pid"], "threads": who.get("threads") or "-",
                         "state": state})
        return rows

    def describe(self):
        """A summary: size, MPI library, mpiexec, the batch job if any, and which ranks run on which host."""
        if not self.engines:
            return "no MPI world is running"
        mpi = self.identities[self.ranks[0]]["mpi"]
        via = self.mpi.mpiexec if self.mpi is not None else "mpiexec"
        line = f"MPI world of {self.size} rank{'s' if self.size != 1 else ''} ({mpi}) via {via}"
        where = self.placement.describe(job_id=self._job_id())
        if where:
            line += f" in {where}" if self.placement.batch else f" on {where}"
        if not self.loopback:
            line += f"; controller on {self.ip}"
        hosts = self.hosts()
        return line + "\n" + "; ".join(f"{host}: {label_ranks(ranks)}" for host, ranks in hosts.items())

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

    def _wait_for_engines(self):
        """Wait for every rank to register. Time a batch job spends queued does not count against
        ``start_timeout`` (an interrupt cancels it)."""
        deadline = time.monotonic() + self.start_timeout
        polled, queued, shown, what = 0.0, False, -1, "ranks registered"
        while True:
            up = len(self.client.ids)
            if up != shown:
                shown = up
                self._say(what, up, self.size, force=up >= self.size)
            if up >= self.size:
                return
            self._check_launchers()
            if self.job is not None and time.monotonic() - polled > 0.5:
                polled = time.monotonic()
                state, where = self.job.state()
                queued = self._check_job(state, where)
                reason = "" if where in ("", "(None)") else f" {where}"
                what = f"Slurm job {self.job.job_id} {state.lower()}{reason}" if queued else "ranks registered"
                self._say(what, up, self.size, force=True)
            if queued:
                deadline = time.monotonic() + self.start_timeout
            if time.monotonic() > deadline:
                output = self._launcher_output()
                raise start_failure(
                    f"only {up} of {self.size} ranks registered within {self.start_timeout:g} s; "
                    f"raise %config MPIMagics.start_timeout or check the mpiexec output:\n{output}", output)
            time.sleep(0.02)

    def _progress_line(self):
        if self.progress is True:
            from ..widgets.views import Progress

            return Progress(notebook=False)
        return self.progress() if callable(self.progress) else None

    def _say(self, text, done=None, total=None, *, force=False):
        if self._line is not None:
            self._line.update(text, done, total, force=force)

    def _end_line(self):
        line, self._line = self._line, None
        if line is not None:
            line.close()

    def _check_launchers(self):
        for name, launcher in [("controller", self.cluster.controller), *self.cluster.engines.items()]:
            process = ipp.process(launcher)
            if process is not None and not alive(process):
                what = "the ipyparallel controller" if name == "controller" else "mpiexec"
                output = self._launcher_output([launcher])
                raise start_failure(f"{what} exited while the world was starting:\n{output}", output)

    def _check_job(self, state, where):
        """Raise if the Slurm job ended, or runs where the ranks cannot reach the controller; return whether it
        is still queued."""
        if state is None:
            raise MPIError(f"Slurm job {self.job.job_id} ended before every rank registered; its output:\n"
                           f"{self._launcher_output()}")
        if state == "PENDING":
            reason = where.strip("()")
            if reason in NEVER_RUNS:
                raise BadArguments(
                    f"Slurm will not run job {self.job.job_id} as asked ({reason}): {NEVER_RUNS[reason]}; "
                    "scontrol show partition lists what each partition allows"
                )
            return True
        if state == "RUNNING" and self.loopback:
            away = [host for host in self.job.nodes(where) if not is_this_host(host)]
            if away:
                raise MPIError(
                    f"Slurm job {self.job.job_id} runs on {', '.join(away[:3])}, and ranks there cannot reach a "
                    f"controller that listens on {self.ip}: %mpi start --launcher slurm --ip ADDRESS (an address "
                    "of this host the compute nodes reach, or 0.0.0.0)"
                )
        return False

    def _job_id(self):
        for launcher in (self.cluster.engines.values() if self.cluster is not None else ()):
            if ipp.job_id(launcher):
                return ipp.job_id(launcher)
        return None

    def _rank_processes(self):
        """Processes of the ranks on this host that this kernel did not start itself (a batch job's): each
        engine and the ``mpinb.rank.launch`` parent above it."""
        if not self.placement.batch:
            return []
        processes = []
        for rank in self._local(self.ranks):
            try:
                engine = psutil.Process(self.identities[rank]["pid"])
                processes.append(engine)
                parent = engine.parent()
                if parent is not None and "mpinb.rank.launch" in parent.cmdline():
                    processes.append(parent)
            except psutil.NoSuchProcess:
                pass
        return processes

    def _launcher_output(self, launchers=None):
        chunks = []
        for launcher in launchers or [self.cluster.controller, *self.cluster.engines.values()]:
            try:
                text = launcher.get_output()
            except Exception:  # noqa: BLE001 - output is a courtesy; the error is raised anyway
                text = ""
            if text:
                chunks.append(_excerpt(text))
        return "\n".join(chunks) or "(no output)"

    def _launched_processes(self, cluster=None):
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

    def _open_channel(self, view):
        # off loopback, ipyparallel runs CurveZMQ and drops its session key (CurveZMQ authenticates): the
        # channel's key then travels inside ipyparallel's encrypted messages, never in clear
        encrypted = bool(self.client.curve_serverkey)
        if not self.client.session.key and not encrypted:
            raise MPIError("ipyparallel's messages are neither signed nor encrypted (Session.key is empty and "
                           "CurveZMQ is off): set a Session key or IPController.enable_curve in its config")
        self.channel = Channel(self.ip, secret=None if encrypted else self.client.session.key)
        self.receiver = Receiver()
        view.apply_sync(agent.start, cells=self.channel.cells_url, events=self.channel.events_url,
                        salt=self.channel.salt, key=self.channel.sent_key, encrypt=self.channel.encrypt)
        self.stack_files = self.channel.wait_for_ranks(self.ranks, timeout=self.start_timeout)

    def _start_reaper(self, processes=None):
        """A watcher that ends this world's *processes* (default: all it knows) if this process dies without
        stopping it (rank/reaper)."""
        import subprocess

        items = []
        for process in self._processes if processes is None else processes:
            try:
                items.append(f"{process.pid}:{process.create_time()}")
            except psutil.NoSuchProcess:
                pass
        cancel = []
        if self.job is not None:
            cancel = ["--cancel", f"scancel {self.job.job_id}"]
        if self._reaper is not None:  # the one started before the ranks registered
            self._reaper.kill()
            self._reaper.wait(timeout=5)
        self._reaper = subprocess.Popen([sys.executable, "-m", "mpinb.notebook.reaper", *cancel, str(os.getpid()),
                                         self.status_dir, *items],
                                        start_new_session=True, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _mapped_shared_files(self, processes=None):
        """Shared-memory files the ranks here have mapped (MPI's own segments among them)."""
        files = set()
        for process in self._processes if processes is None else processes:
            try:  # /proc/PID/maps, not psutil's memory_maps(), which reads smaps: 30 ms a rank
                with open(f"/proc/{process.pid}/maps") as maps:
                    lines = maps.read().splitlines()
            except OSError:
                continue
            for line in lines:
                fields = line.split(None, 5)  # address perms offset device inode [path]
                path = fields[5].strip() if len(fields) == 6 else ""
                if path.startswith("/dev/shm/") and not path.endswith("(deleted)"):
                    files.add(path)
        return files

    def _remove_shared_files(self):
        """MPI removes its segments at MPI_Finalize; a rank that died cannot, so what is left once every process
        of the world is gone is removed here (only files these ranks had mapped)."""
        for path in self._shared_files:
            Path(path).unlink(missing_ok=True)
        self.shared_files_seen |= self._shared_files
        self._shared_files = set()

    def _controller_alive(self):
        process = ipp.process(self.cluster.controller)
        return process is None or alive(process)

    def _learn_ranks(self, view):
        replies = view.apply_async(rank_world.init_world, threads=self.threads).get(timeout=self.start_timeout)
        sizes = {who["size"] for who in replies}
        ranks = sorted(who["rank"] for who in replies)
        if sizes != {self.size} or ranks != list(range(self.size)):
            raise MPIError(
                f"mpiexec started {len(replies)} processes but MPI sees world sizes {sorted(sizes)}: this mpiexec "
                f"({self.mpi.mpiexec if self.mpi else 'mpiexec'}) does not belong to the MPI library the ranks "
                "loaded. Name the MPI (%mpi start --mpi mpich|openmpi|impi|/path/to/mpiexec), or give the "
                "ranks its library (%config MPIMagics.mpi_library = '/path/to/libmpi.so')."
            )
        self.engines = {who["rank"]: eid for eid, who in zip(view.targets, replies)}
        self.identities = {who["rank"]: who for who in replies}


_ENGINE_LOG = re.compile(r"^\d{4}-\d\d-\d\d [\d:.]+ \[(IPEngine|IPController|KernelNanny|IPClusterStart)")


def _excerpt(text, head=16, tail=6):
    """What a launcher said, for an error: its own lines (ipyparallel's log lines left out), the first *head*
    of them, where launchers put the cause (Open MPI's "not enough slots", Hydra's bad option), and the last
    *tail*."""
    lines = [line for line in text.strip().splitlines() if line.strip() and not _ENGINE_LOG.match(line)]
    if len(lines) <= head + tail:
        return "\n".join(lines)
    return "\n".join([*lines[:head], f"[... {len(lines) - head - tail} more lines ...]", *lines[-tail:]])


class PortTaken(MPIError):
    """A start failed because a port ipyparallel picked was taken before its process bound it; worth one retry."""


def start_failure(message, output):
    """The error for a start that failed with *message*: :class:`PortTaken` when the processes' *output* (the
    only account of why a controller or an engine gave up) says an address was in use, else :class:`MPIError`."""
    return PortTaken(message) if "Address already in use" in output else MPIError(message)


def _remove_files(paths):
    """What ipyparallel removes itself when a world ends cleanly, but not when its controller or mpiexec was
    killed: connection files and launcher logs."""
    for path in paths:
        if not os.path.isdir(path):
            Path(path).unlink(missing_ok=True)




@atexit.register
def _stop_all_worlds():
    for world in list(_live_worlds):
        world.stop()
