"""One cell on the ranks, from the moment it is sent to its result: each message as it arrives, the checks
between messages (a deadline, a failed rank the others wait for, mismatched collectives, a death), stopping the
cell when one of them says so, and letting ranks stuck in MPI out afterwards."""

import sys
import time

from IPython.core.error import StdinNotImplementedError

from ...errors import MPIError, RankLost
from ...wire.channel import Unreached
from ...wire.ranks import label_ranks
from .. import panel, stops
from ..world import State
from ..debug import visual_debugger
from ..diagnosis import native
from . import gather
from ...wire.kinds import (CellReply, DebugAnswer, DebugStopped, Input, Kept, Metrics, Out, Reply, Settled,
                          TraceSpans, Waiting, Where)
from ..diagnosis import MismatchWatch, Recovery, after_cell, at_death, capture_stacks, differences, left_apart
from .perrank import PerRank
from .rank_errors import announce, check_deaths, died_earlier, lost, stopped, why_stuck

COMMUNICATION_GRACE = 0.5  # seconds ranks waiting in communication get to answer an interrupt anyway
EARLY_LOOK = 0.2  # seconds after the first failure before the ranks still running are asked where they are


LEFT_APART = 2_000_000  # roll-call numbers of the check after a stopped cell, apart from the watch's and recovery's


class InFlight:
    """The state of one running cell; :meth:`run` waits for it and returns its :class:`CellResult`. The
    settings are :func:`~mpinb.notebook.cell.dispatch.dispatch`'s."""

    def __init__(self, world, code, result, settings):
        self.world, self.code, self.result, self.settings = world, code, result, settings
        self.ranks, self.printer = result.ranks, settings.printer
        self.replies = {}
        self.interrupted = self.give_up_at = self.first_failure = self.death_seen = self.look_at = None
        self.stops_seen = 0  # Stops pressed during this cell that were acted on
        self.no_stdin = False  # the front end answers no prompts (nbclient, papermill): debuggers go on
        self.line = None  # the progress line of a recovery under way
        self.channel = world.channel
        self.watch = (MismatchWatch(self.channel, self.ranks, code, world=world, after=settings.collective_wait)
                      if settings.collective_wait is not None else None)
        self.recovery = Recovery(self.channel, world, self.ranks) if settings.recover else None
        self.panel = visual_debugger.current  # the kernel's visual debugger, when the extension runs in a kernel
        self.ticked = None  # when the checks between messages last ran

    @property
    def pending(self):
        return [rank for rank in self.ranks if rank not in self.replies]

    def run(self, options):
        """Send the cell with *options*, wait for every rank (or give up on the stuck), return the result.

        A Stop is acted on between messages, never half-way through one: the first interrupts the cell, the
        second says what is still awaited and for how long, the third stops waiting (``result.ended``: the
        caller ends the world)."""
        settings, now = self.settings, time.monotonic()
        self.started = time.perf_counter()
        self.world.lifecycle.move(State.RUNNING)
        with stops.deferred():
            self.pressed = stops.presses()
            try:
                self.cell_id = self.result.cell_id = self.channel.send_cell(self.ranks, self.code, settings.number,
                                                                            options)
            except Unreached as unreached:  # a rank's connection is gone: if its process is, say which died and how
                dead = self.world.dead_ranks(self.ranks)
                if not dead:
                    raise
                if not unreached.reached or not set(unreached.unreached) <= set(dead):
                    self.world.lifecycle.dead()
                    raise MPIError(died_earlier(self.world, dead)) from None
                # the ranks sent to first began the cell (one may have ended the rest: MPI_Abort); the dead are
                # found, and said how they died, as in any cell
                self.cell_id = self.result.cell_id = unreached.cell_id
            self.deadline = now + settings.timeout if settings.timeout else None
            self.check_liveness_at = now + settings.liveness_every
            metrics = settings.metrics
            wait = settings.liveness_every if metrics is None else min(settings.liveness_every,
                                                                       metrics.refresh_interval)
            ended = False
            if self.panel is not None:
                self.panel.cell_started(self.channel, self.ranks)
            panel.cell_started(self.world, settings.number, self.ranks, self.code)  # JupyterLab's MPI panel
            try:
                while len(self.replies) < len(self.ranks) and not ended:
                    try:
                        for message in self.channel.receive(wait):
                            self.handle(message)
                            # between messages too: ranks that report faster than the notebook reads keep it busy
                            ended = ended or self.check_stops()
                    except KeyboardInterrupt:  # a Stop at a prompt (the only place one raises): counted already
                        pass
                    ended = ended or self.tick(time.monotonic()) or self.check_stops()
            finally:
                if self.panel is not None:
                    self.panel.cell_ended()
                panel.cell_ended()
        return self.finish()

    def check_stops(self):
        """Act on the Stops pressed since the last look; whether to stop waiting (the third)."""
        pressed = stops.presses() - self.pressed
        if pressed <= self.stops_seen:
            return False
        self.stops_seen = pressed
        if self.interrupted is None:
            self.interrupted = KeyboardInterrupt()
        if self.result.trouble is None:
            self.stop("interrupt")
            return False
        if pressed >= 3:
            self.result.ended = f"Stop pressed {pressed} times"
            return True
        self.printer.finish()
        pending = self.pending
        left = max(0.0, (self.give_up_at or time.monotonic()) - time.monotonic())
        what = self.recovery.stage(self.replies) if self.recovery is not None and self.recovery.plan else \
            "to answer the interrupt"
        print(f"[mpinb] still waiting for {label_ranks(pending)} {what} (at most {left:.0f} s more, then the "
              f"world is started again); press Stop (Ctrl-C) again to end the world now (the next %%mpi brings back every rank's variables as of the last cell every rank finished and kept)",
              file=sys.stderr, flush=True)
        return False

    def handle(self, message):
        """One message from a rank: output, metrics, a roll-call answer, a prompt, trace spans or the reply."""
        result, settings, watch, recovery = self.result, self.settings, self.watch, self.recovery
        if panel.feed(message):  # the MPI panel's own roll call, answered: for the panel alone
            return
        if isinstance(message, Out) and message.cell_id in (self.cell_id, None):  # None: written between cells
            rank, _, name, text = message
            streams = getattr(result, name)
            if rank in streams:
                streams[rank] += text
                if settings.stream:
                    self.printer.feed(rank, name, text)
            else:  # a rank the cell does not run on, writing between its cells (a thread, C): shown, not the cell's
                self.printer.feed(rank, name, text)
        elif isinstance(message, Metrics) and settings.metrics is not None:
            settings.metrics.add(message.rank, message.records)
        elif isinstance(message, (Waiting, Where)):
            if watch is not None and message.cell_id in (self.cell_id, None):
                watch.feed(message)
            if recovery is not None and isinstance(message, Where):
                recovery.feed(message)
        elif isinstance(message, Settled) and recovery is not None:
            recovery.feed(message)
        elif isinstance(message, Input) and message.cell_id == self.cell_id:  # a debugger on a rank asks
            self.ask(message.rank, message.prompt)
        elif isinstance(message, DebugStopped) and message.cell_id == self.cell_id and self.panel is not None:
            self.panel.on_stopped(message, time.monotonic())
        elif isinstance(message, DebugAnswer) and self.panel is not None:
            self.panel.on_answer(message)
        elif isinstance(message, TraceSpans) and settings.trace is not None and message.cell_id == self.cell_id:
            settings.trace.add(message.rank, message.spans, message.dropped, message.clocks)
        elif isinstance(message, Kept):
            self.world.kept_state.note_taken(message.rank, message.cell_id)
        elif isinstance(message, Reply) and message.cell_id == self.cell_id:
            self.reply(message.rank, message.reply)

    def reply(self, rank, reply):
        self.replies[rank] = reply
        if self.panel is not None:
            self.panel.on_reply(rank)
        if reply.gathered is not None:  # copy out now, while other ranks are still sending
            _unpack_gathered(self.world, self.result, rank, reply)
        if reply.error is not None and self.first_failure is None and self.result.trouble is None:
            self.first_failure = (rank, time.monotonic())
            self.look_at = self.first_failure[1] + EARLY_LOOK

    def look_early(self):
        """Where the ranks still running are, a moment after the first failure: when all of them wait in
        communication they wait for the failed rank, and are stopped without waiting ``abort_grace``. Not at once:
        a cell that fails on every rank ends on all of them within milliseconds, and a rank asked for its stack
        as it ends its cell gets a signal it need not have had."""
        self.look_at = None
        early = capture_stacks(self.world, self.pending) if self.settings.abort_grace is not None else {}
        if early and all(stack.in_communication(self.code) for stack in early.values()):
            self.stop("failure", early)  # they wait for the failed rank: no point in waiting for them

    def ask(self, rank, prompt):
        """Show a rank's debugger prompt through the kernel's stdin (as ``input()`` does) and send the answer back;
        end of input ends its session, and the Stop button ends it before stopping the cell. A front end that
        answers no prompts (``allow_stdin=False``: nbclient, papermill) makes every debugger of the cell go on
        (``c``), said once."""
        channel = self.channel
        self.printer.finish()
        if self.no_stdin:
            channel.send_stdin(rank, "c")
            return
        asked = time.monotonic()
        try:
            with stops.raising():
                line = input(prompt)
        except EOFError:
            line = None
        except StdinNotImplementedError:
            self.no_stdin = True
            print(f"[mpinb] rank {rank} reached a debugger (breakpoint() or pdb), but this front end answers no "
                  "prompts (it sent allow_stdin=False, as nbclient and papermill do): the ranks go on without "
                  "stopping there; run the cell in JupyterLab, Notebook or IPython to debug it", file=sys.stderr,
                  flush=True)
            line = "c"
        except KeyboardInterrupt:
            channel.send_stdin(rank, None)
            raise
        finally:  # time at a debugger's prompt is the user's, not the cell's: --timeout counts running time
            if self.deadline is not None:
                self.deadline += time.monotonic() - asked
        channel.send_stdin(rank, line)

    def tick(self, now):
        """The checks between messages; whether to give up waiting for the ranks left."""
        settings, result = self.settings, self.result
        if self.panel is not None:
            self.panel.tick(now)
            if self.panel.paused and self.deadline is not None and self.ticked is not None:
                self.deadline += now - self.ticked  # a rank stopped in the debugger: the user's time
        self.ticked = now
        if settings.metrics is not None:
            settings.metrics.tick(now, finished=list(self.replies))
        if settings.status is not None:
            settings.status.tick(time.perf_counter() - self.started, self.ranks, self.replies)
        if result.trouble is None and self.pending:
            self.check_trouble(now)
        if result.trouble is not None and self.recovery is not None and self.pending and result.first_death is None:
            self.recover(now)
        if now < self.check_liveness_at:
            return False
        self.check_liveness_at = now + settings.liveness_every
        self.check_liveness(now)
        return self.give_up_at is not None and now > self.give_up_at

    def check_trouble(self, now):
        """Stop the cell for mismatched collectives, its timeout, or a failed rank the others did not follow."""
        verdict = self.watch.tick(self.replies, now) if self.watch is not None else None
        if verdict is not None:
            self.result.mismatch = verdict
            self.stop("mismatch", self.watch.stacks(self.pending))
        elif self.deadline is not None and now >= self.deadline:
            self.stop("timeout")
        elif self.first_failure and self.settings.abort_grace is not None and \
                now >= self.first_failure[1] + self.settings.abort_grace:
            self.stop("failure")
        elif self.look_at is not None and now >= self.look_at:
            self.look_early()

    def recover(self, now):
        """Advance the letting out of ranks stuck in MPI, and the line saying how it goes."""
        more = self.recovery.tick(self.replies, now)
        if more is not None:
            self.give_up_at = now + more
        elif self.recovery.reason is not None:
            self.give_up_at = min(self.give_up_at, now)  # nothing will let them out: restart at once
        if self.settings.progress is not None:
            self.line = self.line or self.settings.progress()
            self.line.update(self.recovery.stage(self.replies))

    def check_liveness(self, now):
        """Ranks that died: reported; once one did, the others cannot finish and are given up on."""
        result = self.result
        warning = self.world.launcher.time_warning()
        if warning:
            self.printer.finish()
            print(f"[mpinb] {warning}", file=sys.stderr, flush=True)
        check_deaths(self.world, self.ranks, self.replies, result, self.code)
        if result.first_death is not None and result.mismatch is None and self.watch is not None:
            result.mismatch = at_death(self.world, self.ranks)
        if result.first_death is not None and self.pending:
            # a world with a dead rank cannot finish a collective; mpiexec normally ends the rest at once
            self.death_seen = self.death_seen or now
            if now - self.death_seen > 2 * self.settings.liveness_every:
                for rank in self.ranks:
                    self.replies.setdefault(rank, CellReply(error=lost(
                        f"still running when rank {result.first_death} died; the world cannot be used any more")))

    def stop(self, reason, stacks=None):
        """Say at once who failed and where every running rank is, then interrupt those ranks. Ranks waiting in
        communication do not answer an interrupt: when all of them do, they are given up on at once."""
        result, settings, pending = self.result, self.settings, self.pending
        result.trouble = reason
        self.world.lifecycle.move(State.RECOVERING)
        stacks = dict(stacks or {})
        missing = [rank for rank in pending if rank not in stacks]
        result.stacks = {**capture_stacks(self.world, missing), **stacks} if missing else stacks
        announce(result, pending, self.code, settings.timeout, self.first_failure, self.replies, self.printer)
        self.world.launcher.interrupt(self.world, list(pending))
        waiting = all(result.stacks[rank].in_communication(self.code) for rank in pending if rank in result.stacks)
        result.grace = min(COMMUNICATION_GRACE, settings.interrupt_grace) if waiting else settings.interrupt_grace
        self.give_up_at = time.monotonic() + result.grace
        if self.recovery is not None:  # time to find what the stuck ranks wait in, and to let them out
            self.give_up_at = max(self.give_up_at, time.monotonic() + self.recovery.settle_within + 0.5)

    def finish(self):
        """The result: every rank's value or error, the verdicts, how stuck ranks were let out."""
        result = self.result
        self.printer.finish()
        if self.line is not None:
            self.line.close()
        if self.settings.metrics is not None:
            self.settings.metrics.finish()
        result.seconds = time.perf_counter() - self.started
        result.first_failure = self.first_failure[0] if self.first_failure else None
        self._errors_and_values()
        self._mismatch_verdicts()
        result.warnings = differences(self.replies, self.world.warned)
        if self.recovery is not None and result.trouble is not None:
            if self.recovery.plan is not None and not result.stuck:
                result.recovered = self.recovery.note
            elif result.stuck:
                result.unrecoverable = self.recovery.reason or why_stuck(self.recovery)
        if (result.trouble is not None or result.errors) and self.watch is not None and not (
                result.stuck or result.first_death is not None or result.ended or result.inconsistent):
            # every rank answered or finished; a root that ran ahead of a rank that failed or was stopped left
            # what it sent in flight, for that rank's next collective to receive
            apart = left_apart(self.channel, self.ranks, LEFT_APART + (self.cell_id or 0))
            if apart is not None:
                result.inconsistent, result.recovered = apart, None
        result.finished = [rank for rank in self.ranks if rank not in result.errors]
        for name, values in result.gathered.items():  # rank order, whatever order the replies came in
            result.gathered[name] = PerRank(sorted(values.items()))
        if result.first_death is not None:
            self.world.lifecycle.dead(cell=self.settings.number)
        elif not (result.stuck or result.ended or result.inconsistent):
            self.world.lifecycle.move(State.IDLE)  # else the caller ends or restarts the world
        if self.interrupted is not None:
            self.interrupted.mpinb_result = result  # where each rank was, for whoever handles the interrupt
            raise self.interrupted
        return result

    def _errors_and_values(self):
        result, timeout = self.result, self.settings.timeout
        # where in C the ranks that did not answer are, read while they still are (py-spy, when it can be run)
        result.native = native.for_unanswered(self.world, [rank for rank in self.ranks if rank not in self.replies
                                                           and rank in result.stacks], result.stacks)
        for rank in self.ranks:
            reply = self.replies.get(rank)
            if reply is None:
                result.stuck.append(rank)
                result.errors[rank] = stopped(result, rank, self.code, timeout, result.grace, answered=False)
            elif reply.error is not None:
                error = reply.error
                if rank in result.stacks and error["ename"] == "KeyboardInterrupt":
                    error = stopped(result, rank, self.code, timeout, result.grace, answered=True)
                result.errors[rank] = error
            elif reply.value is not None:
                result.values[rank] = reply.value

    def _mismatch_verdicts(self):
        result = self.result
        if result.mismatch is not None and result.first_death is not None:  # MPI ended the job over it
            ended = ("torch.distributed's backend aborted a rank over it, which ended the job"
                     if " on torch:" in result.mismatch else "MPI ended the job over it")
            for rank, error in result.errors.items():
                if error["ename"] == RankLost.__name__:  # one message for every rank, since it names each rank's part
                    result.errors[rank] = lost(f"ranks were in different collectives, and {ended}: {result.mismatch}")
                    result.errors[rank]["ename"] = "CollectiveMismatch"
        if not result.errors and result.trouble is None and self.watch is not None:
            result.mismatch = after_cell(self.replies, self.ranks)
            if result.mismatch is not None:
                result.trouble = "mismatch"
                result.inconsistent = result.mismatch  # what MPI moved is still in flight: the world must restart
                for rank in self.ranks:
                    result.errors[rank] = {"ename": "CollectiveMismatch", "evalue": result.mismatch, "traceback": []}


def _unpack_gathered(world, result, rank, reply):
    gathered, buffers = reply.gathered, reply.buffers
    reply.gathered, reply.buffers = None, []  # the values are the result's now: the reply holds no second copy
    if getattr(gathered, "note", None):
        result.gather_notes.append(f"rank {rank}: {gathered.note}")
    for owner, values in gather.unpack(world.channel.segments, rank, gathered, buffers).items():
        for name, (kind, value, stats) in values.items():
            if kind == "error":
                result.gather_errors.setdefault(name, {})[owner] = value
            else:
                result.gathered.setdefault(name, PerRank())[owner] = value
                result.gather_stats.setdefault(name, {})[owner] = stats
