"""Ranks in different collectives, caught while they wait: a roll call of every rank's ledger (``rank/tracing.py``).

When a rank has waited in one collective longer than ``collective_wait`` seconds it says so; the notebook then
asks every rank of the cell where it is (its thread answers even while MPI blocks the main thread) and compares
what the members of that communicator did at that collective's number. A mismatch is decided only on evidence
(two ranks at the same number with a different operation, root, count or type, or a rank that finished the
cell without entering it); a rank that is merely late is waited for, and asked again a second later.
"""

import time

from .diagnose import RankStack
from .ranks import label_ranks


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
    answer_within : float, default 1.0
        Seconds to wait for every rank's answer before deciding with those that answered.
    again_after : float, default 1.0
        Seconds between roll calls while a rank still waits and nothing is decided.
    """

    def __init__(self, channel, ranks, code, *, answer_within=1.0, again_after=1.0):
        self.channel, self.ranks, self.code = channel, list(ranks), code
        self.answer_within, self.again_after = answer_within, again_after
        self.states = {}  # rank -> its last answer
        self.asked_at = None  # when the roll call in progress was sent
        self.next_call = None  # when to call the roll again
        self.calls = 0
        self.verdict = None

    def feed(self, message, now=None):
        """A ``waiting`` or ``rollcall`` message from a rank's roll-call thread."""
        kind, rank, _, where = message
        if kind == "waiting" and "asked" in self.states.get(rank, {}):
            where["asked"] = self.states[rank]["asked"]  # it answered the roll call in progress already
        self.states[rank] = where
        if kind == "waiting" and self.asked_at is None:
            self._call(time.monotonic() if now is None else now)

    def tick(self, replies, now=None):
        """Decide once every rank answered (or ``answer_within`` passed); return the mismatch text or ``None``."""
        now = time.monotonic() if now is None else now
        if self.verdict is not None:
            return None
        if self.asked_at is None:
            if self.next_call is not None and now >= self.next_call:
                self._call(now)
            return None
        answered = all(self.states.get(rank, {}).get("asked") == self.calls for rank in self.ranks)
        if not answered and now < self.asked_at + self.answer_within:
            return None
        self.asked_at = None
        finished = {rank for rank, reply in replies.items() if "error" not in reply}
        failed = {rank for rank, reply in replies.items() if "error" in reply}
        self.verdict = diagnose(self.states, self.ranks, finished, failed, self.code)
        if self.verdict is None and any(state.get("waiting") for state in self.states.values()):
            self.next_call = now + self.again_after
        return self.verdict

    def stacks(self, ranks):
        """``{rank: RankStack}`` from the answers (where each rank was when it answered)."""
        return {rank: _stack(rank, self.states[rank]) for rank in ranks if rank in self.states}

    def _call(self, now):
        self.calls += 1
        self.asked_at, self.next_call = now, None
        for state in self.states.values():
            state.pop("asked", None)
        self.channel.roll_call(self.ranks, self.calls)


def diagnose(states, ranks, finished, failed, code=""):
    """The mismatch the answers in *states* (``{rank: where}``) prove, as one line, or ``None``."""
    waiting = {rank: state["waiting"] for rank, state in states.items() if state.get("waiting")}
    for comm in sorted({wait["comm"] for wait in waiting.values()}):
        first = min((wait for wait in waiting.values() if wait["comm"] == comm), key=lambda wait: wait["seq"])
        seq, members = first["seq"], [rank for rank in first["members"] if rank in ranks]
        entries = {rank: _entry(states.get(rank), comm, seq, rank in finished, rank in failed) for rank in members}
        signatures = {_comparable(signature) for kind, signature in entries.values()
                      if kind in ("in", "passed") and signature is not None}
        if len(signatures) > 1 or any(kind == "finished" for kind, _ in entries.values()):
            return _describe(comm, seq, entries, states, code)
    return None


def _entry(state, comm, seq, finished, failed):
    """``(kind, signature)`` of one member at collective *seq* of *comm*: in it, passed it, or where instead."""
    if state is None:
        return ("failed", None) if failed else ("finished", None) if finished else ("silent", None)
    wait = state.get("waiting")
    if wait is not None and wait["comm"] == comm and wait["seq"] == seq:
        return "in", tuple(wait["signature"])
    ledger = state["ledgers"].get(comm)
    if ledger is not None:
        for number, signature in ledger["recent"]:
            if number == seq:
                return "passed", tuple(signature)
        if ledger["count"] >= seq:
            return "passed", None  # too long ago to say how
    if failed:
        return "failed", None
    return ("finished", None) if finished else ("elsewhere", None)


def _comparable(signature):
    """What must agree between ranks: operation, root, count (not for the v-variants) and type."""
    return tuple(signature)


def signature_text(signature):
    """``Bcast(root=0, 4 x float64)``."""
    op, root, count, dtype = signature
    parts = [f"root={root}"] if root is not None else []
    if count is not None:
        parts.append(f"{count} x {dtype}")
    elif dtype:
        parts.append(str(dtype))
    return f"{op}({', '.join(parts)})"


def _describe(comm, seq, entries, states, code):
    lines = code.splitlines()
    groups = {}
    for rank, (kind, signature) in entries.items():
        line = _stack(rank, states[rank]).cell_line if rank in states else None
        key = (kind, signature, line if kind in ("in", "passed", "elsewhere") else None)
        groups.setdefault(key, []).append(rank)
    order = {"in": 0, "passed": 1, "elsewhere": 2, "finished": 3, "failed": 4, "silent": 5}
    parts = []
    for (kind, signature, line), members in sorted(groups.items(), key=lambda item: (order[item[0][0]],
                                                                                       item[1][0])):
        who = label_ranks(members)
        text = lines[line - 1].strip() if line and line <= len(lines) else ""
        if kind == "in":
            parts.append(f"{who} in {signature_text(signature)}" + (f" at cell line {line}" if line else ""))
        elif kind == "passed":
            how = f" as {signature_text(signature)}" if signature else ""
            now = f" (now at cell line {line}: {text})" if line else ""
            parts.append(f"{who} passed it{how}{now}")
        elif kind == "elsewhere":
            where = f" (at cell line {line}: {text})" if line else ""
            parts.append(f"{who} {'is' if len(members) == 1 else 'are'} not in a collective{where}")
        elif kind == "finished":
            parts.append(f"{who} finished the cell without entering it")
        elif kind == "failed":
            parts.append(f"{who} failed before it")
        else:
            parts.append(f"{who} did not answer the roll call")
    return f"collective #{seq} on {comm}: " + "; ".join(parts)


def _stack(rank, state):
    return RankStack(rank, frames=[tuple(frame) for frame in state.get("frames", [])],
                     cell_file=state.get("cell_file", ""))
