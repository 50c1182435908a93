"""Ranks in different collectives, caught while they wait: a roll call of every rank's ledger
(``rank/tracing/ledger.py``).

When a rank has waited in one collective longer than ``collective_wait`` seconds it says so; the notebook then
asks every rank of the cell where it is (its thread answers even while MPI blocks the main thread) and compares
what the members of that communicator did at that collective's number. A mismatch is decided only on evidence
(two ranks at the same number with a different operation, root, count or type, or a rank that finished the
cell without entering it); a rank that is merely late is waited for, and asked again a second later.
"""

import dataclasses
import time

from ...wire.mirror import read_mirror
from ...wire.rank_files import ledger_path
from ...wire.kinds import Wait, Waiting, Where, WhereAnswer
from ...wire.ranks import label_ranks
from .advice import advice
from .diagnose import RankStack, capture_stacks


class MismatchWatch:
    """The roll-call side of one running cell: feed it the ranks' ``waiting``/``rollcall`` messages, tick it.

    Parameters
    ----------
    channel : Channel
        Where roll calls go (each rank's roll-call thread).
    ranks : list of int
        The ranks the cell runs on.
    code : str
        The cell's source, to quote its lines.
    answer_within : float, default 0.5
        Seconds to wait for every rank's answer before deciding with those that answered.
    again_after : float, default 1.0
        Seconds between roll calls while a rank still waits and nothing is decided.
    """

    def __init__(self, channel, ranks, code, *, world=None, after=1.0, answer_within=0.5, again_after=1.0):
        self.channel, self.ranks, self.code, self.world, self.after = channel, list(ranks), code, world, after
        self.answer_within, self.again_after = answer_within, again_after
        self.states = {}  # rank -> its last answer
        self.asked_at = None  # when the roll call in progress was sent
        self.next_call = None  # when to call the roll again
        self.calls = 0
        self.verdict = None
        self.started_ns = time.perf_counter_ns()  # no collective of this cell can have waited longer

    def feed(self, message, now=None):
        """A :class:`Waiting` or :class:`Where` message from a rank's roll-call thread."""
        rank, _, where = message
        waiting = isinstance(message, Waiting)
        before = self.states.get(rank)
        if waiting and before is not None and before.asked is not None:
            where = dataclasses.replace(where, asked=before.asked)  # it answered the roll call in progress already
        self.states[rank] = where
        if waiting and self.asked_at is None:
            self._call(time.monotonic() if now is None else now)

    def tick(self, replies, now=None):
        """Decide once every rank answered (or ``answer_within`` passed); return the mismatch text or ``None``."""
        now = time.monotonic() if now is None else now
        if self.verdict is not None:
            return None
        if self.asked_at is None:
            if (self.next_call is not None and now >= self.next_call) or \
                    (self.next_call is None and self._long_wait(replies)):
                self._call(now)
            return None
        answered = all(_asked(self.states.get(rank)) == self.calls for rank in self.ranks)
        if not answered and now < self.asked_at + self.answer_within:
            return None
        self.asked_at = None
        self._from_mirrors([rank for rank in self.ranks if _asked(self.states.get(rank)) != self.calls])
        finished = {rank for rank, reply in replies.items() if reply.error is None}
        failed = {rank for rank, reply in replies.items() if reply.error is not None}
        self.verdict = diagnose(self.states, self.ranks, finished, failed, self.code)
        if self.verdict is None and any(state.waiting for state in self.states.values()):
            self.next_call = now + self.again_after
        return self.verdict

    def stacks(self, ranks):
        """``{rank: RankStack}`` from the answers (where each rank was when it answered)."""
        return {rank: _stack(rank, self.states[rank]) for rank in ranks if rank in self.states}

    def _long_wait(self, replies):
        """Whether a rank on this host has waited ``after`` seconds in one collective, by its mirror file (a rank
        in a pickle-based collective holds the GIL, so its roll-call thread cannot say so itself)."""
        if self.world is None:
            return False
        limit = time.perf_counter_ns() - self.after * 1e9
        if limit < self.started_ns:
            return False
        for rank in self.ranks:
            mirror = None if rank in replies else mirror_of(self.world, rank)
            if mirror is not None and not mirror.raised and mirror.start_ns <= limit:
                return True
        return False

    def _from_mirrors(self, silent):
        """Answers for the ranks that did not answer: their mirror file and their faulthandler stack."""
        if self.world is None or not silent:
            return
        stacks = capture_stacks(self.world, silent, wait=0.5)
        for rank in silent:
            stack = stacks.get(rank)
            self.states[rank] = WhereAnswer(waiting_from_mirror(self.world, rank, self.states, self.ranks),
                                            frames=tuple(stack.frames) if stack else (),
                                            cell_file=stack.cell_file if stack else "", asked=self.calls,
                                            mirrored=True)

    def _call(self, now):
        self.calls += 1
        self.asked_at, self.next_call = now, None
        self.states = {rank: dataclasses.replace(state, asked=None) for rank, state in self.states.items()}
        self.channel.roll_call(self.ranks, self.calls)


def diagnose(states, ranks, finished, failed, code=""):
    """The mismatch the answers in *states* (``{rank: where}``) prove, as one line, or ``None``."""
    waiting = {rank: state.waiting for rank, state in states.items() if state.waiting}
    for comm in sorted({wait.comm for wait in waiting.values()}):
        first = min((wait for wait in waiting.values() if wait.comm == comm), key=lambda wait: wait.seq)
        seq, members = first.seq, [rank for rank in first.members if rank in ranks]
        entries = {rank: _entry(states.get(rank), comm, seq, rank in finished, rank in failed, first.members)
                   for rank in members}
        signatures = [signature for kind, signature in entries.values() if kind in ("in", "passed") and signature]
        if _disagree(signatures) or any(kind == "finished" for kind, _ in entries.values()):
            return _describe(comm, seq, entries, states, code)
    return None


def after_cell(replies, ranks):
    """The mismatch the ranks' ledgers show after a cell every rank finished (MPI does not always hang on one:
    a broadcast from different roots can complete, with the wrong values), as one line, or ``None``."""
    ledgers = {rank: reply.collectives for rank, reply in replies.items() if reply.collectives is not None}
    if len(ledgers) < len(ranks):
        return None
    used = {(name, tuple(ledger.members)) for _, changed in ledgers.values() for name, ledger in changed.items()}
    for comm, members in sorted(used):
        # the members that hold this very communicator (a Split's colours share its name)
        present = [rank for rank in members if rank in ledgers and comm in ledgers[rank][0]
                   and tuple(ledgers[rank][0][comm][1]) == members]
        counts = {rank: ledgers[rank][0][comm][0] for rank in present}
        recent = {rank: dict(ledgers[rank][1][comm].recent) if comm in ledgers[rank][1] else {}
                  for rank in present}
        if len(set(counts.values())) > 1:
            seq = min(counts.values()) + 1
            entries = {rank: ("in", tuple(recent[rank][seq])) if seq in recent[rank] else
                       ("passed", None) if counts[rank] >= seq else ("finished", None) for rank in present}
            return _describe(comm, seq, entries, {}, "", entered=True)
        numbers = set.intersection(*(set(numbers) for numbers in recent.values())) if recent else set()
        for seq in sorted(numbers):
            signatures = {rank: tuple(recent[rank][seq]) for rank in present}
            if _disagree(list(signatures.values())):
                entries = {rank: ("in", signature) for rank, signature in signatures.items()}
                return (_describe(comm, seq, entries, {}, "", entered=True) +
                        "; MPI completed it, so what it moved is not what the cell meant")
    return None


def left_apart(channel, ranks, number, timeout=3.0):
    """After a stopped cell that every one of *ranks* answered: asked afresh (roll call *number*, once any ranks
    let out of MPI have completed what they joined), the communicator whose collectives the ranks left at
    different points, as one line, or ``None``. A root that ran ahead of the others (a broadcast completes on
    its root at once) left messages in flight that the others' next collective would receive."""
    channel.roll_call(ranks, number)
    states, deadline = {}, time.monotonic() + timeout
    while len(states) < len(ranks) and time.monotonic() < deadline:
        for message in channel.receive(0.05, keep=False):
            if isinstance(message, Where) and message.where.asked == number:
                states[message.rank] = message.where
            else:
                channel.hold(message)
    if len(states) < len(ranks):
        return None  # not every rank could say: the next cell's own checks apply
    comms = {(name, tuple(ledger.members)) for state in states.values() for name, ledger in state.ledgers.items()}
    for comm, members in sorted(comms):
        if not set(members) <= set(ranks):
            continue
        counts = {rank: states[rank].ledgers[comm].count for rank in members
                  if comm in states[rank].ledgers and tuple(states[rank].ledgers[comm].members) == members}
        if len(counts) == len(members) and len(set(counts.values())) > 1:
            where = ", ".join(f"rank {rank} after #{count}" for rank, count in sorted(counts.items()))
            return f"the ranks left the collectives on {comm} at different points ({where})"
    return None


def _disagree(signatures):
    """Whether two of *signatures* cannot be the same collective: operation or root differ, or count or type
    where both ranks know them."""
    for a, b in zip(signatures, signatures[1:]):
        if a[0] != b[0] or a[1] != b[1] or (a[2] is not None and b[2] is not None and a[2] != b[2]) or \
                (a[3] and b[3] and a[3] != b[3]):
            return True
    return False


def at_death(world, ranks):
    """The mismatch the mirror files of *ranks* (dead, or ended with the job) show: MPI itself ends the job over
    some mismatches (a count or type that does not fit), and each rank's last words say which collective it was
    in. One line, or ``None``."""
    waits = {rank: mirror_of(world, rank) for rank in ranks}
    waits = {rank: mirror for rank, mirror in waits.items() if mirror is not None}
    for comm in sorted({mirror.comm for mirror in waits.values()}):
        inside = {rank: mirror for rank, mirror in waits.items() if mirror.comm == comm}
        if len({mirror.seq for mirror in inside.values()}) == 1 and \
                _disagree([tuple(mirror.signature) for mirror in inside.values()]):
            seq = next(iter(inside.values())).seq
            entries = {rank: ("in", tuple(mirror.signature)) for rank, mirror in inside.items()}
            return _describe(comm, seq, entries, {}, "")
    return None


def members(states, comm, ranks):
    """The world ranks in *comm*, as a rank's ledger in *states* (roll-call answers) gives them, else *ranks*."""
    for state in states.values():
        ledger = state.ledgers.get(comm)
        if ledger is not None:
            return tuple(ledger.members)
    return tuple(ranks)


def waiting_from_mirror(world, rank, states, ranks):
    """The collective *rank* waits in, read from its mirror file, as its roll-call answer would give it: for a
    rank that cannot answer (a pickle-based collective holds the GIL). ``None`` when it is not in one."""
    mirror = mirror_of(world, rank) if world is not None else None
    if mirror is None or mirror.raised:
        return None
    return Wait(mirror.comm, members(states, mirror.comm, ranks), mirror.seq, mirror.signature)


def mirror_of(world, rank):
    """What *rank*'s mirror file says (``rank/tracing/mirror.py``), when the rank runs on this host."""
    path = world.stack_files.get(rank)
    if path is None or world.is_remote(rank):
        return None
    return read_mirror(ledger_path(path))


def _entry(state, comm, seq, finished, failed, members=None):
    """``(kind, signature)`` of one member at collective *seq* of *comm*: in it, passed it, or where instead."""
    if state is None:
        return ("failed", None) if failed else ("finished", None) if finished else ("silent", None)
    wait = state.waiting
    if wait is not None and wait.comm == comm and wait.seq == seq:
        return "in", tuple(wait.signature)
    ledger = state.ledgers.get(comm)
    if ledger is not None and members is not None and tuple(ledger.members) != tuple(members):
        ledger = None  # a communicator of the same name without this rank's partners (another Split colour)
    if ledger is not None:
        for number, signature in ledger.recent:
            if number == seq:
                return "passed", tuple(signature)
        if ledger.count >= seq:
            return "passed", None  # too long ago to say how
    if failed:
        return "failed", None
    return ("finished", None) if finished else ("elsewhere", None)


def signature_text(signature):
    """``Bcast(root=0, 4 x float64)``."""
    op, root, count, dtype = signature
    parts = [f"root={root}"] if root is not None else []
    if count is not None:
        parts.append(f"{count} x {dtype}")
    elif dtype:
        parts.append(str(dtype))
    return f"{op}({', '.join(parts)})"


def _describe(comm, seq, entries, states, code, *, entered=False):
    groups = {}
    for rank, (kind, signature) in entries.items():
        line = _stack(rank, states[rank]).line(code) if rank in states else (None, "")
        key = (kind, signature, line if kind in ("in", "passed", "elsewhere") else (None, ""))
        groups.setdefault(key, []).append(rank)
    order = {"in": 0, "passed": 1, "elsewhere": 2, "finished": 3, "failed": 4, "silent": 5}
    parts = []
    for (kind, signature, (place, text)), members in sorted(groups.items(), key=lambda item: (order[item[0][0]],
                                                                                                item[1][0])):
        who = label_ranks(members)
        if kind == "in":
            verb = "called" if entered else "in"
            parts.append(f"{who} {verb} {signature_text(signature)}" + (f" at {place}" if place else ""))
        elif kind == "passed":
            how = f" as {signature_text(signature)}" if signature else ""
            now = f" (now at {place}: {text})" if place else ""
            parts.append(f"{who} passed it{how}{now}" if not entered else f"{who} called it")
        elif kind == "elsewhere":
            where = f" (at {place}: {text})" if place else ""
            parts.append(f"{who} {'is' if len(members) == 1 else 'are'} not in a collective{where}")
        elif kind == "finished":
            parts.append(f"{who} finished the cell without entering it")
        elif kind == "failed":
            parts.append(f"{who} failed before it")
        else:
            parts.append(f"{who} did not answer the roll call")
    text = f"collective #{seq} on {comm}: " + "; ".join(parts)
    hint = advice(comm, entries)
    return f"{text}. Likely {hint}" if hint and comm.startswith("torch:") else text


def _stack(rank, state):
    return RankStack(rank, frames=[tuple(frame) for frame in state.frames], cell_file=state.cell_file)


def _asked(state):
    """The roll call *state* answers (``None``: no answer yet, or one sent unasked)."""
    return None if state is None else state.asked
