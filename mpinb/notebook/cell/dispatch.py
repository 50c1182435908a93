"""A cell dispatched to the ranks: checked against the world first (a rank dead since the last cell), sent, and
its replies turned into a :class:`CellResult` of values or one error. The path of a cell, one name per step:
the magics' ``CellRunner.run`` (``running.py``) dispatches it here, it is in flight in
:class:`~mpinb.notebook.cell.in_flight.InFlight`, and each rank executes it (``rank/runner.py``'s ``execute``)."""

import dataclasses
import sys
from dataclasses import dataclass, field

from ...errors import GatherError, MPIError, RankError
from ...wire.kinds import CellOptions
from ...wire.ranks import label_ranks
from .in_flight import InFlight
from .rank_errors import RESTART, died_earlier
from .gather import missing_message
from .output import RankPrinter, rank_ordered
from .perrank import PerRank


@dataclass
class CellResult:
    """Everything one ``%%mpi`` cell produced, keyed by rank (plain data: tests and widgets read it)."""

    ranks: list
    stdout: dict = field(default_factory=dict)
    stderr: dict = field(default_factory=dict)
    values: PerRank = field(default_factory=PerRank)
    errors: dict = field(default_factory=dict)
    seconds: float = 0.0
    cell_id: int | None = None  # the channel's id of the cell
    gathered: dict = field(default_factory=dict)  # name -> PerRank of the ranks that had it
    gather_errors: dict = field(default_factory=dict)  # name -> {rank: message}
    gather_stats: dict = field(default_factory=dict)  # name -> {rank: {leaf path: statistics}}
    gather_notes: list = field(default_factory=list)  # how gathers travelled when not as asked
    warnings: list = field(default_factory=list)  # what the cell did that is likely a bug (replicas drifted apart)
    trouble: str = None  # why mpinb stopped the cell: "timeout", "failure" (a rank failed), "interrupt"
    stacks: dict = field(default_factory=dict)  # rank -> RankStack captured when the cell was stopped
    stuck: list = field(default_factory=list)  # ranks that did not answer the interrupt
    native: dict = field(default_factory=dict)  # rank -> NativeStack (py-spy's) of those that did not answer
    finished: list = field(default_factory=list)  # ranks that completed the cell without error
    first_failure: int = None
    first_death: int = None
    grace: float = None  # seconds the stopped ranks were given to answer the interrupt
    mismatch: str = None  # the mismatched collective that made mpinb stop the cell
    recovered: str = None  # how ranks stuck in MPI were let out (the world and its variables kept)
    unrecoverable: str = None  # why ranks stuck in MPI could not be let out
    ended: str = None  # why the user ended the world during the cell (Stop pressed three times)
    inconsistent: str = None  # what MPI completed that leaves the world unusable (mismatched collectives)

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
    printer: RankPrinter = None
    metrics: object = None
    timeout: float = None
    abort_grace: float = 2.0
    interrupt_grace: float = 5.0
    liveness_every: float = 0.5
    status: object = None
    collective_wait: float = 1.0
    trace: object = None
    recover: bool = True
    progress: object = None


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
    warning = world.time_warning()
    if warning:
        print(f"[mpinb] {warning}", file=sys.stderr, flush=True)
    dead = world.dead_ranks_lately(ranks, within=settings.liveness_every)
    if dead:
        world.mark_dead()
        raise MPIError(died_earlier(world, dead))
    world.kept_state.wait_until_kept(world.channel, world.ranks)  # with snapshot_lag = 0 only
    released = world.channel.segments.take_released() if world.channel is not None else {}
    if released:  # the segments whose gathered values were all dropped: the ranks may write there again
        options = dataclasses.replace(options or CellOptions(), released=released)
    return InFlight(world, code, result, settings).run(options)

