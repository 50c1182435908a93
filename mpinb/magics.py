"""``%mpi`` and ``%%mpi``: parse arguments, then hand over to plain functions in cluster.py and execute.py."""

import shlex
import sys
import time

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser
from IPython.display import display
from traitlets import Bool, Enum, Float, Integer, List, Unicode

from . import execute
from .cluster import World
from .live import LiveMetrics
from .output import RankPrinter
from .ranks import parse_ranks
from .widgets.history import History
from .widgets.status import status_text, status_widget
from .widgets.summary import summary_text


@magics_class
class MPIMagics(Magics):
    """Drive an MPI world from IPython. Configure with ``%config MPIMagics.<option> = value``."""

    default_ranks = Integer(2, config=True, help="Ranks started by %%mpi when no world runs and -n is not given.")
    mpiexec = Unicode(
        "", config=True,
        help="mpiexec to launch with (name or path). Empty: the one beside this Python (mpich wheel), else PATH.",
    )
    mpiexec_args = List(Unicode(), config=True, help="Extra mpiexec arguments, e.g. ['--oversubscribe'].")
    ip = Unicode("127.0.0.1", config=True, help="Address the controller listens on; loopback unless you ask.")
    start_timeout = Float(60.0, config=True, help="Seconds to wait for all ranks to come up.")
    heartbeat_ms = Integer(500, config=True, help="Controller-engine heartbeat period in milliseconds.")
    stream = Bool(True, config=True, help="Print rank output while the cell runs (else in rank order at the end).")
    interrupt_grace = Float(5.0, config=True, help="Seconds ranks get to stop after an interrupt before giving up.")
    report_interval = Float(0.1, config=True, help="Seconds each rank buffers mpinb.report() values between sends.")
    refresh_interval = Float(0.25, config=True, help="Seconds between redraws of the live metric charts at most.")
    max_points = Integer(1000, config=True, help="Points drawn per curve at most (the history keeps every value).")
    live_view = Enum(["auto", "widgets", "text", "off"], "auto", config=True,
                     help="How mpinb.report() values show while a cell runs: auto (widgets in a notebook, text in "
                          "a terminal), widgets, text, or off (only kept for mpinb.metrics()).")

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell=shell, **kwargs)
        self.world = None
        self.last = None  # the last cell's CellResult
        self.live = None  # the last cell's LiveMetrics (its view, if it drew one)
        self.history = History()

    # ------------------------------------------------------------------ %mpi

    @line_magic
    def mpi(self, line=""):
        """Start, stop and inspect the MPI world.

        Usage::

            %mpi start [-n N] [--mpiexec PATH] [--mpiexec-arg ARG ...]
            %mpi stop
            %mpi restart [-n N]
            %mpi status
            %mpi output
            %mpi metrics [--run NAME]

        ``start`` launches N ranks (default ``MPIMagics.default_ranks``) with mpiexec, one ipyparallel engine
        per rank; ``comm``, ``rank`` and ``size`` are predefined on each. ``restart`` gives fresh processes
        (every rank's variables are lost), of a new size with ``-n``. ``status`` lists rank, host, pid and
        state. ``output`` shows the last cell's output rank by rank. ``metrics`` shows the charts and per-rank
table of everything ``mpinb.report()`` sent in this world (``mpinb.metrics()`` gives it as a DataFrame).
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
            In [4]: %mpi start --mpiexec /usr/bin/mpiexec.openmpi --mpiexec-arg=--oversubscribe
            In [5]: %mpi stop
        """
        args = _line_parser().parse_args(shlex.split(line))
        if args.command == "start":
            if self.world is not None and self.world.running:
                raise UsageError(
                    f"a {self.world.size}-rank world is already running: %mpi restart -n N replaces it, "
                    "%mpi stop ends it"
                )
            self.start(n=args.n, mpiexec=args.mpiexec, mpiexec_args=args.mpiexec_arg)
        elif args.command == "stop":
            self.stop()
        elif args.command == "restart":
            self.restart(n=args.n)
        elif args.command == "status":
            self.show_status()
        elif args.command == "output":
            if self.last is None:
                print("no %%mpi cell has run yet")
            else:
                print(self.last.rank_ordered())
        elif args.command == "metrics":
            self.show_metrics(run=args.run)

    # ------------------------------------------------------------------ %%mpi

    @magic_arguments.magic_arguments(name="mpi")
    @magic_arguments.argument("-n", type=int, default=None,
                              help="number of ranks; starts a world of that size if none is running")
    @magic_arguments.argument("--ranks", default=None,
                              help="run on these ranks only: 0,2 or 1-3 (default: all)")
    @magic_arguments.argument("--no-stream", dest="stream", action="store_false", default=None,
                              help="collect output and print it rank by rank when the cell ends")
    @magic_arguments.argument("--stream", dest="stream", action="store_true", default=None,
                              help="print output as it arrives, each line labelled [rank R] (default)")
    @cell_magic("mpi")
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
            RankError: cell failed on ranks 0-3 of 0-3
            ranks 0-3: ZeroDivisionError: division by zero
        """
        args = magic_arguments.parse_argstring(self.mpi_cell, line)
        self.ensure_world(n=args.n)
        ranks = None
        if args.ranks is not None:
            try:
                ranks = parse_ranks(args.ranks, self.world.size)
            except ValueError as exc:
                raise UsageError(f"--ranks: {exc}") from None
        stream = self.stream if args.stream is None else args.stream
        result = self.run(cell, ranks=ranks, stream=stream)
        if result.values:
            return result.values

    # ------------------------------------------------------------------ plain methods the magics call

    def start(self, *, n=None, mpiexec=None, mpiexec_args=None):
        """Start a world of *n* ranks (``default_ranks`` if ``None``) and make it current."""
        n = self.default_ranks if n is None else n
        if n < 1:
            raise UsageError(f"-n must be at least 1, not {n}")
        world = World(
            n,
            mpiexec=mpiexec or self.mpiexec or None,
            mpiexec_args=self.mpiexec_args if mpiexec_args is None else mpiexec_args,
            ip=self.ip,
            heartbeat_ms=self.heartbeat_ms,
            start_timeout=self.start_timeout,
        )
        self.world = _timed_start(world.start)
        self.history = History()
        return world

    def stop(self):
        if self.world is None or not self.world.running:
            print("no MPI world is running")
            return
        size = self.world.size
        self.world.stop()
        self.world = None
        print(f"MPI world of {size} rank{'s' if size != 1 else ''} stopped")

    def restart(self, *, n=None):
        if self.world is None:
            raise UsageError("no MPI world to restart: %mpi start -n N starts one")
        _timed_start(lambda: self.world.restart(size=n))
        self.history = History()

    def ensure_world(self, *, n=None):
        """The running world; start one of *n* ranks if there is none. A size mismatch is a ``UsageError``."""
        if self.world is not None and self.world.running:
            if n is not None and n != self.world.size:
                raise UsageError(
                    f"a {self.world.size}-rank world is running, not {n}: %mpi restart -n {n} replaces it "
                    f"(all rank variables are lost), or drop -n to use the running world"
                )
            return self.world
        return self.start(n=n)

    def run(self, cell, *, ranks=None, stream=True):
        """Run *cell* on *ranks* of the current world; raise ``RankError`` if any rank failed."""
        printer = RankPrinter(color=_color(self.shell))
        view = self.live_view if self.live_view != "auto" else ("widgets" if _in_notebook(self.shell) else "text")
        self.live = metrics = LiveMetrics(self.history, view=view, refresh_interval=self.refresh_interval,
                              max_points=self.max_points)
        # IPython counts the running cell before executing it: In[n] runs while execution_count is n + 1
        number = max(getattr(self.shell, "execution_count", 1) - 1, 0)
        self.last = result = execute.run_cell(
            self.world, cell, ranks=ranks, number=number, stream=stream, printer=printer, metrics=metrics,
            options={"report_interval": self.report_interval}, interrupt_grace=self.interrupt_grace,
        )
        if not stream:
            print(result.rank_ordered())
        result.raise_for_errors()
        return result

    def show_status(self):
        if self.world is None or not self.world.running:
            print("no MPI world is running: %mpi start -n N starts one")
            return
        rows = self.world.status()
        header = self.world.describe()
        if _in_notebook(self.shell):
            display(status_widget(rows, header))
        else:
            print(status_text(rows, header))

    def show_metrics(self, *, run=None):
        """Charts and table (text in a terminal) of *run*, or of every run reported in this world."""
        runs = self.history.runs()
        if run is not None:
            if run not in runs:
                raise UsageError(f"no run {run!r} in this world's metrics; runs: {', '.join(runs) or 'none yet'}")
            runs = [run]
        if not runs:
            print("no metrics reported in this world yet: call mpinb.report(loss=...) in a %%mpi cell")
            return
        if _in_notebook(self.shell):
            from .widgets.charts import MetricsWidget

            view = MetricsWidget(self.history, max_points=self.max_points)
            for name in runs:
                view.show(name)
            view.refresh(live=False)
            display(view.widget)
        else:
            print("\n".join(summary_text(self.history, name) for name in runs))


def _timed_start(start):
    """Call *start* (which returns a started World) and say how big it is and how long it took."""
    tic = time.perf_counter()
    world = start()
    n = world.size
    print(f"MPI world of {n} rank{'s' if n != 1 else ''} started in {time.perf_counter() - tic:.1f} s "
          f"({world.identities[0]['mpi']})")
    return world


def _line_parser():
    parser = MagicArgumentParser(prog="%mpi", description="Start, stop and inspect the MPI world.")
    commands = parser.add_subparsers(dest="command", metavar="{start,stop,restart,status,output,metrics}")
    commands.required = True
    start = commands.add_parser("start", help="start a world of N ranks")
    start.add_argument("-n", type=int, default=None, help="number of ranks (default: MPIMagics.default_ranks)")
    start.add_argument("--mpiexec", default=None, help="mpiexec to use, for a system MPI")
    start.add_argument("--mpiexec-arg", action="append", default=None, help="extra mpiexec argument (repeatable)")
    commands.add_parser("stop", help="stop the world and every process it started")
    restart = commands.add_parser("restart", help="fresh processes, same size unless -n")
    restart.add_argument("-n", type=int, default=None, help="new number of ranks")
    commands.add_parser("status", help="rank, host, pid and state of every rank")
    commands.add_parser("output", help="the last cell's output, rank by rank")
    metrics = commands.add_parser("metrics", help="charts and per-rank table of what mpinb.report() sent")
    metrics.add_argument("--run", default=None, help="only this run (default: all)")
    return parser


def _in_notebook(shell):
    """A kernel with a frontend that renders widgets (terminal IPython has no ``kernel``)."""
    return getattr(shell, "kernel", None) is not None


def _color(shell):
    if _in_notebook(shell):
        return False
    return sys.stderr.isatty() and getattr(shell, "colors", "nocolor").lower() != "nocolor"
