"""A cell dispatched to the ranks: checked against the world first (a rank dead since the last cell), sent, and
its replies turned into a :class:`CellResult` of values or one error. The path of a cell, one name per step:
the magics' ``CellRunner.run`` (``running.py``) dispatches it here, it is in flight in
:class:`~mpinb.notebook.cell.in_flight.InFlight`, and each rank executes it (``rank/runner.py``'s ``execute``)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ...errors import GatherError, MPIError, RankError
from ...wire.kinds import CellOptions
from ...wire.ranks import label_ranks
from .in_flight import InFlight
from .rank_errors import RESTART, died_earlier
from .gather import missing_message
from .output import RankPrinter, rank_ordered
from .perrank import PerRank

if TYPE_CHECKING:
    from ...widgets.views import Progress
    from ..diagnosis import RankStack
    from ..diagnosis.native import NativeStack
    from .live import CellStatus, LiveMetrics, LiveTrace

Trouble = Literal["interrupt", "timeout", "failure", "mismatch"]  # why mpinb stopped a cell (InFlight.stop)


@dataclass
class CellResult:
    """Everything one ``%%mpi`` cell produced, keyed by rank (plain data: tests and widgets read it)."""

    ranks: list[int]
    stdout: dict[int, str] = field(default_factory=dict)
    stderr: dict[int, str] = field(default_factory=dict)
    values: PerRank = field(default_factory=PerRank)
    errors: dict[int, dict] = field(default_factory=dict)  # rank -> {"ename", "evalue", "traceback"}
    seconds: float = 0.0
    cell_id: int | None = None  # the channel's id of the cell
    gathered: dict[str, PerRank] = field(default_factory=dict)  # name -> PerRank of the ranks that had it
    gather_errors: dict[str, dict[int, str]] = field(default_factory=dict)  # name -> {rank: message}
    gather_stats: dict[str, dict[int, dict]] = field(default_factory=dict)  # name -> {rank: {leaf path: statistics}}
    gather_notes: list[str] = field(default_factory=list)  # how gathers travelled when not as asked
    warnings: list[str] = field(default_factory=list)  # what the cell did that is likely a bug (replicas drifted)
    trouble: Trouble | None = None  # why mpinb stopped the cell
    stacks: dict[int, RankStack] = field(default_factory=dict)  # rank -> its stack when the cell was stopped
    stuck: list[int] = field(default_factory=list)  # ranks that did not answer the interrupt
    native: dict[int, NativeStack] = field(default_factory=dict)  # rank -> py-spy's stack of those that did not answer
    finished: list[int] = field(default_factory=list)  # ranks that completed the cell without error
    first_failure: int | None = None
    first_death: int | None = None
    grace: float | None = None  # seconds the stopped ranks were given to answer the interrupt
    mismatch: str | None = None  # the mismatched collective that made mpinb stop the cell
    recovered: str | None = None  # how ranks stuck in MPI were let out (the world and its variables kept)
    unrecoverable: str | None = None  # why ranks stuck in MPI could not be let out
    ended: str | None = None  # why the user ended the world during the cell (Stop pressed three times)
    inconsistent: str | None = None  # what MPI completed that leaves the world unusable (mismatched collectives)

    @property
    def ok(self):
        return not self.errors

    def rank_ordered(self):
        """The cell's output rank by rank, in rank order."""
        return rank_ordered(self.stdout, self.stderr, ranks=self.ranks)

    def raise_for_errors(self, notes=()):
        if self.errors:
            raise RankError(self.errors, self.ranks, notes=self.notes(notes), first=self.first_death)

    def notes(self, notes=()):
        """*notes*, then what to do when a rank died (said once, not on every rank's line)."""
        return [*notes, RESTART] if self.first_death is not None else list(notes)

    def raise_for_gather_errors(self):
        if self.gather_errors:
            raise GatherError("\n".join(missing_message(name, errors, self.gathered.get(name, {}))
                                         for name, errors in self.gather_errors.items()))


@dataclass
class Settings:
    """How :func:`dispatch` runs a cell (its keyword arguments, which it documents)."""

    number: int = 0
    stream: bool = True
    printer: RankPrinter | None = None
    metrics: LiveMetrics | None = None
    timeout: float | None = None
    abort_grace: float | None = 2.0
    interrupt_grace: float = 5.0
    liveness_every: float = 0.5
    status: CellStatus | None = None
    collective_wait: float | None = 1.0
    trace: LiveTrace | None = None
    recover: bool = True
    progress: Callable[[], Progress] | None = None  # makes the line that says what a stopped cell waits for


def dispatch(world, code, *, ranks=None, options=None, **settings):
    """Run *code* on *ranks* of *world* (default: all) and return a :class:`CellResult`.

    Output is printed as it arrives when *stream* is true, each line labelled ``[rank R]``. Metric batches
    from ``mpinb.report()`` go to *metrics* (a :class:`~mpinb.notebook.cell.live.LiveMetrics`), which is ticked between
    messages. *options* (:class:`~mpinb.wire.kinds.CellOptions`) travel with the cell to the ranks' agents.

    The cell is stopped — each running rank's stack captured first, then SIGINT — when *timeout* seconds pass,
    when a rank has failed and the others have not finished *abort_grace* seconds later (they are most likely
    waiting for it in a collective; ``None`` waits for them), or on ``KeyboardInterrupt`` (raised again
    afterwards). Where each running rank is, is printed at once. Ranks that do not answer the interrupt within
    *interrupt_grace* seconds (:data:`~mpinb.notebook.cell.in_flight.COMMUNICATION_GRACE` when all of them wait in
    communication) are listed in ``result.stuck``. A rank whose process dies is reported, with what mpiexec
    said about it, within *liveness_every* seconds. *status* (a :class:`~mpinb.notebook.cell.live.CellStatus`) is
    ticked as the cell runs.

    When a rank has waited *collective_wait* seconds in one collective, every rank is asked where it is, and
    ranks proven to be in different collectives stop the cell (``result.mismatch``; ``None`` turns it off).
    Spans of a traced cell go to *trace* (a :class:`~mpinb.notebook.cell.live.LiveTrace`). With *recover*, ranks stuck in MPI
    after the interrupt are let out where the other ranks can complete what they wait for (``recover.py``):
    ``result.recovered`` says how, ``result.unrecoverable`` why not; meanwhile a line made by *progress* (a
    callable returning a :class:`~mpinb.widgets.views.Progress`) says what the recovery is doing.
    """
    settings = Settings(**settings)
    settings.printer = settings.printer or RankPrinter()
    ranks = world.ranks if ranks is None else list(ranks)
    result = CellResult(ranks=ranks, stdout={r: "" for r in ranks}, stderr={r: "" for r in ranks})
    warning = world.launcher.time_warning()
    if warning:
        print(f"[mpinb] {warning}", file=sys.stderr, flush=True)
    dead = world.liveness.dead_ranks_lately(ranks, within=settings.liveness_every)
    if dead:
        world.lifecycle.dead()
        raise MPIError(died_earlier(world, dead))
    world.kept_state.wait_until_kept(world.channel, world.ranks)  # with snapshot_lag = 0 only
    released = world.channel.segments.take_released() if world.channel is not None else {}
    if released:  # the segments whose gathered values were all dropped: the ranks may write there again
        options = dataclasses.replace(options or CellOptions(), released=released)
    return InFlight(world, code, result, settings).run(options)

