"""After a cell is stopped, keep the world: ranks stuck in MPI are let out, so no rank loses its variables.

A stopped cell (a rank failed, ``--timeout``, the Stop button) interrupts every rank still running; a rank
waiting in MPI cannot answer, since MPI does not return to Python. Once every other rank has answered, a roll
call says what each stuck rank waits in (a collective, with its number and signature, or a blocking send or
receive), and the ranks that can complete it are asked to (``rank/settle.py``): the stuck rank returns to Python,
the interrupt ends its cell, and the next cell finds every rank's variables and MPI in agreement. Where that
cannot be done (ranks in different collectives, a rank that passed the collective another waits in, a count
that differs by rank), nothing is attempted and mpinb restarts the world as before, saying why.
"""

import time

from ...wire.kinds import Settled, Where, WhereAnswer
from ...wire.ranks import label_ranks
from . import mismatch


class Recovery:
    """The settling side of one stopped cell: ``start`` when the cell is stopped, ``feed`` roll-call answers and
    ``settled`` messages, ``tick`` it; ``note`` says what was done or why nothing could be.

    Parameters
    ----------
    channel, world
        The world's cell channel (roll calls and settle requests go through it) and the world.
    ranks : list of int
        The ranks the cell ran on.
    """

    def __init__(self, channel, world, ranks):
        self.channel, self.world, self.ranks = channel, world, list(ranks)
        self.states = {}
        self.number = 1000  # roll-call numbers of its own, apart from the mismatch watch's
        self.asked_at = self.began = None
        self.asked_of = ()  # the ranks still stuck when the roll call went out
        self.settle_within = 2.0
        self.outcomes = {}
        self.plan = None
        self.note = None  # what happened, for the user
        self.reason = None  # why the world could not be kept, when it could not

    def feed(self, message):
        match message:
            case Where(rank, _, where) if where.asked == self.number:
                self.states[rank] = where
            case Settled(rank, number, outcome) if number == self.number:
                self.outcomes[rank] = outcome

    def tick(self, replies, now=None):
        """Advance; return seconds more the stuck ranks should be given, once a plan went out, else ``None``.

        The roll call is repeated (every 0.2 s, for ``settle_within`` s) until every rank that has not answered
        the interrupt is seen waiting in MPI: a rank still running Python is about to answer it. A rank that
        answers meanwhile has ended its cell, and its ledger is as it left it: the plan is made from a roll call
        after that."""
        now = time.monotonic() if now is None else now
        pending = [rank for rank in self.ranks if rank not in replies]
        if self.plan is not None or self.reason is not None or not pending:
            return None
        self.began = self.began or now
        if self.asked_at is not None and pending != self.asked_of:
            self.asked_at = None
        if self.asked_at is None:
            self.asked_at, self.asked_of = now, pending
            self.number += 1
            self.states = {}
            self.channel.roll_call(self.ranks, self.number)
            return None
        silent = [rank for rank in self.ranks if rank not in self.states]
        if silent and now < self.asked_at + 0.5:
            return None
        for rank in silent:  # holding the GIL in a pickle-based collective, or gone: its mirror file says
            waiting = mismatch.waiting_from_mirror(self.world, rank, self.states, self.ranks)
            if waiting is not None:
                self.states[rank] = WhereAnswer(waiting)
        in_python = [rank for rank in pending if rank in self.states and not self.states[rank].waiting
                     and not self.states[rank].p2p]
        if in_python and now < self.began + self.settle_within:
            if now >= self.asked_at + 0.2:
                self.asked_at = None  # ask again: those ranks are still on their way out of Python
            return None
        self.plan, self.reason = plan(self.states, self.ranks, pending, replies)
        if self.plan is None:
            return None
        for rank, items in self.plan.items():
            self.channel.settle(rank, self.number, items)
        # with nothing to do (every rank in the collective, as in a DDP backward that holds Stop), no rank stood in
        self.note = describe(self.states, pending) if self.plan else None
        return 3.0

    def stage(self, replies):
        """What the recovery is doing, for the progress line: ``letting ranks 0-1 out of Recv on COMM_WORLD``."""
        pending = [rank for rank in self.ranks if rank not in replies]
        if self.reason is not None:
            return f"{label_ranks(pending)} cannot be let out ({self.reason})"
        if self.plan:
            return f"letting {label_ranks(pending)} out: {describe(self.states, pending).replace(' left ', ' in ')}"
        if self.plan is not None:  # nothing to do: they finish the collective they are all in, then stop
            return f"waiting for {describe(self.states, pending).replace(' left ', ' to finish ')}"
        return f"asking {label_ranks(pending)} where they wait in MPI"

    def failed_steps(self):
        """``{rank: [what went wrong, ...]}`` of the steps that did not work."""
        return {rank: [outcome for outcome in outcomes if outcome] for rank, outcomes in self.outcomes.items()
                if any(outcomes)}


def plan(states, ranks, pending, replies):
    """``({rank: [step, ...]}, None)``: what each rank must do so that the *pending* (stuck) ranks can leave MPI;
    or ``(None, why not)``."""
    steps, joined = {}, set()
    for rank in pending:
        state = states.get(rank)
        if state is None:
            return None, f"rank {rank} did not say where it waits"
        waiting, p2p = state.waiting, state.p2p
        if waiting is not None:
            comm, seq, signature = waiting.comm, waiting.seq, tuple(waiting.signature)
            for member in waiting.members:
                if member == rank or member not in ranks or (comm, seq, member) in joined:
                    continue
                other = states.get(member, WhereAnswer())
                theirs = other.waiting
                if theirs is not None and theirs.comm == comm:
                    if theirs.seq == seq and tuple(theirs.signature) == signature:
                        continue  # stuck in the same collective: it completes when the rest join
                    return None, (f"ranks {rank} and {member} wait in different collectives on {comm}, which MPI "
                                  "cannot undo")
                ledger = other.ledgers.get(comm)
                count = None if ledger is None else ledger.count
                if count is None or count != seq - 1:
                    return None, (f"rank {member} is not just before collective #{seq} on {comm} (where rank "
                                  f"{rank} waits), so it cannot join it")
                if member in pending and theirs is not None:
                    return None, f"rank {member} is itself inside another collective"
                steps.setdefault(member, []).append(("join", comm, signature))
                # the asynchronous ones it waits for after it (DDP's later gradient buckets), in order
                steps[member].extend(("join", comm, tuple(then)) for _, then in waiting.then)
                joined.add((comm, seq, member))
        elif p2p is not None:
            members = mismatch.members(states, p2p.comm, ranks)
            here = members.index(rank) if rank in members else None
            if here is None:
                return None, f"rank {rank} waits on a communicator it is not seen in"
            objects = p2p.op.islower()
            if p2p.receives is not None:
                source, tag, size = p2p.receives
                source = source if source >= 0 else next(i for i, m in enumerate(members) if m != rank)
                steps.setdefault(members[source], []).append(
                    ("send", p2p.comm, here, tag if tag >= 0 else 0, size, objects))
            if p2p.sends is not None:
                dest, tag, size = p2p.sends
                steps.setdefault(members[dest], []).append(("recv", p2p.comm, here, tag, size, objects))
        else:
            return None, f"rank {rank} is not in an MPI call mpinb can complete (in C code, or another library)"
    return steps, None


def describe(states, pending):
    """``ranks 0, 2 left Barrier #3 on COMM_WORLD (the others joined it)`` and the like, one line."""
    parts = []
    for rank in pending:
        state = states.get(rank, WhereAnswer())
        waiting, p2p = state.waiting, state.p2p
        if waiting is not None:
            parts.append((f"{waiting.signature[0]} #{waiting.seq} on {waiting.comm}", rank))
        elif p2p is not None:
            parts.append((f"{p2p.op} on {p2p.comm}", rank))
    grouped = {}
    for what, rank in parts:
        grouped.setdefault(what, []).append(rank)
    return "; ".join(f"{label_ranks(members)} left {what}" for what, members in grouped.items())

