"""Starting a world: the controller and ``mpiexec`` launched, every rank registered, told its rank and connected
to the cell channel; or a clear error naming what failed, with what the processes printed."""

import json
import logging
import os
import re
import sys
import time

from ...errors import BadArguments, MPIError, StartInterrupted
from ...rank import agent
from ...rank import world as rank_world
from ...wire.rank_files import TRACER_ENV, tracer
from .. import stops
from . import ipp, leftovers, mpis
from .reaper import alive

# Keep MPI's own traffic on loopback too (libfabric's tcp/sockets providers, UCX), unless asked otherwise.
LOOPBACK_ENV = {"FI_TCP_IFACE": "lo", "FI_SOCKETS_IFACE": "lo", "UCX_NET_DEVICES": "lo"}

_ENGINE_LOG = re.compile(r"^\d{4}-\d\d-\d\d [\d:.]+ \[(IPEngine|IPController|KernelNanny|IPClusterStart)")


class StartRace(MPIError):
    """A start that failed for a reason outside mpinb that a new start avoids: a port ipyparallel picked was taken
    before its process bound it, or, under ``srun --mpi=pmi2``, a rank's ``MPI_Init`` sent Slurm's pmi2 plugin
    garbage and exited. MPICH names a node's shared memory after the job (srun's ``jobid.step``): a segment an
    earlier job of the same id left in ``/dev/shm`` is opened again and its stale contents read. The new start
    is a new job."""

    def __init__(self, message, reason):
        super().__init__(message)
        self.reason = reason


RACES = {"Address already in use": "a port was taken while the world started",
         "mpi/pmi2: invalid client request": "a rank's MPI_Init failed under srun's pmi2 plugin"}


def start_failure(message, output):
    """The error for a start that failed with *message*: :class:`StartRace` when the processes' *output* (the
    only account of why a controller or an engine gave up) shows one of the :data:`RACES`, else
    :class:`MPIError`."""
    reason = next((why for said, why in RACES.items() if said in output), None)
    return StartRace(message, reason) if reason else MPIError(message)


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


class Startup:
    """One start of *world*: what :meth:`World.start` does, step by step, with its progress line."""

    def __init__(self, world):
        self.world = world
        self.line = None  # the Progress of this start

    def run(self):
        """Launch, wait for every rank, connect, handing each part to the world as it is made; on any failure stop
        what started and raise.

        A Stop is acted on at the start's safe points (between its steps, and while it waits): what started is
        stopped, and :class:`~mpinb.errors.StartInterrupted` says so; it never lands inside ipyparallel."""
        world = self.world
        self.doing = "preparing the start"
        with stops.deferred():
            self.pressed = stops.presses()
            try:
                world.launching(self._cluster())  # stopped at exit from now on
                self.line = self._progress_line()
                for step in (self._launch, self._register, self._connect):
                    self._check_stop()
                    step()
                self._check_stop()
            except BaseException as exc:
                self._end_line()
                world.stop()
                if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, StartInterrupted):
                    exc = self._interrupted()  # a Stop in code that raises as usual (a batch job's commands)
                if isinstance(exc, StartInterrupted):
                    raise exc from None
                raise
        self._end_line()
        # from now on mpinb reports what happens to the ranks itself; ipyparallel would add a warning with every
        # engine's start-up log whenever mpiexec ends non-zero (a rank died, or the world was stopped)
        world.cluster.log.setLevel(logging.ERROR)

    def _check_stop(self):
        """A safe point: raise :class:`StartInterrupted` if Stop was pressed since the start began."""
        if stops.presses() > self.pressed:
            raise self._interrupted()

    def _interrupted(self):
        n = self.world.size
        return StartInterrupted(f"the start of {n} rank{'s' if n != 1 else ''} was interrupted while "
                                f"{self.doing}: everything it had launched is stopped, so no world is running")

    def _cluster(self):
        """The ``ipyparallel.Cluster`` of this start, configured, nothing launched yet."""
        import ipyparallel
        from traitlets.config import Config

        world = self.world
        mpi = self._checked_mpi()
        config = Config()
        world.prepare()  # its heartbeat period and status folder
        engines = self._engines(config, mpi)
        local = world.launcher.all_here
        return ipyparallel.Cluster(
            engines=engines,
            n=world.size,
            controller_ip=world.ip,
            controller_args=[f"--HeartMonitor.period={world.heartbeat_ms}", "--HubFactory.db_class=NoDB",
                             f"--HeartMonitor.max_heartmonitor_misses={heartbeat_misses(world.heartbeat_ms)}",
                             # off loopback, ipyparallel's own messages (which carry the channel's salt) are
                             # encrypted too, as the cell channel is
                             f"--IPController.enable_curve={not world.loopback}"],
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

    def _checked_mpi(self):
        """The world's MPI, once it, the launcher and where the ranks run are known to work together; else the
        error that says what does not."""
        world = self.world
        mpi = world.resolve_mpi()
        mpis.check(mpi, sys.executable)
        world.launcher.check()
        remote = world.placement.remote_hosts()
        if remote and world.loopback:
            raise BadArguments(
                f"ranks on {', '.join(remote[:3])} cannot reach a controller that listens on {world.ip}: add "
                "--ip with an address of this host they can reach (or 0.0.0.0 for every interface)"
            )
        return mpi

    def _engines(self, config, mpi):
        """The engines' launcher of this start, configured in *config* by the world's launcher: one ``mpiexec``
        of *mpi* whose ranks carry the world's mark and environment, each under a parent that records how it
        ended; the controller's launcher is configured in *config* too."""
        world = self.world
        # on this host the ranks start while the controller does, and wait for this copy of its engine file:
        # the controller writes its own in place, and an engine that read it half-written exited
        self.engine_file = os.path.join(world.status_dir, "engine.json")
        environment = {leftovers.MARK: world.status_dir, **world.kept_state.environment(world.size),
                       **mpi.environment()}
        environment[TRACER_ENV] = tracer()  # which process the ranks let ptrace them (native/py_spy.py)
        # the controller carries the world's mark too, and so does every process it forks: stop finds them all
        config.LocalControllerLauncher.environment = {leftovers.MARK: world.status_dir}
        # ipyparallel's controller, less a quarter second's sleep before it writes its connection files
        config.LocalControllerLauncher.controller_cmd = [sys.executable, "-m", "mpinb.notebook.world.controller"]
        if world.loopback:
            environment.update(LOOPBACK_ENV)
        local = world.launcher.all_here
        # off this host the engines find the controller from $IPP_CONNECTION_INFO, which ipyparallel sets on the
        # launcher when it starts: Open MPI passes to other hosts only the variables it is told to
        forward = sorted(environment) + ([] if local else ["IPP_CONNECTION_INFO"])
        arguments = mpi.launcher_args(world.size, local=local, forward=forward) + world.mpiexec_args
        # each rank runs its engine under a parent that records how it ended (rank/launch.py)
        # ipyparallel's nanny (a process per engine, a quarter of a second of CPU each to start) signals ranks on
        # other hosts; ranks on this one are signalled by pid
        return world.launcher.configure(config, mpiexec=mpi.mpiexec, mpiexec_args=arguments,
                                         engine_cmd=[sys.executable, "-m", "mpinb.rank.launch",
                                                     f"--IPEngine.enable_nanny={not local}",
                                                     f"--IPEngine.wait_for_url_file={world.start_timeout:g}",
                                                     *([f"--IPEngine.url_file={self.engine_file}"] if local
                                                       else [])],
                                         environment=environment, workdir=world.status_dir)

    def _launch(self):
        """The controller, then ``mpiexec`` (or the batch job), with a reaper watching them at once."""
        world = self.world
        self._say("starting the ipyparallel controller")
        world.cluster.start_controller_sync()
        ranks = f"{world.size} rank{'s' if world.size != 1 else ''}"
        self._say(f"launching {ranks} with {os.path.basename(world.mpi.mpiexec)}")
        world.cluster.start_engines_sync(world.size)
        world.launched()  # from here on a killed kernel leaves nothing, also while the ranks register

    def _register(self):
        """Every rank registered and told its rank; the reaper now watches the ranks too."""
        world = self.world
        self._wait_for_controller()
        client = world.connect_client()
        self._wait_for_engines()
        self.everyone = client.direct_view(targets=list(client.ids))
        world.registered(*self._learn_ranks(self.everyone))

    def _connect(self):
        """Every rank's agent connected to a new cell channel."""
        world = self.world
        self._say("connecting to the ranks", force=True)
        # off loopback, ipyparallel runs CurveZMQ and drops its session key (CurveZMQ authenticates): the
        # channel's key then travels inside ipyparallel's encrypted messages, never in clear
        encrypted = bool(world.client.curve_serverkey)
        if not world.client.session.key and not encrypted:
            raise MPIError("ipyparallel's messages are neither signed nor encrypted (Session.key is empty and "
                           "CurveZMQ is off): set a Session key or IPController.enable_curve in its config")
        channel = world.open_channel(None if encrypted else world.client.session.key)
        self._wait_for(self.everyone.apply_async(
            agent.start, cells=channel.cells_url, events=channel.events_url, salt=channel.salt,
            key=channel.sent_key, encrypt=channel.encrypt, bulk=channel.bulk_url), "connecting to the cell channel")
        world.connected(channel.wait_for_ranks(world.ranks, timeout=world.start_timeout, check=self._check_stop))

    def _wait_for_controller(self):
        """Wait here for the controller's connection files, which ipyparallel's client waits for in a coroutine
        (every 0.1 s): interrupted there, the coroutine was left pending, and asyncio said so later from its
        destructor ('Task was destroyed but it is pending!')."""
        world = self.world
        deadline = time.monotonic() + world.start_timeout
        while not all(_written(path) for path in ipp.connection_files(world.cluster)):
            self._check_stop()
            self._check_launchers()
            if time.monotonic() > deadline:
                output = self._launcher_output()
                raise start_failure(f"the ipyparallel controller wrote no connection file within "
                                    f"{world.start_timeout:g} s:\n{output}", output)
            time.sleep(0.02)
        engine = ipp.engine_connection_file(world.cluster)
        if engine and not os.path.exists(self.engine_file):  # the ranks' copy appears whole (os.replace)
            partial = self.engine_file + ".partial"
            with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as copy:
                with open(engine) as original:
                    copy.write(original.read())
            os.replace(partial, self.engine_file)

    def _wait_for_engines(self):
        """Wait for every rank to register. Time a batch job spends queued does not count against
        ``start_timeout`` (an interrupt cancels it)."""
        world = self.world
        deadline = time.monotonic() + world.start_timeout
        polled, queued, shown, what = 0.0, False, -1, "ranks registered"
        while True:
            up = len(world.client.ids)
            if up != shown:
                shown = up
                self._say(what, up, world.size, force=up >= world.size)
            if up >= world.size:
                return
            self._check_stop()
            self._check_launchers()
            if time.monotonic() - polled > 0.5:
                polled = time.monotonic()
                said = world.launcher.waiting(world, self._launcher_output)
                if said is not None:
                    what, queued = said
                    self._say(what, up, world.size, force=True)
            if queued:
                deadline = time.monotonic() + world.start_timeout
            if time.monotonic() > deadline:
                output = self._launcher_output()
                raise start_failure(
                    f"only {up} of {world.size} ranks registered within {world.start_timeout:g} s; "
                    f"raise %config MPIMagics.start_timeout or check the mpiexec output:\n{output}", output)
            time.sleep(0.02)

    def _wait_for(self, pending, what):
        """The result of ipyparallel's *pending* request (the ranks doing *what*), waited for in short slices with
        a safe point between them. A rank that ended meanwhile (the hub unregistered its engine) fails the start
        at once, with what the launcher printed: the others would wait for it in MPI for ever. ``TimeoutError``
        after ``start_timeout``."""
        world = self.world
        deadline = time.monotonic() + world.start_timeout
        while not pending.ready():
            self._check_stop()
            self._check_launchers()
            gone = world.size - len(world.client.ids)
            if gone > 0:
                output = self._launcher_output()
                raise start_failure(f"{gone} of {world.size} ranks ended while {what}; the others would wait for "
                                    f"{'it' if gone == 1 else 'them'} for ever:\n{output}", output)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the ranks did not answer within {world.start_timeout:g} s while {what}")
            pending.wait(0.05)
        return pending.get()

    def _progress_line(self):
        progress = self.world.progress
        if progress is True:
            from ...widgets.views import Progress

            return Progress(notebook=False)
        return progress() if callable(progress) else None

    def _say(self, text, done=None, total=None, *, force=False):
        self.doing = text if done is None else f"{done} of {total} {text}"
        if self.line is not None:
            self.line.update(text, done, total, force=force)

    def _end_line(self):
        line, self.line = self.line, None
        if line is not None:
            line.close()

    def _check_launchers(self):
        cluster = self.world.cluster
        for name, launcher in [("controller", cluster.controller), *cluster.engines.items()]:
            process = ipp.process(launcher)
            if process is not None and not alive(process):
                what = "the ipyparallel controller" if name == "controller" else "mpiexec"
                output = self._launcher_output([launcher])
                raise start_failure(f"{what} exited while the world was starting:\n{output}", output)

    def _launcher_output(self, launchers=None):
        cluster = self.world.cluster
        chunks = []
        for launcher in launchers or [cluster.controller, *cluster.engines.values()]:
            try:
                text = launcher.get_output()
            except Exception:  # noqa: BLE001 - output is a courtesy; the error is raised anyway
                text = ""
            if text:
                chunks.append(_excerpt(text))
        return "\n".join(chunks) or "(no output)"

    def _learn_ranks(self, view):
        """``({rank: engine id}, {rank: who})`` of the ranks *view* reaches, once each was told its rank."""
        world = self.world
        replies = self._wait_for(view.apply_async(rank_world.init_world, threads=world.threads), "MPI started")
        sizes = {who["size"] for who in replies}
        ranks = sorted(who["rank"] for who in replies)
        if sizes != {world.size} or ranks != list(range(world.size)):
            raise MPIError(
                f"mpiexec started {len(replies)} processes but MPI sees world sizes {sorted(sizes)}: this mpiexec "
                f"({world.mpi.mpiexec if world.mpi else 'mpiexec'}) does not belong to the MPI library the ranks "
                "loaded. Name the MPI (%mpi start --mpi mpich|openmpi|impi|/path/to/mpiexec), or give the "
                "ranks its library (%config MPIMagics.mpi_library = '/path/to/libmpi.so')."
            )
        return {who["rank"]: eid for eid, who in zip(view.targets, replies)}, {who["rank"]: who for who in replies}


def _written(path):
    """Whether the JSON file at *path* is there and whole."""
    try:
        with open(path) as file:
            json.load(file)
        return True
    except (OSError, ValueError):
        return False


def _excerpt(text, head=16, tail=6):
    """What a launcher said, for an error: its own lines (ipyparallel's log lines left out), the first *head*
    of them, where launchers put the cause (Open MPI's "not enough slots", Hydra's bad option), and the last
    *tail*."""
    lines = [line for line in text.strip().splitlines() if line.strip() and not _ENGINE_LOG.match(line)]
    if len(lines) <= head + tail:
        return "\n".join(lines)
    return "\n".join([*lines[:head], f"[... {len(lines) - head - tail} more lines ...]", *lines[-tail:]])
