"""What this rank's MPI calls did: a ledger of its collectives (always kept), and spans of every call (when traced).

The ledger is cheap enough to keep on every rank all the time (a counter and a short ring per communicator, and
what the main thread waits in now); it is what lets the notebook catch ranks that entered different collectives
(``notebook/diagnosis/mismatch.py``). Spans, ``(op, comm, peer, sent, received, start_ns, end_ns, seq, kind, detail)``, are
recorded only while a cell runs with ``%%mpi --trace`` or a script runs with ``MPINB_TRACE`` set, into a ring
buffer of :data:`BUFFER` spans that the rank's agent drains in batches, like ``mpinb.report()`` values.
``start_ns``/``end_ns`` are ``time.perf_counter_ns()`` (CLOCK_MONOTONIC: one clock for every rank on a host).

The calls are intercepted in Python (``intercept.py``); what the main thread waits in is mirrored to a file
(``wire/mirror.py``).
"""

import collections
import mmap
import os
import sys
import threading
import time

from ...wire import files
from ...wire.kinds import LedgerState, Wait, WhereAnswer
from ...wire.mirror import LEFT, MIRROR, RAISED, encode

now_ns = time.perf_counter_ns
BUFFER = 100_000  # spans kept per rank between drains at most (the oldest go first)
RECENT = 64  # collectives remembered per communicator, for the roll call


class Ledger:
    """One communicator's collectives on this rank: how many were entered, and the last :data:`RECENT`."""

    __slots__ = ("name", "members", "count", "recent", "encoded")

    def __init__(self, name, members):
        self.name, self.members = name, members  # members: world ranks, in the communicator's rank order
        self.count = 0
        self.recent = collections.deque(maxlen=RECENT)  # (seq, signature)
        self.encoded = name.encode()[:48]


class State:
    """The rank's tracing state; one instance, :data:`state`, read and written by the wrappers."""

    def __init__(self):
        self.ledgers = {}  # communicator name -> Ledger
        self.comms = {}  # communicator name -> weak reference to the traced communicator
        self.p2p = None  # the blocking point-to-point call the main thread is in (see p2p_calls.point_to_point)
        # what describes it for a roll call (p2p_calls.stuck_p2p, set by intercept.install: this module, the lowest of
        # the tracing, knows nothing of the calls' arguments)
        self.describe_p2p = None
        self.note_p2p = True  # note it (False only to measure what noting costs: benchmarks/healthy.py)
        self.current = None  # (ledger, seq, signature, start_ns) while the main thread waits in a collective
        # the asynchronous collectives launched and maybe not complete (torch's async_op calls, DDP's gradient
        # buckets): ((ledger, seq, signature, start_ns), work), oldest first; a thread waits on them in C++
        self.outstanding = collections.deque()
        self.comm_ns = 0  # time spent in communication calls so far (blocking calls and waits)
        self.spans = None  # a deque while tracing, else None
        self.recorded = 0  # spans appended since tracing began (to tell how many the ring dropped)
        self.drained = 0
        self.main = threading.main_thread().ident
        self.mirror = None  # an mmap of the mirror file, once a notebook's world set one up

    def mirror_to(self, path):
        """Mirror the collective being waited in to *path* from now on (see ``wire/mirror.py``)."""
        fd = files.open_own(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            os.ftruncate(fd, mmap.PAGESIZE)  # zeros
            self.mirror = mmap.mmap(fd, mmap.PAGESIZE)
        finally:
            os.close(fd)

    def enter(self, ledger, seq, signature, start, fields=None):
        """The main thread waits in collective *seq* of *ledger* from *start* (ns) on. *fields*: what
        :func:`mirrored` gave for *ledger* and *signature*, kept by a caller that enters the same kind of collective
        again and again, or ``None``. (``collective_calls.py``'s collectives do what this and :meth:`leave` do in
        place.)"""
        self.current = (ledger, seq, signature, start)
        mirror = self.mirror
        if mirror is not None:  # one write (the reader looks only at ranks that have waited a second in it)
            root, count, op, dtype, comm = mirrored(ledger, signature) if fields is None else fields
            MIRROR.pack_into(mirror, 0, 0, 1, seq, root, count, start, op, dtype, comm)

    def launched(self, ledger, seq, signature, start, work):
        """Asynchronous collective *seq* of *ledger* was launched at *start* (ns); *work* says when it is complete
        (``is_completed()``). The complete ones at the front are let go here, by the threads that launch."""
        outstanding = self.outstanding
        while outstanding and outstanding[0][1].is_completed():
            outstanding.popleft()
        outstanding.append(((ledger, seq, signature, start), work))

    def waiting_in(self):
        """What this rank waits in: the main thread's collective, else the oldest asynchronous one not complete
        (the same tuple each time it is asked, until it completes); ``None``."""
        current = self.current
        if current is not None:
            return current
        for entry, work in self.launched_now():
            if not work.is_completed():
                return entry
        return None

    def launched_now(self):
        """A copy of :attr:`outstanding`, taken while other threads launch (a deque copied as it changes raises,
        which killed the roll-call thread that asked)."""
        for _ in range(100):
            try:
                return list(self.outstanding)
            except RuntimeError:  # changed meanwhile: copy again
                continue
        return []

    def leave(self, done=True):
        """The wait is over: the collective completed (*done*), or raised (then the mirror keeps it, marked)."""
        self.current = None
        if self.mirror is not None:
            self.mirror[8:16] = LEFT if done else RAISED

    def ledger(self, name, members):
        ledger = self.ledgers.get(name)
        if ledger is None or ledger.members != members:
            ledger = self.ledgers[name] = Ledger(name, members)
        return ledger

    def start(self, buffer=BUFFER):
        """Record spans from now on (a fresh ring)."""
        self.spans = collections.deque(maxlen=buffer)
        self.recorded = self.drained = 0

    def stop(self):
        self.spans = None

    def drain(self):
        """Every span recorded since the last drain, oldest first, and how many the ring dropped meanwhile."""
        spans = self.spans
        if spans is None:
            return [], 0
        batch = []
        try:
            while True:  # the outbox thread and, at the end of a cell, the main thread drain: never both lose
                batch.append(spans.popleft())
        except IndexError:
            pass
        dropped = self.recorded - self.drained - len(batch)
        self.drained = self.recorded
        return batch, max(0, dropped)

    def mark_step(self, step):
        """An ``mpinb.report(step=...)`` call, as a marker in the trace."""
        if self.spans is not None:
            moment = now_ns()
            self.spans.append(("step", "", None, 0, 0, moment, moment, step, "step", ""))
            self.recorded += 1

    def counts(self):
        """``{name: (count, members)}``: how many collectives each communicator has seen so far, and who is in
        it (the same name can be different communicators on different ranks: ``Split`` by colour)."""
        return {name: (ledger.count, ledger.members) for name, ledger in list(self.ledgers.items())}

    def changed(self, counts):
        """The ledgers of the communicators used since *counts* was taken, as a roll call gives them."""
        return {name: LedgerState(ledger.members, ledger.count, tuple(ledger.recent))
                for name, ledger in list(self.ledgers.items()) if (ledger.count, ledger.members) != counts.get(name)}

    def where(self):
        """This rank's answer to a roll call: the collective it waits in, its recent collectives and its stack."""
        current = self.waiting_in()
        waiting = None
        if current is not None:
            ledger, seq, signature, start = current
            then = ()
            if current is not self.current:  # the later asynchronous ones it waits for too (DDP's next buckets)
                then = tuple((entry[1], entry[2]) for entry, work in self.launched_now()
                             if entry[0] is ledger and entry[1] > seq and not work.is_completed())
            waiting = Wait(ledger.name, ledger.members, seq, signature, (now_ns() - start) / 1e9, then)
        ledgers = {name: LedgerState(ledger.members, ledger.count, tuple(ledger.recent))
                   for name, ledger in list(self.ledgers.items())}
        describe = self.describe_p2p
        try:
            p2p = describe() if describe is not None else None
        except Exception:  # noqa: BLE001 - a call mid-way (arguments changing): say nothing rather than fail
            p2p = None
        return WhereAnswer(waiting, ledgers, p2p, tuple(main_frames(self.main)))


def mirrored(ledger, signature):
    """What the mirror file says of collective *signature* on *ledger* but its seq and start: ``(root, count, op,
    dtype, comm)`` as the record holds them."""
    op, root, count, dtype = signature
    return -1 if root is None else root, -1 if count is None else count, encode(op), encode(dtype), ledger.encoded


def main_frames(ident):
    """The main thread's stack as ``[(file, line, function)]``, most recent call first (it runs while the main
    thread waits in MPI or sleeps, both of which release the GIL)."""
    frame = sys._current_frames().get(ident)
    frames = []
    while frame is not None and len(frames) < 200:
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return frames


state = State()
