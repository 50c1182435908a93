"""``%mpi`` and ``%%mpi``: parse arguments, then hand over to cluster.py for the world and to
two helpers it is composed of: running.py for a cell, world_commands.py for the commands that look at a world.
Their settings are in settings.py, ``%mpi``'s help and how a usage error shows in usage.py."""

import keyword
import math
import time

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from ..errors import MPIError, StartInterrupted
from ..widgets import views
from ..wire import script_cells
from ..wire.ranks import parse_ranks
from . import arguments, stops
from .world import kept_state
from .world import Placement, State, World, check_size
from .frontend import in_notebook
from .models import History
from .running import CellRunner
from .settings import MPISettings
from .usage import MPI_HELP, helped, split, usage_errors
from .world_commands import WorldCommands


@magics_class
class MPIMagics(Magics, MPISettings):
    """Drive an MPI world from IPython. Configure with ``%config MPIMagics.<option> = value``."""

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
    @usage_errors
    @helped(MPI_HELP)
    def mpi(self, line=""):
        args = arguments.line_parser().parse_args(split(line, "%mpi"))
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
    @usage_errors
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
        split(line, "%%mpi")  # unbalanced quotes are a usage error, not shlex's ValueError
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

