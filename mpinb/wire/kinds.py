"""Every message of the cell channel, one named type each. Both sides import these; ``messages.PROTOCOL`` is
raised when a type's fields or meaning change, so that a rank of another mpinb is named at the handshake.

Notebook → rank (the cell socket, to the rank's agent or to its roll-call thread): :class:`Cell`,
:class:`RollCall`, :class:`AskStack`, :class:`AskNative`, :class:`Settle`, :class:`Stdin`, :class:`DebugCommand`.
Rank → notebook (the events socket): :class:`Hello`, :class:`Out`, :class:`Metrics`, :class:`TraceSpans`,
:class:`Input`, :class:`DebugStopped`, :class:`DebugAnswer`, :class:`Reply` from the agent; :class:`Listening`,
:class:`Waiting`, :class:`Where`, :class:`Stack`, :class:`Native`, :class:`Settled` from the roll-call thread.
"""

from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(frozen=True)
class Call:
    """A call of one of mpinb's own rank-side functions, sent in a cell's options in place of code: the rank
    imports *module* (only under ``mpinb.rank``) and returns ``name(*args)`` as the cell's value."""

    module: str
    name: str
    args: tuple = ()

    @classmethod
    def of(cls, function, *args):
        if not function.__module__.startswith("mpinb.rank."):
            raise ValueError(f"{function.__module__}.{function.__name__} is not rank-side code of mpinb")
        return cls(function.__module__, function.__name__, args)


@dataclass(frozen=True)
class AgentSettings:
    """How a rank's agent behaves from the cell that carries them on: metric batches every *report_interval*
    seconds; the roll call after *collective_wait* seconds in one collective (``None``: never); *snapshot_due*:
    this cell waits for the rank's pending snapshot (the notebook says so for every rank at once, so that they all
    keep the same cell)."""

    report_interval: float
    collective_wait: float | None
    complete: int | None = None  # the last cell every rank finished: its snapshot is kept (rank/snapshots/)
    snapshot_due: bool = False


@dataclass(frozen=True)
class GatherRequest:
    """Send back the values of *names* when the cell ends: by *transport* (``frames`` on the channel, ``shm``
    through a shared-memory segment, ``mpi`` by one MPI gather to rank *root*), with statistics when *stats*."""

    names: tuple
    transport: str = "frames"
    root: int = 0
    stats: bool = True


@dataclass(frozen=True)
class DebugSetup:
    """What a rank needs for the notebook's visual debugger (JupyterLab's panel) while this cell runs.

    *path* is the file the kernel's debugger knows the cell as, whose line *offset* + N is the rank's line N (0:
    a rank runs a ``%%mpi`` cell a line down, its line 1 the magic's); *lines*: the breakpoints, each a line of the
    cell as the editor numbers it or ``(line, condition, hit condition)`` (either may be ``None``), as the panel
    set them; *filters*: the panel's exception filters (``raised``, ``uncaught``, ``userUnhandled``)."""

    path: str
    offset: int = 0
    lines: tuple = ()
    filters: tuple = ()

    @property
    def armed(self):
        """Whether this cell runs under the rank's debugger (else it only learns the cell's path)."""
        return bool(self.lines or self.filters)


@dataclass(frozen=True)
class CellOptions:
    """What travels with a cell besides its code.

    *settings*: the agent's (``None`` keeps those of the cell before: a call of mpinb's own); *source*: the cell
    as Python (IPython's syntax turned into Python once, in the notebook); *trace*: note spans with a buffer of
    *trace_buffer* spans per rank (``None``: the rank's default); *gather*: values to send back; *call*: run this
    in place of the code; *released*: per rank, the shared-memory leases whose values the notebook dropped;
    *debug*: a :class:`DebugSetup` while the kernel's visual debugger is on."""

    settings: AgentSettings | None = None
    source: str | None = None
    trace: bool = False
    trace_buffer: int | None = None
    gather: GatherRequest | None = None
    call: Call | None = None
    released: dict = field(default_factory=dict)
    debug: DebugSetup | None = None


@dataclass(frozen=True)
class Wait:
    """A collective a rank waits in: number *seq* on communicator *comm* (world ranks *members*), its signature
    ``(op, root, count, dtype)``, how long it has waited, and *then*: the later ones of the same communicator it
    waits for too, ``((seq, signature), ...)`` (DDP's next gradient buckets)."""

    comm: str
    members: tuple
    seq: int
    signature: tuple
    waited: float = 0.0
    then: tuple = ()


@dataclass(frozen=True)
class LedgerState:
    """A rank's ledger of one communicator: its world ranks, how many collectives it has seen, and the signatures
    of the recent ones, ``((seq, signature), ...)``."""

    members: tuple
    count: int
    recent: tuple


@dataclass(frozen=True)
class PointToPoint:
    """The blocking point-to-point call a rank waits in: ``sends`` and ``receives`` are ``(peer, tag, bytes)``
    or ``None`` (peer -1: any source; bytes ``None``: a pickled object)."""

    comm: str
    op: str
    sends: tuple | None
    receives: tuple | None


@dataclass(frozen=True)
class WhereAnswer:
    """Where a rank is, MPI-wise: the collective it waits in, its ledgers, the point-to-point call it is in, its
    main thread's stack ``((file, line, function), ...)`` and the file its cell was compiled as; *asked*: the roll
    call it answers (``None``: sent unasked, a :class:`Waiting`); *mirrored*: read from its mirror file and stack
    dump in the notebook, since it could not answer; *usage*: what the rank's process used, for the MPI panel."""

    waiting: Wait | None = None
    ledgers: dict = field(default_factory=dict)
    p2p: PointToPoint | None = None
    frames: tuple = ()
    cell_file: str = ""
    asked: int | None = None
    mirrored: bool = False
    usage: tuple | None = None  # answering a roll call: (clock, process CPU s, resident bytes, pid, GPU)


class Cell(NamedTuple):
    """Run *code* (cell *number* in tracebacks) with *options* (:class:`CellOptions`)."""

    cell_id: int
    code: str
    number: int
    options: CellOptions


class RollCall(NamedTuple):
    """Say where you are, MPI-wise; the answer (:class:`Where`) carries *number* back."""

    number: int


class AskStack(NamedTuple):
    """Send the main thread's stack (:class:`Stack`)."""

    number: object


class AskNative(NamedTuple):
    """Send the main thread's native stack as py-spy reads it on the rank's host (:class:`Native`)."""

    number: object


class Settle(NamedTuple):
    """Do *items* to let a rank stuck in MPI out (``rank/settle.py``); answered by :class:`Settled`."""

    number: int
    items: list


class Stdin(NamedTuple):
    """A line typed at the rank's debugger prompt (``None``: end of input)."""

    line: object


class DebugCommand(NamedTuple):
    """A request of the visual debugger for a rank stopped in it (a DAP request's *command* and *arguments*);
    *seq* comes back with the :class:`DebugAnswer`."""

    seq: int
    command: str
    arguments: dict


class Hello(NamedTuple):
    """The agent is connected; *stacks* is the file its faulthandler dumps stacks to."""

    rank: int
    stacks: str


class Out(NamedTuple):
    """Text the cell wrote to *stream* (``stdout`` or ``stderr``); *cell_id* ``None``: written between cells (by
    a thread the rank runs), shown with the next cell."""

    rank: int
    cell_id: int
    stream: str
    text: str


DEFAULT_RUN = "main"  # the run a record of mpinb.report() without run= belongs to, on both sides


class Metrics(NamedTuple):
    """A batch of ``mpinb.report()`` records (each names its run, :data:`DEFAULT_RUN` unless asked)."""

    rank: int
    records: list


class TraceSpans(NamedTuple):
    """A traced cell's spans so far, with the rank's two clocks read together (monotonic ns, wall-clock ns)."""

    rank: int
    cell_id: int
    spans: list
    dropped: int
    clocks: tuple


class Kept(NamedTuple):
    """The rank's snapshot of cell *cell_id* is written (``rank/snapshots/``)."""

    rank: int
    cell_id: int


class Bulk(NamedTuple):
    """The rank's next large message comes sealed on the bulk socket (``wire/bulk.py``): take it now, in order
    with what the rank sent before and after."""

    rank: int


class Input(NamedTuple):
    """A debugger on the rank asks for a line, showing *prompt*."""

    rank: int
    cell_id: int
    prompt: str


class DebugStopped(NamedTuple):
    """The rank stopped in the visual debugger, for *reason* (``breakpoint``, ``step``, ``exception``), and waits
    for requests (:class:`DebugCommand`); *text* says more (the exception)."""

    rank: int
    cell_id: int
    reason: str
    text: str


class DebugAnswer(NamedTuple):
    """The answer to :class:`DebugCommand` *seq*: a DAP response's *success*, *body* and *message*."""

    rank: int
    seq: int
    success: bool
    body: dict
    message: str = ""


@dataclass
class CellReply:
    """How a cell ended on a rank: its *value*, or its *error* (Jupyter's error content: ``ename``, ``evalue``,
    ``traceback``); *collectives*: the rank's ledgers after it, ``({comm: (count, members)}, changed)``;
    *replicas*: fingerprints of the models meant to be the same on every rank; *gathered*: a payload of
    ``wire/gathered.py``; *buffers*: the raw frames that came with it (set where it arrives)."""

    value: object = None
    error: dict | None = None
    collectives: tuple | None = None
    replicas: dict = field(default_factory=dict)
    gathered: object = None
    buffers: list = field(default_factory=list)


class Reply(NamedTuple):
    """The cell ended on *rank* (:class:`CellReply`)."""

    rank: int
    cell_id: int
    reply: CellReply


class Listening(NamedTuple):
    """The roll-call thread is connected."""

    rank: int


class Waiting(NamedTuple):
    """The rank has waited in one MPI call longer than the collective wait: *where* (:class:`WhereAnswer`) says
    in which."""

    rank: int
    cell_id: object
    where: WhereAnswer


class Where(NamedTuple):
    """The answer to a :class:`RollCall` (:class:`WhereAnswer`, ``where.asked`` its number)."""

    rank: int
    cell_id: object
    where: WhereAnswer


class Stack(NamedTuple):
    """The answer to an :class:`AskStack`."""

    rank: int
    number: object
    stack: dict


class Native(NamedTuple):
    """The answer to an :class:`AskNative`: the main thread's frames ``(function, file, line, library)``, most
    recent first (*library* ``None`` for a Python frame), or why there are none (*note*)."""

    rank: int
    number: object
    frames: list
    note: str


class Settled(NamedTuple):
    """What doing a :class:`Settle`'s items gave."""

    rank: int
    number: int
    outcome: object
