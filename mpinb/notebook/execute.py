"""Run a cell on the ranks: stream their output by rank, wait, and turn replies into values or one error."""

import signal
import sys
import time
from dataclasses import dataclass, field

from ..errors import GatherError, MPIError, RankError, RankLost
from ..wire.kinds import Input, Metrics, Out, Reply, Settled, TraceSpans, Waiting, Where
from ..wire.ranks import label_ranks
from .diagnose import capture_stacks, death_report, fatal_stack, last_stderr
from .gather import missing_message
from .mismatch import MismatchWatch, after_cell, at_death
from .output import RankPrinter, rank_ordered
from .perrank import PerRank
from .recover import Recovery


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
    trouble: str = None  # why mpinb stopped the cell: "timeout", "failure" (a rank failed), "interrupt"
    stacks: dict = field(default_factory=dict)  # rank -> RankStack captured when the cell was stopped
    stuck: list = field(default_factory=list)  # ranks that did not answer the interrupt
    finished: list = field(default_factory=list)  # ranks that completed the cell without error
    first_failure: int = None
    first_death: int = None
    grace: float = None  # seconds the stopped ranks were given to answer the interrupt
    mismatch: str = None  # the mismatched collective that made mpinb stop the cell
    recovered: str = None  # how ranks stuck in MPI were let out (the world and its variables kept)
    unrecoverable: str = None  # why ranks stuck in MPI could not be let out

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


def run_cell(world, code, *, ranks=None, number=0, stream=True, printer=None, metrics=None, options=None,
             timeout=None, abort_grace=2.0, interrupt_grace=5.0, liveness_every=0.5, status=None,
             collective_wait=1.0, trace=None, recover=True, progress=None):
    """Run *code* on *ranks* of *world* (default: all) and return a :class:`CellResult`.

    Output is printed as it arrives when *stream* is true, each line labelled ``[rank R]``. Metric batches
    from ``mpinb.report()`` go to *metrics* (a :class:`~mpinb.notebook.live.LiveMetrics`), which is ticked between
    messages. *options* travel with the cell to the ranks' agents.

    The cell is stopped — each running rank's stack captured first, then SIGINT — when *timeout* seconds pass,
    when a rank has failed and the others have not finished *abort_grace* seconds later (they are most likely
    waiting for it in a collective; ``None`` waits for them), or on ``KeyboardInterrupt`` (raised again
    afterwards). Where each running rank is, is printed at once. Ranks that do not answer the interrupt within
    *interrupt_grace* seconds (:data:`COMMUNICATION_GRACE` when all of them wait in communication) are listed in
    ``result.stuck``. A rank whose process dies is reported, with what mpiexec said about it, within
    *liveness_every* seconds. *status* (a :class:`~mpinb.notebook.live.CellStatus`) is ticked as the cell runs.

    When a rank has waited *collective_wait* seconds in one collective, every rank is asked where it is, and
    ranks proven to be in different collectives stop the cell (``result.mismatch``; ``None`` turns it off).
    Spans of a traced cell go to *trace* (a :class:`~mpinb.notebook.live.LiveTrace`). With *recover*, ranks stuck in MPI
    after the interrupt are let out where the other ranks can complete what they wait for (``recover.py``):
    ``result.recovered`` says how, ``result.unrecoverable`` why not; meanwhile a line made by *progress* (a
    callable returning a :class:`~mpinb.widgets.views.Progress`) says what the recovery is doing.
    """
    ranks = world.ranks if ranks is None else list(ranks)
    printer = printer or RankPrinter()
    result = CellResult(ranks=ranks, stdout={r: "" for r in ranks}, stderr={r: "" for r in ranks})
    started = time.perf_counter()
    dead = world.dead_ranks_lately(ranks, within=liveness_every)
    if dead:
        raise MPIError(f"{label_ranks(dead)} of this world died earlier, so it cannot run cells: {RESTART}")
    channel = world.channel
    released = world.receiver.take_released() if world.receiver is not None else {}
    if released:  # the segments whose gathered values were all dropped: the ranks may write there again
        options = dict(options or {}, released=released)
    cell_id = channel.send_cell(ranks, code, number, options)
    replies = {}
    interrupted = give_up_at = first_failure = death_seen = None
    deadline = time.monotonic() + timeout if timeout else None
    check_liveness_at = time.monotonic() + liveness_every
    wait = liveness_every if metrics is None else min(liveness_every, metrics.refresh_interval)
    watch = MismatchWatch(channel, ranks, code, world=world, after=collective_wait) \
        if collective_wait is not None else None
    recovery = Recovery(channel, world, ranks) if recover else None
    line = None  # the progress line of a recovery under way

    def stop(reason, stacks=None):
        """Say at once who failed and where every running rank is, then interrupt those ranks. Ranks waiting in
        communication do not answer an interrupt: when all of them do, they are given up on at once."""
        nonlocal give_up_at
        pending = [rank for rank in ranks if rank not in replies]
        result.trouble = reason
        stacks = dict(stacks or {})
        missing = [rank for rank in pending if rank not in stacks]
        result.stacks = {**capture_stacks(world, missing), **stacks} if missing else stacks
        _announce(result, pending, code, timeout, first_failure, replies, printer)
        world.interrupt(pending)
        waiting = all(result.stacks[rank].in_communication(code) for rank in pending if rank in result.stacks)
        result.grace = min(COMMUNICATION_GRACE, interrupt_grace) if waiting else interrupt_grace
        give_up_at = time.monotonic() + result.grace
        if recovery is not None:  # time to find what the stuck ranks wait in, and to let them out
            give_up_at = max(give_up_at, time.monotonic() + recovery.settle_within + 0.5)

    while len(replies) < len(ranks):
        try:
            for message in channel.receive(wait):
                if isinstance(message, Out) and message.cell_id == cell_id:
                    rank, _, name, text = message
                    getattr(result, name)[rank] += text
                    if stream:
                        printer.feed(rank, name, text)
                elif isinstance(message, Metrics) and metrics is not None:
                    metrics.add(message.rank, message.records)
                elif isinstance(message, (Waiting, Where)):
                    if watch is not None and message.cell_id in (cell_id, None):
                        watch.feed(message)
                    if recovery is not None and isinstance(message, Where):
                        recovery.feed(message)
                elif isinstance(message, Settled) and recovery is not None:
                    recovery.feed(message)
                elif isinstance(message, Input) and message.cell_id == cell_id:  # a debugger on a rank asks
                    _ask(channel, printer, message.rank, message.prompt)
                elif isinstance(message, TraceSpans) and trace is not None and message.cell_id == cell_id:
                    trace.add(message.rank, message.spans, message.dropped, message.clocks)
                elif isinstance(message, Reply) and message.cell_id == cell_id:
                    replies[message.rank] = message.reply
                    if "gathered" in message.reply:  # copy out now, while other ranks are still sending
                        _unpack_gathered(world, result, message.rank, message.reply)
                    if "error" in message.reply and first_failure is None and result.trouble is None:
                        first_failure = (message.rank, time.monotonic())
                        pending = [rank for rank in ranks if rank not in replies]
                        early = capture_stacks(world, pending) if pending and abort_grace is not None else {}
                        if early and all(stack.in_communication(code) for stack in early.values()):
                            stop("failure", early)  # they wait for the failed rank: no point in waiting for them
            now = time.monotonic()
            if metrics is not None:
                metrics.tick(now, finished=list(replies))
            if status is not None:
                status.tick(time.perf_counter() - started, ranks, replies)
            if result.trouble is None and len(replies) < len(ranks):
                verdict = watch.tick(replies, now) if watch is not None else None
                if verdict is not None:
                    result.mismatch = verdict
                    stop("mismatch", watch.stacks([rank for rank in ranks if rank not in replies]))
                elif deadline is not None and now >= deadline:
                    stop("timeout")
                elif first_failure and abort_grace is not None and now >= first_failure[1] + abort_grace:
                    stop("failure")
            if result.trouble is not None and recovery is not None and len(replies) < len(ranks) \
                    and result.first_death is None:
                more = recovery.tick(replies, now)
                if more is not None:
                    give_up_at = now + more
                elif recovery.reason is not None:
                    give_up_at = min(give_up_at, now)  # nothing will let them out: restart at once
                if progress is not None:
                    line = line or progress()
                    line.update(recovery.stage(replies))
            if now < check_liveness_at:
                continue
            check_liveness_at = now + liveness_every
            _check_deaths(world, ranks, replies, result, code)
            if result.first_death is not None and result.mismatch is None and watch is not None:
                result.mismatch = at_death(world, ranks)
            if result.first_death is not None and len(replies) < len(ranks):
                # a world with a dead rank cannot finish a collective; mpiexec normally ends the rest at once
                death_seen = death_seen or now
                if now - death_seen > 2 * liveness_every:
                    for rank in ranks:
                        replies.setdefault(rank, {"error": _lost(
                            f"still running when rank {result.first_death} died; the world cannot be used any more")})
            if give_up_at is not None and now > give_up_at:
                break
        except KeyboardInterrupt as exc:
            if interrupted is not None:
                break  # a second interrupt: stop waiting at once
            interrupted = exc
            stop("interrupt")
    printer.finish()
    if line is not None:
        line.close()
    if metrics is not None:
        metrics.finish()
    result.seconds = time.perf_counter() - started
    result.first_failure = first_failure[0] if first_failure else None
    for rank in ranks:
        reply = replies.get(rank)
        if reply is None:
            result.stuck.append(rank)
            result.errors[rank] = _stopped(result, rank, code, timeout, result.grace, answered=False)
        elif "error" in reply:
            error = reply["error"]
            if rank in result.stacks and error["ename"] == "KeyboardInterrupt":
                error = _stopped(result, rank, code, timeout, result.grace, answered=True)
            result.errors[rank] = error
        elif reply["value"] is not None:
            result.values[rank] = reply["value"]
    if result.mismatch is not None and result.first_death is not None:  # MPI ended the job over it
        for rank, error in result.errors.items():
            if error["ename"] == RankLost.__name__:  # one message for every rank, since it names each rank's part
                result.errors[rank] = _lost(f"ranks were in different collectives, and MPI ended the job over "
                                            f"it: {result.mismatch}")
                result.errors[rank]["ename"] = "CollectiveMismatch"
    if not result.errors and result.trouble is None and watch is not None:
        result.mismatch = after_cell(replies, ranks)
        if result.mismatch is not None:
            result.trouble = "mismatch"
            for rank in ranks:
                result.errors[rank] = {"ename": "CollectiveMismatch", "evalue": result.mismatch, "traceback": []}
    if recovery is not None and result.trouble is not None:
        if recovery.plan is not None and not result.stuck:
            result.recovered = recovery.note
        elif result.stuck:
            result.unrecoverable = recovery.reason or _why_stuck(recovery)
    result.finished = [rank for rank in ranks if rank not in result.errors]
    for name, values in result.gathered.items():  # rank order, whatever order the replies came in
        result.gathered[name] = PerRank(sorted(values.items()))
    if interrupted is not None:
        interrupted.mpinb_result = result  # where each rank was, for whoever handles the interrupt
        raise interrupted
    return result


COMMUNICATION_GRACE = 0.5  # seconds ranks waiting in communication get to answer an interrupt anyway
RESTART = "%mpi restart starts a fresh world of the same size"  # what to do once a rank died


def _announce(result, pending, code, timeout, first_failure, replies, printer):
    """The diagnosis, printed the moment the cell is stopped: why, then where each running rank is."""
    printer.finish()
    if result.trouble == "failure" and first_failure is not None:
        error = replies[first_failure[0]]["error"]
        message = error["evalue"].splitlines()[0] if error["evalue"] else ""
        why = f"rank {first_failure[0]} failed ({error['ename']}: {message})"
    elif result.trouble == "timeout":
        why = f"the cell ran past its {timeout:g} s timeout"
    elif result.trouble == "mismatch":
        why = f"ranks are in different collectives: {result.mismatch}"
    else:
        why = "interrupted"
    places = {}  # ranks at the same place are listed once, as identical failures are
    for rank in pending:
        stack = result.stacks.get(rank)
        places.setdefault(stack.where(code) if stack is not None else "position unknown", []).append(rank)
    lines = [f"[mpinb] {why}; stopping {label_ranks(pending)}:"]
    lines += [f"[mpinb]   {label_ranks(members)}: {where}" for where, members in places.items()]
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


def _stopped(result, rank, code, timeout, grace, *, answered):
    """The error of a rank mpinb stopped: why, where it was, and whether it answered the interrupt."""
    if result.trouble == "mismatch":  # the same for every rank: it names each rank's collective already
        return {"ename": "CollectiveMismatch", "evalue": result.mismatch, "traceback": []}
    stack = result.stacks.get(rank)
    where = stack.where(code) if stack is not None else "position unknown"
    if result.trouble == "timeout":
        why = f"still running after {timeout:g} s"
    elif result.trouble == "failure":
        why = f"stopped after rank {result.first_failure} failed"
    else:
        why = "interrupted"
    ename = {"timeout": "Timeout", "interrupt": "KeyboardInterrupt", "failure": "Aborted"}[result.trouble]
    tail = "" if answered else f"; did not answer the interrupt within {grace:g} s (stuck in C or MPI)"
    frames = ["Where it was (most recent call last):\n" + stack.text() + "\n"] if stack is not None and stack.frames \
        else []
    return {"ename": ename, "evalue": f"{why}, {where}{tail}", "traceback": frames}


def _check_deaths(world, ranks, replies, result, code):
    dead = world.dead_ranks([rank for rank in ranks if rank not in replies])
    if not dead:
        return
    deaths = death_report(world, dead, wait=2.0)
    if result.first_death is None and all(d.returncode is None and not d.abort and d.host is None
                                          for d in deaths.values()):
        caller = next((d.aborted_by for d in deaths.values() if d.aborted_by), None)
        for rank in dead:  # nobody could record anything: the job was ended as a whole
            why = (f"rank {rank} was ended by mpiexec after rank {caller[0]} {caller[1]}" if caller else
                   f"rank {rank} died with the whole job at once, leaving no exit status (MPI_Abort on some rank, "
                   "or mpiexec was killed)")
            replies[rank] = {"error": _lost(why)}
        result.first_death = caller[0] if caller and caller[0] in dead else min(dead)
        return
    for death in sorted(deaths.values(), key=lambda d: (d.when is None, d.when or 0.0)):
        rank, frames = death.rank, []
        if result.first_death is None:
            result.first_death = rank
            message = f"rank {rank} died: {death.describe()}"
            if death.abort:
                message = (f"rank {rank} {death.abort}, so mpiexec ended every rank of the job "
                           f"(error code {death.abort_code})")
            crash = fatal_stack(world, rank) if death.returncode is not None and death.returncode < 0 else None
            if crash is not None and crash.frames:
                message += " " + crash.where(code, verb="in")
                frames = ["Where it crashed (most recent call last):\n" + crash.text() + "\n"]
            tail = "\n".join(last_stderr(world, rank, result.stderr.get(rank, "")).splitlines()[-5:])
            if tail:
                message += f"; its last stderr lines:\n{tail}"
        elif death.returncode in (-signal.SIGKILL, None):
            cause = "called MPI_Abort" if deaths.get(result.first_death, death).abort else "died"
            message = f"rank {rank} was ended by mpiexec after rank {result.first_death} {cause}"
        else:
            message = f"rank {rank} died: {death.describe()} (after rank {result.first_death})"
        replies[rank] = {"error": _lost(message, frames)}


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


def _ask(channel, printer, rank, prompt):
    """Show a rank's debugger prompt through the kernel's stdin (as ``input()`` does) and send the answer back;
    end of input ends its session, and the Stop button ends it before stopping the cell."""
    printer.finish()
    try:
        line = input(prompt)
    except EOFError:
        line = None
    except KeyboardInterrupt:
        channel.send_stdin(rank, None)
        raise
    channel.send_stdin(rank, line)


def _why_stuck(recovery):
    failed = recovery.failed_steps()
    if failed:
        return "letting them out failed: " + "; ".join(f"rank {rank}: {', '.join(problems)}"
                                                       for rank, problems in sorted(failed.items()))
    if recovery.plan is not None:
        return "they stayed in MPI after the other ranks completed what they waited for"
    return None


def _lost(message, frames=()):
    return {"ename": RankLost.__name__, "evalue": message, "traceback": list(frames)}
