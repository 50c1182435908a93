"""A ``%%mpi`` cell from the magics to the ranks and back: the options it travels with, its live views, its
gathered values assigned in the notebook, and what to do when ranks stayed stuck."""


import sys

from ..errors import Interrupted, MPIError, StartInterrupted
from ..widgets import views
from ..wire.kinds import AgentSettings, CellOptions, GatherRequest
from .cell import dispatch
from .debug import visual_debugger
from .frontend import colored, in_notebook
from .cell import CellStatus, LiveMetrics, LiveTrace, RankPrinter


class CellRunner:
    """Runs ``%%mpi`` cells for *magics* (:class:`~mpinb.notebook.magics.MPIMagics`), which it reads and never
    writes: ``world`` (restarted here when ranks stay stuck), ``history``, ``shell``, ``view_kind()`` and the
    settings ``report_interval``, ``collective_wait``, ``trace_buffer``, ``interrupt_grace``, ``status_after``,
    ``abort_grace``, ``refresh_interval``, ``max_points``, ``gather_transport``.

    Keeps what the last cell left: ``last`` (its :class:`~mpinb.notebook.cell.dispatch.CellResult`), ``live`` (its
    :class:`~mpinb.notebook.cell.live.LiveMetrics`) and ``last_trace`` (the last traced cell's trace)."""

    def __init__(self, magics):
        self.magics = magics
        self.last = None
        self.live = None
        self.last_trace = None

    def forget(self):
        """Let go of the last cell's result (and what its values hold)."""
        self.last = None

    def run(self, cell, *, ranks=None, stream=True, gather=None, inspect=True, timeout=0.0, trace=False,
            below_magic=False):
        """Run *cell* on *ranks* of the current world; raise ``RankError`` if any rank failed.

        *below_magic*: *cell* is the body of a ``%%mpi`` cell, whose line 1 is the magic's: the ranks run it a line
        down, so that every line number anyone shows (tracebacks, pdb, mpinb's own messages, the debugger panel)
        is the editor's.

        Each name in *gather* becomes a ``PerRank`` in the user namespace (the ranks that had it), shown in the
        tensor inspector when *inspect*; names missing or untransferable on some ranks raise ``GatherError``
        after the others are assigned. With *trace*, every rank's MPI calls are recorded and shown as a
        timeline when the cell ends, failed or not (``last_trace``).
        """
        magics = self.magics
        printer = RankPrinter(color=colored(magics.shell))
        view = magics.view_kind()
        self.live = metrics = LiveMetrics(magics.history, view=view, refresh_interval=magics.refresh_interval,
                                          max_points=magics.max_points)
        # IPython counts the running cell before executing it: In[n] runs while execution_count is n + 1
        number = max(getattr(magics.shell, "execution_count", 1) - 1, 0)
        magics.history.begin_cell()
        cell, options = self._options(cell, ranks=ranks, gather=gather, inspect=inspect, trace=trace,
                                      below_magic=below_magic)
        tracer = LiveTrace(view=view) if trace else None
        try:
            self.last = result = dispatch.dispatch(
                magics.world, cell, ranks=ranks, number=number, stream=stream, printer=printer, metrics=metrics,
                options=options, timeout=timeout or None, interrupt_grace=magics.interrupt_grace,
                status=CellStatus(magics.history, widgets=view == "widgets", after=magics.status_after),
                abort_grace=magics.abort_grace if magics.abort_grace >= 0 else None,
                collective_wait=magics.collective_wait or None, trace=tracer,
                progress=lambda: views.Progress(notebook=in_notebook(magics.shell)),
            )
        except KeyboardInterrupt as exc:
            stopped = getattr(exc, "mpinb_result", None)
            if stopped is None:
                raise
            raise self._interrupted(stopped, tracer) from None
        return self._finish(result, number=number, stream=stream, tracer=tracer, inspect=bool(gather and inspect))

    def _options(self, cell, *, ranks, gather, inspect, trace, below_magic):
        """*cell* as the ranks run it (a line down when *below_magic*), and the :class:`CellOptions` it travels
        with: the agent's settings, its source as IPython transformed it (once here, not by every rank), what to
        gather and trace, and the debugger panel's set-up."""
        magics = self.magics
        source = _transformed(magics.shell, cell)
        if below_magic:  # after IPython's transform, which drops leading blank lines
            unchanged, cell = source is cell, "\n" + cell
            source = cell if unchanged else None if source is None else "\n" + source
        options = CellOptions(
            settings=AgentSettings(magics.report_interval, magics.collective_wait or None,
                                   magics.world.kept_state.last_complete,
                                   magics.world.kept_state.snapshot_due(magics.snapshot_lag)),
            source=source, trace=bool(trace),
            trace_buffer=magics.trace_buffer if trace else None,
            gather=GatherRequest(tuple(gather), self.transport(ranks), self._root(), bool(inspect)) if gather
            else None, debug=visual_debugger.setup())
        return cell, options

    def _interrupted(self, stopped, tracer):
        """The ``Interrupted`` a cell the user stopped raises, once what it left is kept and the world is usable
        again."""
        self.last = stopped
        if tracer is not None:
            self.last_trace = tracer.finish(stopped.ranks)
        notes = self._recover(stopped)
        return Interrupted(stopped.errors, stopped.ranks, notes=stopped.notes(notes), first=stopped.first_death)

    def _finish(self, result, *, number, stream, tracer, inspect):
        """What a cell the ranks replied to leaves: its snapshots kept when every rank finished, its output in rank
        order unless streamed, its trace, its gathered values in the user's namespace (in the tensor inspector when
        *inspect*); then the ranks' errors raised. Returns *result*."""
        world = self.magics.world
        if not result.errors and result.trouble is None and list(result.ranks) == list(world.ranks):
            world.kept_state.finished(result.cell_id, number)  # every rank's snapshot of it is kept
        if not stream:
            print(result.rank_ordered())
        if tracer is not None:
            self.last_trace = tracer.finish(result.ranks)
        self.magics.shell.user_ns.update(result.gathered)
        for note in result.gather_notes + result.warnings:
            print(f"[mpinb] {note}", file=sys.stderr)
        if inspect and result.gathered:
            self._show_inspector(result)
        try:
            result.raise_for_errors(notes=self._recover(result))
            result.raise_for_gather_errors()
        finally:
            # the values are the user's now: held here too (last), they would keep the ranks' shared
            # memory they are views of after the user dropped them
            result.gathered = {name: None for name in result.gathered}
        return result

    def _recover(self, result):
        """Make the world usable again after *result*: keep it, end it (Stop pressed three times) or start it again
        with every rank's variables (ranks stuck after the interrupt, or a world MPI left inconsistent); return
        what to tell the user (the cell's error says it, once: it is not printed as well)."""
        from ..wire.ranks import label_ranks

        size = self.magics.world.size
        if result.ended:
            self.magics.world.stop(kill=True)
            self.magics.world.lifecycle.end(f"{result.ended} during a cell, which ended it")
            return [f"{result.ended}: the world of {size} ranks was ended (its ranks killed); the next %%mpi starts "
                    f"{size} ranks again, with every rank's variables as of the last cell every rank finished and "
                    "kept"]
        if result.inconsistent and result.inconsistent == result.mismatch:
            # the diagnosis first: the start that follows takes seconds
            print(f"[mpinb] CollectiveMismatch: {result.inconsistent}", file=sys.stderr, flush=True)
            return self._restart("MPI completed collectives that did not match, which leaves messages in flight "
                                 "that later calls would receive")
        if result.inconsistent:
            return self._restart(f"{result.inconsistent}, which leaves messages in flight that later calls would "
                                 "receive")
        if not result.stuck:
            if not result.recovered:
                return []
            return [f"{result.recovered}, once the other ranks completed what they waited for: the world and every "
                    "rank's variables are kept (the values that call left are not meaningful)"]
        why = f" ({result.unrecoverable})" if result.unrecoverable else ""
        return self._restart(f"{label_ranks(result.stuck)} did not answer the interrupt (blocked in MPI or C){why}")

    def _restart(self, why):
        """Start the world again because of *why*, with every rank's variables (said at once, before the start
        begins: the diagnosis is not held up by it); return the notes that say what happened."""
        size = self.magics.world.size
        print(f"[mpinb] {why}: starting the world's {size} ranks again, with every rank's variables as of the last "
              "cell every rank finished and kept", file=sys.stderr, flush=True)
        try:
            lines = self.magics.start_again(kill=True)
        except StartInterrupted:
            return [f"{why}, so the world was stopped; its restart was interrupted, so no world is running: the next "
                    f"%%mpi starts {size} ranks again, with their variables"]
        except MPIError as exc:
            self.magics.world.lifecycle.end(f"its restart failed: {exc}")
            return [f"{why}, so the world was stopped, and its restart failed: {exc}; the next %%mpi tries again, "
                    "with every rank's variables"]
        return [f"{why}, so the world was started again with {size} new ranks; the notebook's variables and "
                "mpinb.metrics() are kept", *(line.removeprefix("[mpinb] ") for line in lines)]

    def transport(self, ranks):
        """How a gather from *ranks* (``None``: all) travels: ``gather_transport``, ``auto`` resolved (shared memory
        when every rank shares the notebook's host; one MPI gather to a rank that does when some do; else each
        rank sends its own, and always rank by rank for a subset)."""
        transport, world = self.magics.gather_transport, self.magics.world
        if transport == "auto":
            # With no rank beside the notebook, an MPI gather only adds a hop: every byte crosses the notebook's
            # link once either way, and each rank seals its own bytes at once rather than one rank all of them
            # after the gather (benchmarks/hosts.py: 4 x 8 MB from two other hosts, frames 1.8x faster)
            asked = world.ranks if ranks is None else list(ranks)
            local = world.local_ranks(asked)
            transport = "shm" if len(local) == len(asked) else "mpi" if local else "frames"
        if transport == "mpi" and ranks is not None and len(ranks) != self.magics.world.size:
            transport = "frames"  # a collective needs every rank; a subset sends rank by rank
        return transport

    def _root(self):
        """The rank an MPI gather collects on: the first one on the notebook's host (its message is local)."""
        return next((rank for rank in self.magics.world.ranks if not self.magics.world.is_remote(rank)), 0)

    def _show_inspector(self, result):
        from ..widgets.inspector import inspector_text, inspector_widget
        from .models import inspect_gathered

        reports = inspect_gathered(result.gathered, result.gather_stats)
        if in_notebook(self.magics.shell):
            from ..widgets.static import inspector_bundle

            views.show_at_end(lambda: inspector_widget(reports), lambda: inspector_bundle(reports),
                              name="tensor inspector")
        else:
            print(inspector_text(reports))


def _transformed(shell, cell):
    """*cell* as IPython turns it into Python (``%time x`` becomes a ``run_line_magic`` call; *cell* itself, which
    pickles as a reference to it, when unchanged), or ``None`` when it cannot be transformed here (then each rank
    transforms it, and reports what fails)."""
    transform = getattr(shell, "transform_cell", None)
    if transform is None:
        return None
    try:
        source = transform(cell)
    except Exception:  # noqa: BLE001 - the ranks transform it again and report the error as theirs
        return None
    return cell if source == cell else source
