"""Run a cell on the ranks: stream their output by rank, wait, and turn replies into values or one error."""

import time
from dataclasses import dataclass, field

from .errors import GatherError, RankError
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
    gathered: dict = field(default_factory=dict)  # name -> PerRank of the ranks that had it
    gather_errors: dict = field(default_factory=dict)  # name -> {rank: message}
    gather_stats: dict = field(default_factory=dict)  # name -> {rank: {leaf path: statistics}}
    gather_notes: list = field(default_factory=list)  # how gathers travelled when not as asked

    @property
    def ok(self):
        return not self.errors

    def rank_ordered(self):
        """The cell's output rank by rank, in rank order."""
        return rank_ordered(self.stdout, self.stderr, ranks=self.ranks)

    def raise_for_errors(self):
        if self.errors:
            raise RankError(self.errors, self.ranks)

    def raise_for_gather_errors(self):
        if self.gather_errors:
            raise GatherError("\n".join(missing_message(name, errors, self.gathered.get(name, {}))
                                         for name, errors in self.gather_errors.items()))


def run_cell(world, code, *, ranks=None, number=0, stream=True, printer=None, metrics=None, options=None,
             interrupt_grace=5.0, liveness_every=0.5):
    """Run *code* on *ranks* of *world* (default: all) and return a :class:`CellResult`.

    Output is printed as it arrives when *stream* is true, each line labelled ``[rank R]``. Metric batches
    from ``mpinb.report()`` go to *metrics* (a :class:`~mpinb.live.LiveMetrics`), which is ticked between
    messages. *options* travel with the cell to the ranks' agents. A rank whose process dies is reported as
    failed instead of being waited for (checked every *liveness_every* s). A ``KeyboardInterrupt`` while
    waiting interrupts the ranks, waits up to *interrupt_grace* seconds for them to say where they stopped,
    and is raised again.
    """
    ranks = world.ranks if ranks is None else list(ranks)
    printer = printer or RankPrinter()
    result = CellResult(ranks=ranks, stdout={r: "" for r in ranks}, stderr={r: "" for r in ranks})
    started = time.perf_counter()
    channel = world.channel
    cell_id = channel.send_cell(ranks, code, number, options)
    replies = {}
    interrupted = give_up_at = None
    check_liveness_at = time.monotonic() + liveness_every
    wait = liveness_every if metrics is None else min(liveness_every, metrics.refresh_interval)
    while len(replies) < len(ranks):
        try:
            for message in channel.receive(wait):
                kind = message[0]
                if kind == "out" and message[2] == cell_id:
                    _, rank, _, name, text = message
                    getattr(result, name)[rank] += text
                    if stream:
                        printer.feed(rank, name, text)
                elif kind == "metrics" and metrics is not None:
                    metrics.add(message[1], message[2])
                elif kind == "reply" and message[2] == cell_id:
                    replies[message[1]] = message[3]
                    if "gathered" in message[3]:  # copy out now, while other ranks are still sending
                        _unpack_gathered(world, result, message[1], message[3])
            now = time.monotonic()
            if metrics is not None:
                metrics.tick(now)
            if now < check_liveness_at:
                continue
            check_liveness_at = now + liveness_every
            for rank in world.dead_ranks(set(ranks) - set(replies)):
                replies[rank] = {"error": _lost(f"rank {rank} died (its process exited) while running the cell; "
                                                "%mpi restart starts a fresh world")}
            if give_up_at is not None and now > give_up_at:
                break
        except KeyboardInterrupt as exc:
            if interrupted is not None:
                break
            interrupted, give_up_at = exc, time.monotonic() + interrupt_grace
            world.interrupt(set(ranks) - set(replies))
    printer.finish()
    if metrics is not None:
        metrics.finish()
    result.seconds = time.perf_counter() - started
    for rank in ranks:
        reply = replies.get(rank)
        if reply is None:
            result.errors[rank] = _lost(f"no answer within {interrupt_grace:g} s of the interrupt (stuck in C or an "
                                        "MPI call?); %mpi restart starts a fresh world")
        elif "error" in reply:
            result.errors[rank] = reply["error"]
        elif reply["value"] is not None:
            result.values[rank] = reply["value"]
    if interrupted is not None:
        raise interrupted
    return result


def _unpack_gathered(world, result, rank, reply):
    gathered, buffers = reply.pop("gathered"), reply.pop("buffers", [])
    if "note" in gathered:
        result.gather_notes.append(f"rank {rank}: {gathered['note']}")
    for owner, values in world.receiver.unpack(rank, gathered, buffers).items():
        for name, (kind, value, stats) in values.items():
            if kind == "error":
                result.gather_errors.setdefault(name, {})[owner] = value
            else:
                result.gathered.setdefault(name, PerRank())[owner] = value
                result.gather_stats.setdefault(name, {})[owner] = stats
    for name in result.gathered:  # keep rank order whatever order replies came in
        result.gathered[name] = PerRank(sorted(result.gathered[name].items()))


def _lost(message):
    return {"ename": "RankLost", "evalue": message, "traceback": []}
