"""The ``%mpi`` commands that look at a running world without changing it: ``status``, ``output``, ``metrics``,
``grads``, ``who``, ``stacks``, ``trace``, ``view`` and ``debug``."""

import re

from IPython.core.error import UsageError
from IPython.display import display

from ..widgets import views
from ..widgets.status import status_html, status_text
from ..wire.kinds import Call, CellOptions
from .cell import dispatch
from .debug import visual_debugger
from .frontend import colored, in_notebook
from .world import status
from .cell import LiveMetrics, RankPrinter, show_trace

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class WorldCommands:
    """``%mpi``'s commands that look at the world of *magics* (:class:`~mpinb.notebook.magics.MPIMagics`), which
    they read and never write: ``world``, ``history``, ``shell``, ``view_kind()``, the settings ``interrupt_grace``
    and ``max_points``; what the last cell left is read from *cells* (:class:`~mpinb.notebook.running.CellRunner`).
    ``on_<command>(args)`` answers ``%mpi <command>``."""

    def __init__(self, magics, cells):
        self.magics, self.cells = magics, cells

    def on_status(self, args):
        self.show_status()

    def on_output(self, args):
        if self.cells.last is None:
            print("no %%mpi cell has run yet")
        else:
            print(self.cells.last.rank_ordered())

    def on_metrics(self, args):
        self.show_metrics(run=args.run)

    def on_grads(self, args):
        self.show_grads(args.model)

    def on_who(self, args):
        self.show_who()

    def on_stacks(self, args):
        self.show_stacks(args.ranks)

    def on_inject(self, args):
        self.inject(args.kind, rank=args.rank, at=args.at, delay=args.delay, scale=args.scale)

    def on_debug(self, args):
        if args.panel_rank is not None:
            self.panel_rank(args.panel_rank)
        if args.rank is not None:
            self.debug(args.rank, panel=args.panel)
        elif args.panel_rank is None:
            raise UsageError("%mpi debug R debugs rank R's last failed cell (--panel: in JupyterLab's debugger); "
                             "%mpi debug --rank R chooses the rank the debugger panel shows")

    def on_trace(self, args):
        if self.cells.last_trace is None:
            print("no traced cell yet: %%mpi --trace records every rank's MPI calls for one cell")
        elif self.magics.view_kind() == "widgets":  # zoomable while the kernel lives; the static rendering for the file
            from ..widgets import timeline
            from .models import summarize

            timeline.show(self.cells.last_trace, summarize(self.cells.last_trace))
        else:
            show_trace(self.cells.last_trace, view=self.magics.view_kind())

    def on_view(self, args):
        self.world_view().activate()
        print("%px and %%px now run on every rank of this world (ipyparallel labels their output by engine "
              "id); mpinb.view() is the same view")

    def world_view(self):
        """ipyparallel's DirectView of the running world, one target per rank in rank order."""
        return self._running_world().view

    def show_status(self):
        world = self.magics.world
        if world is None or not world.running:
            if world is not None and world.lifecycle.ended:  # ended without being asked to: say why, and what next
                print(f"no MPI world is running: the last one, of {world.size} rank{'s' if world.size != 1 else ''},"
                      f" stopped because {world.lifecycle.ended}; the next %%mpi starts {world.size} again "
                      "(%mpi start -n N: another size)")
            else:
                print("no MPI world is running: %mpi start -n N starts one")
            return
        rows = status.rank_states(world)
        first, _, rest = status.describe(world).partition("\n")
        header = f"{first}; {world.state}\n{rest}"  # its lifecycle state: idle between cells
        if in_notebook(self.magics.shell):
            display({"text/html": status_html(rows, header), "text/plain": status_text(rows, header)}, raw=True)
        else:
            print(status_text(rows, header))

    def show_grads(self, model):
        """Layer × rank gradient view of the module called *model* on every rank (statistics only travel)."""
        if not _DOTTED.match(model):
            raise UsageError(f"%mpi grads takes the model's name on the ranks (model, trainer.model), not {model!r}")
        self._running_world()
        from ..rank.grads import grad_stats
        from ..widgets.grads import grad_report, grads_text, grads_widget

        result = self._on_ranks(grad_stats, model)
        problems = {error["evalue"] for error in result.errors.values() if error["ename"] == "NotComparable"}
        if problems:  # grad_stats named the ranks and the cause, the same on every rank
            raise UsageError(f"%mpi grads {model}: {problems.pop()}")
        result.raise_for_errors()
        reports = grad_report(dict(result.values))
        if in_notebook(self.magics.shell):
            from ..widgets.static import grads_bundle

            views.show_at_end(lambda: grads_widget(reports), lambda: grads_bundle(reports), name="gradient view")
        else:
            print(grads_text(reports))
        return reports

    def _running_world(self):
        """The running world, or a ``UsageError`` saying how to start one."""
        if self.magics.world is None or not self.magics.world.running:
            raise UsageError("no MPI world is running: %mpi start -n N starts one")
        return self.magics.world

    def _on_ranks(self, function, *args, ranks=None):
        """Call mpinb's own rank-side *function* (``%mpi grads``, ``who``, ``debug``) with *args* on *ranks*, as a
        cell whose value is what it returns: no code is sent, only the function's name; no mismatch roll call."""
        magics = self.magics
        return dispatch.dispatch(magics.world, "", ranks=ranks, printer=RankPrinter(color=colored(magics.shell)),
                                 interrupt_grace=magics.interrupt_grace, collective_wait=None,
                                 options=CellOptions(call=Call.of(function, *args)))

    def on_every_rank(self, function, *args):
        """The result of mpinb's own rank-side *function* called with *args* on every rank (``kept_state``)."""
        return self._on_ranks(function, *args)

    def show_who(self):
        """Every name on the ranks: type, shape, dtype and a content hash per rank, names that differ flagged."""
        self._running_world()
        from ..rank.who import who
        from ..widgets.who import who_html, who_report, who_text

        result = self._on_ranks(who)
        result.raise_for_errors()
        rows = who_report(dict(result.values))
        if in_notebook(self.magics.shell):
            display({"text/html": who_html(rows), "text/plain": who_text(rows)}, raw=True)
        else:
            print(who_text(rows))
        return rows

    def show_stacks(self, ranks="all"):
        """Where each of *ranks* (``"0-3"``, ``"1,3"``; default every rank) is: its main thread's Python frames and
        native ones (py-spy), identical stacks merged (``native/report.py``). Read from outside the ranks, so it
        answers while a cell runs, for ranks stuck in C as well."""
        from ..wire.ranks import parse_ranks
        from .diagnosis.native import stacks

        world = self._running_world()
        try:
            chosen = parse_ranks(ranks, world.size)
        except ValueError as error:
            raise UsageError(f"%mpi stacks: {error}") from None
        print(stacks(world, chosen, _running_cell(self.magics.shell)))

    def debug(self, rank, *, panel=False):
        """pdb in *rank*'s last failed cell, its prompt answered here (``p x``, ``up``, ``l``, ``q``); with *panel*,
        its frames in JupyterLab's debugger panel until Continue there. The other ranks are left as they are."""
        self._running_world()
        if rank not in self.magics.world.ranks:
            raise UsageError(f"%mpi debug takes a rank of this world (0-{self.magics.world.size - 1}), not {rank}")
        if panel:
            if visual_debugger.setup() is None:
                raise UsageError("%mpi debug R --panel shows the rank in JupyterLab's debugger panel: switch the "
                                 "debugger on first (the bug icon in the notebook's toolbar), or use %mpi debug R")
            from ..rank.debug.visual_debugger import post_mortem
        else:
            from ..rank.debug.post_mortem import post_mortem

        result = self._on_ranks(post_mortem, ranks=[rank])
        result.raise_for_errors()

    def inject(self, kind, *, rank=None, at=1, delay=0.1, scale=1e-3):
        """Plant a fault of *kind* on *rank* (``rank/faults.py``), remove every fault (``clear``), or, with no
        *kind*, say what is planted where."""
        from ..rank import faults

        self._running_world()
        world = self.magics.world
        if kind == "clear":
            result = self._on_ranks(faults.clear)
            result.raise_for_errors()
            removed = sum(dict(result.values).values())
            print(f"removed {removed} fault{'s' if removed != 1 else ''}: the ranks run as written")
            return
        if kind is None:
            result = self._on_ranks(faults.planted)
            result.raise_for_errors()
            lines = [f"rank {r} {what}" for r, planted in sorted(dict(result.values).items()) for what in planted]
            print("\n".join(lines) if lines else "no fault is planted (%mpi inject KIND --rank R plants one)")
            return
        if rank is None or rank not in world.ranks:
            raise UsageError(f"%mpi inject {kind} takes --rank R, a rank of this world (0-{world.size - 1})")
        result = self._on_ranks(faults.plant, kind, at, delay, scale, ranks=[rank])
        result.raise_for_errors()
        print(f"rank {rank} {dict(result.values)[rank]}; %mpi inject clear removes it")

    def panel_rank(self, rank):
        """Make *rank* the one JupyterLab's debugger panel shows when ranks stop at its breakpoints."""
        world = self.magics.world
        if rank < 0 or world is not None and rank not in world.ranks:
            raise UsageError(f"%mpi debug --rank takes a rank of this world (0-{world.size - 1}), not {rank}")
        if visual_debugger.current is None:
            raise UsageError("this kernel has no visual debugger (ipykernel 6 or later with debugpy has one): "
                             "%mpi debug R debugs a rank with pdb instead")
        visual_debugger.current.rank = rank
        print(f"JupyterLab's debugger panel shows rank {rank} when it stops at a breakpoint (another rank when "
              f"rank {rank} does not stop)")

    def show_metrics(self, *, run=None):
        """Charts and table (text in a terminal) of *run*, or of every run reported in this world."""
        runs = self.magics.history.runs()
        if run is not None:
            if run not in runs:
                raise UsageError(f"no run {run!r} in this world's metrics; runs: {', '.join(runs) or 'none yet'}")
            runs = [run]
        if not runs:
            print("no metrics reported in this world yet: call mpinb.report(loss=...) in a %%mpi cell")
            return
        view = "widgets" if in_notebook(self.magics.shell) else "text"
        LiveMetrics(self.magics.history, view=view, max_points=self.magics.max_points, runs=runs).finish()


def _running_cell(shell):
    """The text of the last ``%%mpi`` cell the user ran (the one running, when ``%mpi stacks`` is asked while it
    runs), whose line N is the editor's line N; ``""`` when there is none."""
    history = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None) or []
    return next((cell for cell in reversed(history) if cell.lstrip().startswith("%%mpi")), "")
