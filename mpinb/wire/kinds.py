"""Every message of the cell channel, one named type each. Both sides import these; ``messages.PROTOCOL`` is
raised when a type's fields or meaning change, so that a rank of another mpinb is named at the handshake.

Notebook → rank (the cell socket, to the rank's agent or to its roll-call thread): :class:`Cell`,
:class:`RollCall`, :class:`AskStack`, :class:`Settle`, :class:`Stdin`.
Rank → notebook (the events socket): :class:`Hello`, :class:`Out`, :class:`Metrics`, :class:`TraceSpans`,
:class:`Input`, :class:`Reply` from the agent; :class:`Listening`, :class:`Waiting`, :class:`Where`,
:class:`Stack`, :class:`Settled` from the roll-call thread.
"""

from typing import NamedTuple


class Cell(NamedTuple):
    """Run *code* (cell *number* in tracebacks); *options* set how the agent behaves from this cell on."""

    cell_id: int
    code: str
    number: int
    options: dict


class RollCall(NamedTuple):
    """Say where you are, MPI-wise; the answer (:class:`Where`) carries *number* back."""

    number: int


class AskStack(NamedTuple):
    """Send the main thread's stack (:class:`Stack`)."""

    number: object


class Settle(NamedTuple):
    """Do *items* to let a rank stuck in MPI out (``rank/settle.py``); answered by :class:`Settled`."""

    number: int
    items: list


class Stdin(NamedTuple):
    """A line typed at the rank's debugger prompt (``None``: end of input)."""

    line: object


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


class Metrics(NamedTuple):
    """A batch of ``mpinb.report()`` records."""

    rank: int
    records: list


class TraceSpans(NamedTuple):
    """A traced cell's spans so far, with the rank's two clocks read together (monotonic ns, wall-clock ns)."""

    rank: int
    cell_id: int
    spans: list
    dropped: int
    clocks: tuple


class Input(NamedTuple):
    """A debugger on the rank asks for a line, showing *prompt*."""

    rank: int
    cell_id: int
    prompt: str


class Reply(NamedTuple):
    """The cell ended: ``{"value": ...}`` or ``{"error": ...}``, and what it gathered."""

    rank: int
    cell_id: int
    reply: dict


class Listening(NamedTuple):
    """The roll-call thread is connected."""

    rank: int


class Waiting(NamedTuple):
    """The rank has waited in one MPI call longer than the collective wait: *where* says in which."""

    rank: int
    cell_id: object
    where: dict


class Where(NamedTuple):
    """The answer to a :class:`RollCall` (``where["asked"]`` is its number)."""

    rank: int
    cell_id: object
    where: dict


class Stack(NamedTuple):
    """The answer to an :class:`AskStack`."""

    rank: int
    number: object
    stack: dict


class Settled(NamedTuple):
    """What doing a :class:`Settle`'s items gave."""

    rank: int
    number: int
    outcome: object
