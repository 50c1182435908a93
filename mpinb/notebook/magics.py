"""``%mpi`` and ``%%mpi``: parse arguments, then hand over to cluster.py for the world and to
two helpers it is composed of: running.py for a cell, world_commands.py for the commands that look at a world."""

import functools
import keyword
import math
import shlex
import time

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from traitlets import Bool, Enum, Float, Integer, List, TraitError, Unicode, validate

from ..errors import BadArguments, MPIError, NoMPI, StartInterrupted
from ..widgets import views
from ..wire import script_cells
from ..wire.ranks import parse_ranks
from . import arguments, stops
from .debug import visual_debugger
from .world import kept_state
from .world import LAUNCHERS, Placement, State, World, check_size
from .frontend import in_notebook
from .models import History
from .running import CellRunner
from .world_commands import WorldCommands


def _usage(method):
    """*method* with mpinb's errors about what was asked (bad arguments, no usable MPI) shown as IPython shows a
    magic's: a one-line ``UsageError``; the kernel's own debugger never stops in it (the user's code runs on the
    ranks, where the debugger panel follows it)."""
    @functools.wraps(method)
    def shown(*args, **kwargs):
        try:
            with visual_debugger.kernel_untraced():
                return method(*args, **kwargs)
        except (BadArguments, NoMPI) as exc:
            raise UsageError(str(exc)) from None
    return shown


@magics_class
class MPIMagics(Magics):
    """Drive an MPI world from IPython. Configure with ``%config MPIMagics.<option> = value``."""

    default_ranks = Integer(2, config=True, help="Ranks started by %%mpi when no world runs and -n is not given.")
    default_mpi = Unicode(
        "", config=True,
        help="Which MPI %mpi start and %%mpi use without --mpi: mpich, openmpi, impi, or the path of an mpiexec. "
             "Empty: the MPI of `mpiexec`, else the one beside this Python (mpich wheel), else on PATH. The ranks "
             "load that MPI's library.",
    )
    mpiexec = Unicode(
        "", config=True,
        help="mpiexec to launch with (name or path); its MPI is read from `mpiexec --version`.",
    )
    mpi_library = Unicode("", config=True,
                          help="The libmpi the ranks load, when it is not installed beside the launcher.")
    mpiexec_args = List(Unicode(), config=True, help="Extra mpiexec arguments, e.g. ['--oversubscribe'].")
    ip = Unicode("127.0.0.1", config=True,
                 help="Address the controller listens on; loopback unless you ask (ranks on other hosts need one "
                      "they can reach, or 0.0.0.0).")
    launcher = Enum(list(LAUNCHERS), "mpi", config=True,
                    help="How ranks start: mpi (mpiexec here), ssh (mpiexec over ssh to the hosts of hostfile), or "
                         "a batch job running mpiexec: slurm, pbs, sge, lsf.")
    hostfile = Unicode("", config=True, help="Hosts file for mpiexec (mpi and ssh launchers).")
    partition = Unicode("", config=True, help="Batch launchers: the job's partition (queue).")
    time_limit = Unicode("", config=True, help="Batch launchers: the job's time limit, e.g. 01:00:00.")
    account = Unicode("", config=True, help="Batch launchers: the account the job is charged to.")
    scheduler_args = List(Unicode(), config=True,
                          help="Batch launchers: more job-script directives, e.g. ['--gres=gpu:1'].")
    threads_per_rank = Integer(
        0, config=True,
        help="Threads each rank's math libraries (OpenMP, BLAS, torch, TensorFlow) may use: 0 gives each rank an "
             "equal share of its host's cores, as torchrun does; negative leaves the libraries' defaults. Shown "
             "by %mpi status; OMP_NUM_THREADS and the like set in the environment win.")
    start_timeout = Float(60.0, config=True, help="Seconds to wait for all ranks to come up.")
    heartbeat_ms = Integer(0, config=True, help="Controller-engine heartbeat period in milliseconds; 0: 100 ms, "
                           "longer for worlds over 12 ranks (registration completes on a beat; a rank is given up "
                           "after 3.5 s without heartbeats whatever the period).")
    stream = Bool(True, config=True, help="Print rank output while the cell runs (else in rank order at the end).")
    interrupt_grace = Float(5.0, config=True,
                            help="Seconds ranks get to answer an interrupt; ranks stuck longer (in MPI or C) make "
                                 "mpinb restart the world.")
    timeout = Float(0.0, config=True, help="Default for %%mpi --timeout: seconds a cell may run (0: no limit).")
    status_after = Float(30.0, config=True,
                         help="Seconds after which a running cell shows, per rank, whether it finished and its "
                              "last reported step (0: never).")
    abort_grace = Float(2.0, config=True,
                        help="When a rank fails, seconds the other ranks get to finish before they are stopped "
                             "(they are usually waiting for it in a collective). Negative: wait for them.")
    collective_wait = Float(
        1.0, config=True,
        help="Seconds a rank may wait in one collective before mpinb asks every rank where it is, and stops the "
             "cell if ranks are in different collectives (0: never ask).")
    trace_buffer = Integer(100_000, config=True,
                           help="Spans each rank keeps under %%mpi --trace between sends at most (a ring: the "
                                "oldest go first).")
    report_interval = Float(0.1, config=True, help="Seconds each rank buffers mpinb.report() values between sends.")
    refresh_interval = Float(0.25, config=True, help="Seconds between redraws of the live metric charts at most.")
    max_points = Integer(1000, config=True, help="Points drawn per curve at most (the history keeps every value).")
    gather_transport = Enum(["auto", "shm", "mpi", "frames"], "auto", config=True,
                            help="How --gather moves values: auto (shm when the ranks share the notebook's host; "
                                 "mpi when some do and the cell runs on every rank; else frames), shm (shared "
                                 "memory), mpi (an MPI gather to a rank on the notebook's host, then one message), "
                                 "frames (each rank sends its own).")
    live_view = Enum(["auto", "widgets", "text", "off"], "auto", config=True,
                     help="How mpinb.report() values show while a cell runs: auto (widgets in a notebook, text in "
                          "a terminal), widgets, text, or off (only kept for mpinb.metrics()).")
    snapshots = Bool(
        True, config=True,
        help="Keep every rank's variables on its host after each cell every rank finished, so that every restart "
             "(%mpi restart after a rank died, a segfault, kill -9, MPI_Abort; mpinb's own) puts them back; "
             "%mpi restart --fresh starts empty.")
    snapshot_limit = Integer(1 << 30, config=True,
                             help="Bytes one name may take in a rank's snapshot; larger ones are listed as not kept.")
    snapshot_lag = Float(
        10.0, config=True,
        help="Seconds of a rank's work a crash may lose at most: a rank snapshots its variables when idle for 0.2 s "
             "after a cell, and a cell that comes sooner waits for that snapshot only when the last cell every rank "
             "kept is older (decided for every rank at once, from the next cell on).")
    keep_widgets = Bool(
        False, config=True,
        help="Keep each view's widget live after its cell ends (zoom, pickers) instead of replacing it by its static "
             "rendering. JupyterLab then needs Settings > Save Widget State Automatically, or a reopened notebook "
             "shows 'Error displaying widget' where the views were; nbconvert and GitHub show the static copy.")

    # what each number setting takes: (its least value, whether that value itself is allowed, in words); every
    # value is finite (NaN and infinity are refused); threads_per_rank takes any whole number
    _RANGES = {
        "default_ranks": (1, True, "a number of ranks >= 1"),
        "start_timeout": (0, False, "a finite number of seconds > 0"),
        "heartbeat_ms": (0, True, "a number of milliseconds >= 0 (0: 100 ms, longer for worlds over 12 ranks)"),
        "interrupt_grace": (0, True, "a finite number of seconds >= 0"),
        "timeout": (0, True, "a finite number of seconds >= 0 (0: no limit)"),
        "status_after": (0, True, "a finite number of seconds >= 0 (0: never)"),
        "abort_grace": (-math.inf, False, "a finite number of seconds (negative: wait for them)"),
        "collective_wait": (0, True, "a finite number of seconds >= 0 (0: never ask)"),
        "trace_buffer": (1, True, "a number of spans >= 1"),
        "report_interval": (0, True, "a finite number of seconds >= 0"),
        "refresh_interval": (0, True, "a finite number of seconds >= 0"),
        "max_points": (2, True, "a number of points per curve >= 2"),
        "snapshot_limit": (0, True, "a number of bytes >= 0"),
        "snapshot_lag": (0, True, "a finite number of seconds >= 0 (0: each cell waits for the last snapshot)"),
    }

    @validate(*_RANGES)
    def _in_range(self, proposal):
        """A number setting's value if it is one the setting takes; else a ``TraitError`` (what ``%config``
        shows) saying what it takes."""
        name, value = proposal["trait"].name, proposal["value"]
        least, inclusive, what = self._RANGES[name]
        if not (math.isfinite(value) and (value >= least if inclusive else value > least)):
            raise TraitError(f"MPIMagics.{name} takes {what}, not {value!r}")
        return value

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell=shell, **kwargs)
        self.world = None
        self.history = History()
        self.cells = CellRunner(self)  # runs %%mpi cells; keeps what the last one left
        self.commands = WorldCommands(self, self.cells)  # the %mpi commands that look at the world
        views.keep_widgets = self.keep_widgets
        self.observe(lambda change: setattr(views, "keep_widgets", change["new"]), names="keep_widgets")
        if shell is not None:  # each view drawn by a cell is replaced by its static rendering when the cell ends
            shell.events.register("post_run_cell", views.seal_all)
            if in_notebook(shell):
                views.warm_up()

    # ------------------------------------------------------------------ %mpi

    @line_magic
    @_usage
    def mpi(self, line=""):
        """Start, stop and inspect the MPI world.

        Usage::

            %mpi start [-n N] [--mpi mpich|openmpi|impi|PATH] [--mpiexec PATH] [--mpiexec-arg ARG ...] [--ip ADDRESS]
                       [--launcher {mpi,ssh,slurm,pbs,sge,lsf}] [--hostfile FILE]
                       [--partition P] [--time HH:MM:SS] [--account A] [--scheduler-arg ARG ...]
            %mpi stop
            %mpi restart [-n N] [--fresh]
            %mpi status
            %mpi output
            %mpi metrics [--run NAME]
            %mpi grads MODEL
            %mpi view
            %mpi trace
            %mpi who
            %mpi stacks [RANKS]
            %mpi debug R [--panel]
            %mpi debug --rank R
            %mpi inject [KIND --rank R [--at N] [--delay S] [--scale X] | clear]
            %mpi run [-n N] [--timeout S] [--trace] FILE [ARGS ...]

        ``start`` launches N ranks (default ``MPIMagics.default_ranks``) with mpiexec, one ipyparallel engine
        per rank; ``comm``, ``rank`` and ``size`` are predefined on each. ``--launcher slurm`` (or pbs, sge,
        lsf) submits a batch job of N tasks that runs that mpiexec inside its allocation; ``%mpi stop`` cancels
        it. Ranks on other hosts need ``--ip``: the controller listens on loopback unless told otherwise.
        ``restart`` gives new processes, of a new size with ``-n``, and every rank's variables come back as of
        the last cell every rank finished (``--fresh``: none), after a rank died (a segfault, kill -9,
        ``MPI_Abort``) too, and what could not be kept is listed. ``status`` lists rank, host, pid and
        state. ``output`` shows the last cell's output rank by rank. ``metrics`` shows the charts and per-rank
        table of everything ``mpinb.report()`` sent in this world (``mpinb.metrics()`` gives it as a DataFrame).
        ``grads MODEL`` compares a ``torch.nn.Module`` across ranks: per layer, each rank's gradient norm and
        the largest difference of gradients and weights to rank 0's, flagging the layers where ranks disagree.
        ``view`` makes the world's ipyparallel view (``mpinb.view()``) the one ``%px`` runs on.
        ``trace`` shows the timeline and summary of the last ``%%mpi --trace`` cell again (``mpinb.trace()``
        gives it as a DataFrame). ``who`` lists every name on the ranks, flagging those that differ. ``stacks``
        shows where each rank is, its Python frames merged with its native ones (py-spy's, when installed: the
        MPI call, gloo's allreduce, the lock it waits on), one line each naming the place. ``debug R`` opens pdb
        in rank R's last failed cell, its prompt answered in the notebook; ``breakpoint()`` in a cell opens the
        same prompt for the rank that reaches it. With JupyterLab's debugger switched on, breakpoints clicked in
        a ``%%mpi`` cell stop the ranks, and the panel shows rank 0 (``debug --rank R``: rank R);
        ``debug R --panel`` shows rank R's last failed cell there. ``inject`` plants a fault on rank R for
        teaching, acted on at its collectives (``straggler``, ``kill``, ``stall``, ``nan``, ``perturb``;
        ``--at N``: its Nth collective from now); alone it lists them, ``clear`` removes them. ``run FILE
        ARGS`` runs a script on every rank as ``__main__`` with ``sys.argv`` set, as ``mpiexec python FILE
        ARGS`` would, as a cell (its output, errors, Stop), its globals kept for the next cell.
        The world stops with the kernel.

        Examples
        --------
        ::

            In [1]: %load_ext mpinb
            In [2]: %mpi start -n 4
            MPI world of 4 ranks started in 2.6 s (MPICH Version: 5.0.2)
            In [3]: %mpi status
            MPI world of 4 ranks (MPICH Version: 5.0.2) via /env/bin/mpiexec
            rank  host  pid    state
               0  vm    81512  idle
            ...
            In [4]: %mpi start --mpi openmpi
            In [5]: %mpi stop
            In [6]: %mpi start -n 64 --launcher slurm --partition gpu --time 1:00:00 --ip 0.0.0.0
        """
        args = arguments.line_parser().parse_args(_split(line, "%mpi"))
        handler = getattr(self, f"_command_{args.command}", None) or getattr(self.commands, f"on_{args.command}")
        handler(args)

    def _command_start(self, args):
        dead = self.world.liveness.dead_text() if self.world is not None else None
        if dead:
            raise UsageError(f"the {self.world.size}-rank world is dead ({dead}): %mpi restart starts its ranks "
                             "again with their variables, %mpi restart --fresh or -n N without them, %mpi stop ends it")
        if self.world is not None and self.world.running:
            raise UsageError(
                f"a {self.world.size}-rank world is already running: %mpi restart -n N replaces it, "
                "%mpi stop ends it"
            )
        self.start(n=args.n, mpi=args.mpi, mpiexec=args.mpiexec, mpiexec_args=args.mpiexec_arg, ip=args.ip,
                   launcher=args.launcher, hostfile=args.hostfile, partition=args.partition,
                   time_limit=args.time, account=args.account, scheduler_args=args.scheduler_arg)

    def _command_stop(self, args):
        with stops.deferred():
            pressed = stops.presses()
            self.stop()
            if stops.presses() > pressed:
                print("[mpinb] Stop was pressed while the world stopped: stopping finished first, and every process "
                      "of the world has ended")

    def _command_restart(self, args):
        self.restart(n=args.n, fresh=args.fresh)

    def _command_run(self, args):
        """``%mpi run FILE ARGS``: the script as ``__main__`` on every rank, through the path a ``%%mpi`` cell
        takes (a one-line cell that calls ``mpinb.rank.run_script.run``), so everything a cell gets applies. Only
        whether the file exists is checked here: each rank reads it at its absolute path on its own host."""
        import os

        if args.file is None:
            raise UsageError("%mpi run takes a script: %mpi run [-n N] [--timeout S] [--trace] FILE [ARGS ...]")
        path = os.path.abspath(os.path.expanduser(args.file))
        where = "" if os.path.isabs(os.path.expanduser(args.file)) else \
            f" (relative to the notebook's directory {os.getcwd()})"
        if os.path.isdir(path):
            raise UsageError(f"%mpi run: {args.file} is a directory{where}: name the script in it")
        if not os.path.isfile(path):
            raise UsageError(f"%mpi run: no file {args.file}{where}")
        timeout = self.timeout if args.timeout is None else args.timeout
        if not math.isfinite(timeout) or timeout < 0:
            raise UsageError(f"--timeout takes seconds, a number of at least 0 (0: no limit), not {timeout:g}")
        with stops.deferred():  # a Stop while the world starts rolls the start back, said in one line
            self.ensure_world(n=args.n)
        cell = script_cells.cell(path, args.args)
        self._run_deferred(cell, ranks=None, stream=self.stream, gather=None, inspect=False, timeout=timeout,
                           trace=args.trace)

    # ------------------------------------------------------------------ %%mpi

    @cell_magic("mpi")
    @arguments.cell_arguments
    @_usage
    def mpi_cell(self, line="", cell=""):
        """Run the cell on every rank of the MPI world.

        ``comm`` (``MPI.COMM_WORLD``), ``rank`` and ``size`` are predefined; names a cell defines stay on
        each rank for the next cell. Output comes back labelled by rank; the value of a last expression
        comes back as a mapping rank → value. If any rank raises, the cell raises one ``RankError`` naming
        every failing rank (identical failures merged), and the world stays usable.

        Examples
        --------
        ::

            In [1]: %%mpi -n 4
               ...: print(f"hello from {rank} of {size}")
               ...: x = rank * 10
            [rank 0] hello from 0 of 4
            [rank 1] hello from 1 of 4
            [rank 2] hello from 2 of 4
            [rank 3] hello from 3 of 4

            In [2]: %%mpi --ranks 1-2
               ...: x + 1
            Out[2]:
            [rank 1] 11
            [rank 2] 21

            In [3]: %%mpi
               ...: 1 / 0
            RankError: cell failed on every rank it ran on (ranks 0-3)
            ranks 0-3: ZeroDivisionError: division by zero
        """
        _split(line, "%%mpi")  # unbalanced quotes are a usage error, not shlex's ValueError
        args = magic_arguments.parse_argstring(self.mpi_cell, line)
        for name in args.gather or ():
            if not name.isidentifier() or keyword.iskeyword(name):
                raise UsageError(f"--gather takes variable names, not {name!r}")
        timeout = self.timeout if args.timeout is None else args.timeout
        if not math.isfinite(timeout) or timeout < 0:
            raise UsageError(f"--timeout takes seconds, a number of at least 0 (0: no limit), not {timeout:g}")
        with stops.deferred():  # a Stop while the world starts rolls the start back, said in one line
            self.ensure_world(n=args.n)
        ranks = None
        if args.ranks is not None:
            try:
                ranks = parse_ranks(args.ranks, self.world.size)
            except ValueError as exc:
                raise UsageError(f"--ranks: {exc}") from None
        stream = self.stream if args.stream is None else args.stream
        result = self._run_deferred(cell, ranks=ranks, stream=stream, gather=args.gather, inspect=args.inspect,
                                    timeout=timeout, trace=args.trace, below_magic=True)
        if result.values:
            return result.values

    # ------------------------------------------------------------------ plain methods the magics call

    def start(self, *, n=None, mpi=None, mpiexec=None, mpiexec_args=None, ip=None, launcher=None, hostfile=None,
              partition=None, time_limit=None, account=None, scheduler_args=None):
        """Start a world of *n* ranks (``default_ranks`` if ``None``) and make it current; every other option
        left ``None`` takes its ``MPIMagics`` setting."""
        n = self.default_ranks if n is None else n
        placement = Placement(
            launcher=launcher or self.launcher,
            hostfile=hostfile or self.hostfile or None,
            partition=partition or self.partition or None,
            time=time_limit or self.time_limit or None,
            account=account or self.account or None,
            scheduler_args=self.scheduler_args if scheduler_args is None else scheduler_args,
        )
        if self.world is not None:  # a world that ended by itself: a fresh start, not its variables
            self.world.kept_state.forget()
        world = World(
            n,
            mpi=mpi or self.default_mpi or None,
            mpiexec=mpiexec or self.mpiexec or None,
            mpi_library=self.mpi_library or None,
            mpiexec_args=self.mpiexec_args if mpiexec_args is None else mpiexec_args,
            placement=placement,
            ip=ip or self.ip,
            heartbeat_ms=self.heartbeat_ms or None,
            start_timeout=self.start_timeout,
            threads=self.threads_per_rank,
            progress=lambda: views.Progress(notebook=in_notebook(self.shell)),
        )
        world.kept_state.configure(self.snapshots, limit=self.snapshot_limit, lag=self.snapshot_lag)
        self.world = world  # also when its start is interrupted: the next %%mpi starts it again, of this size
        try:
            _timed_start(world.start)
        except StartInterrupted:
            raise
        except BaseException:
            self.world = None  # a start that failed is not tried again by itself
            world.kept_state.forget()  # nor leaves its snapshot folder (no reaper watches it if the kernel is killed)
            raise
        self.history = History()
        return world

    def _run_deferred(self, cell, **options):
        """:meth:`run` with Stops acted on at its safe points (a Stop between them, while results are shown, is
        too late to stop anything and is let go)."""
        with stops.deferred():
            return self.cells.run(cell, **options)

    def stop(self):
        if self.world is not None:
            self.world.kept_state.forget()
        if self.world is None or not self.world.running:
            self.world = None  # a world that ended by itself is forgotten too: the next start takes -n or the default
            print("no MPI world is running")
            return
        size = self.world.size
        self.world.stop()
        self.world = None
        print(f"MPI world of {size} rank{'s' if size != 1 else ''} stopped")

    def restart(self, *, n=None, fresh=False):
        """New ranks (of *n*, or as many as before), also for a world that ended by itself (a rank died, three
        Stops, an interrupted start), with every rank's variables as of the last cell every rank finished and kept,
        unless *fresh*."""
        if self.world is None:
            raise UsageError("no MPI world to restart: %mpi start -n N starts one")
        for line in self.start_again(n=n, fresh=fresh, timed=True):
            print(line)
        self.history = History()

    def start_again(self, *, n=None, fresh=False, kill=False, timed=False):
        """Start the current world again (of *n* ranks, or as many as before) and put back every rank's variables
        as of the last cell every rank finished and kept, unless *fresh*: the one way a world is started again,
        whether the user asked (``%mpi restart``) or mpinb had to (a mismatch MPI completed, ranks stuck in C, a
        world ended by Stops). A world that still answers writes its pending snapshots first. *kill* ends the old
        ranks with SIGKILL; *timed* says how long the start took. Returns the lines that say what came back."""
        from ..rank import snapshots

        world = self.world
        world.kept_state.configure(self.snapshots, limit=self.snapshot_limit, lag=self.snapshot_lag)
        if not fresh and world.state is State.IDLE:
            try:
                self.commands.on_every_rank(snapshots.flush)
            except KeyboardInterrupt:
                raise StartInterrupted("the restart was stopped before the world was: the world and every rank's "
                                       "variables are as they were") from None
            except MPIError:  # a rank that went away meanwhile: the start that follows says so
                pass
        start = (lambda: world.restart(size=n, kill=kill))
        if timed:
            _timed_start(start)
        else:
            start()
        try:
            return kept_state.restore(world, self.commands.on_every_rank, fresh=fresh)
        except KeyboardInterrupt:  # the next start restores the same cell: what the ranks hold of it may be partial
            raise StartInterrupted(f"the restore was stopped: the world of {world.size} ranks runs, and its variables "
                                   "may be partly back; %mpi restart brings back all of them (they are still kept), "
                                   "%mpi restart --fresh starts empty") from None

    def ensure_world(self, *, n=None):
        """The running world; start one of *n* ranks if there is none. A size mismatch is a ``UsageError``."""
        if self.world is not None and self.world.running:
            if n is not None:
                check_size(n, self.world.placement)
            dead = self.world.liveness.dead_text() if n is not None and n != self.world.size else None
            if dead:
                raise UsageError(
                    f"the {self.world.size}-rank world is dead ({dead}): %mpi restart -n {n} starts {n} new ranks "
                    f"(the {self.world.size} ranks' variables are kept for a restart of {self.world.size})")
            if n is not None and n != self.world.size:
                raise UsageError(
                    f"a {self.world.size}-rank world is running, not {n}: %mpi restart -n {n} replaces it "
                    f"(all rank variables are lost), or drop -n to use the running world"
                )
            return self.world
        world = self.world
        if world is not None and world.lifecycle.ended and n in (None, world.size):
            # the world ended without being asked to (three Stops, an interrupted restart): the same world again,
            # with its variables
            for line in self.start_again(timed=True):
                print(line)
            return world
        return self.start(n=n)

    def view_kind(self):
        """How cells show what they draw: ``widgets``, ``text`` or ``off`` (``live_view``, ``auto`` resolved)."""
        return self.live_view if self.live_view != "auto" else ("widgets" if in_notebook(self.shell) else "text")

    # what the last cell left, and the commands that look at the world, for code in the notebook (mpinb.metrics(),
    # mpinb.view(), mpinb.trace()) and for tests

    @property
    def last(self):
        """The last cell's :class:`~mpinb.notebook.cell.dispatch.CellResult` (``None`` before the first)."""
        return self.cells.last

    @property
    def live(self):
        """The last cell's :class:`~mpinb.notebook.cell.live.LiveMetrics` (its view, if it drew one)."""
        return self.cells.live

    @property
    def last_trace(self):
        """The last traced cell's trace."""
        return self.cells.last_trace

    def run(self, cell, **options):
        """Run *cell* on the ranks (:meth:`CellRunner.run`)."""
        return self.cells.run(cell, **options)

    def world_view(self):
        return self.commands.world_view()

    def show_status(self):
        return self.commands.show_status()

    def show_grads(self, model):
        return self.commands.show_grads(model)

    def show_who(self):
        return self.commands.show_who()

    def show_metrics(self, *, run=None):
        return self.commands.show_metrics(run=run)

    def debug(self, rank, *, panel=False):
        return self.commands.debug(rank, panel=panel)


def _timed_start(start):
    """Call *start* (which returns a started World) and say how big it is and how long it took."""
    tic = time.perf_counter()
    world = start()
    n = world.size
    print(f"MPI world of {n} rank{'s' if n != 1 else ''} started in {time.perf_counter() - tic:.1f} s "
          f"({world.identities[0]['mpi']})")
    return world


def _split(line, magic):
    """*line* split as a shell would; unbalanced quotes are a ``UsageError``."""
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"{magic} {line}: {str(exc).lower()} (close the quote, or escape it with \\)") from None
