"""The error each rank gets when it did not finish a cell on its own: stopped by mpinb (timeout, another rank's
failure, an interrupt, mismatched collectives) or lost (its process died), and the diagnosis printed the moment a
cell is stopped."""

import signal
import sys

from ...errors import RankLost
from ...wire.debug_pause import paused_in
from ...wire.kinds import CellReply
from ...wire.ranks import label_ranks
from ..diagnosis import death_report, fatal_stack, last_stderr
from ..diagnosis.native import in_error


RESTART = ("%mpi restart starts a fresh world of the same size, with every rank's variables as of the last cell "
           "every rank finished (--fresh: without them)")  # what to do once a rank died


ENDED_WITH = 5.0  # s after a rank's death that the others may still be ending with it (3 s TERM_GRACE, launch.py)
WALL_CLOCK = 1e9  # a Death.when above this is a time.time() (ranks on other hosts have an order instead)


def _first(deaths):
    """The death that came first: the earliest recorded, then the lowest rank."""
    return min(deaths.values(), key=lambda death: (death.when is None, death.when or 0.0, death.rank))


def died_earlier(world, dead):
    """Why a world whose ranks *dead* died cannot run a cell: which rank died first, during which cell (or while
    no cell ran), how (its exit code or signal, as its launcher recorded it), and which ended with it; for a death
    no cell showed, where it was (a fatal signal) and the last lines it wrote to stderr."""
    deaths = death_report(world, dead, wait=0.5)
    first = _first(deaths)
    if (first.when or 0.0) > WALL_CLOCK and len(dead) < len(world.ranks):  # a death this host recorded, and when
        # the next cell can come before mpiexec has ended the others: they are said to have ended with it
        more = world.liveness.ended_with(dead, until=first.when + ENDED_WITH)
        if more != dead:
            dead, deaths = more, death_report(world, more, wait=0.5)
            first = _first(deaths)
    when = f"during In[{world.died_in}]" if world.died_in is not None else "while no cell ran"
    if first.job_ended:
        return f"{first.job_ended} {when}, and every rank with it, so the world cannot run cells: {RESTART}"
    if len(dead) > 1 and not first.abort and all(d.returncode is None and d.unrecorded for d in deaths.values()):
        # none left a record, so none can be said to have died first (mpiexec ends the rest of a job at once)
        text = f"{label_ranks(dead)} of this world died {when} (exit status unknown{first.unknown_why(many=True)})"
    else:
        text = f"rank {first.rank} of this world died {when} ({first.describe()})"
        others = [rank for rank in dead if rank != first.rank]
        if others:
            text += f"; {label_ranks(others)} ended with it"
    text += f", so the world cannot run cells: {RESTART}"
    if world.died_in is not None:  # that cell's error said where it was and what it last wrote
        return text
    if first.returncode is not None and first.returncode < 0:
        crash = fatal_stack(world, first.rank)
        if crash is not None and crash.frames:
            text += f"\nWhere rank {first.rank} was when it died (most recent call last):\n{crash.text()}"
    tail = "\n".join(last_stderr(world, first.rank).splitlines()[-5:])
    return text + (f"\nIts last stderr lines:\n{tail}" if tail.strip() else "")


def announce(result, pending, code, timeout, first_failure, replies, printer):
    """The diagnosis, printed the moment the cell is stopped: why, then where each running rank is."""
    printer.finish()
    if result.trouble == "failure" and first_failure is not None:
        error = replies[first_failure[0]].error
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
        where = _paused(stack, code) or (stack.where(code) if stack is not None else "position unknown")
        places.setdefault(where, []).append(rank)
    lines = [f"[mpinb] {why}; stopping {label_ranks(pending)}:"]
    lines += [f"[mpinb]   {label_ranks(members)}: {where}" for where, members in places.items()]
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


def stopped(result, rank, code, timeout, grace, *, answered):
    """The error of a rank mpinb stopped: why, where it was, and whether it answered the interrupt; where it was
    in native code too when it did not (``result.native``, read by py-spy)."""
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
    paused = _paused(stack, code) if result.trouble == "interrupt" else None
    if paused is not None:  # waiting for the visual debugger's panel, not for the cell's code
        why, where = f"interrupted while {paused}", ""
    tail = "" if answered else f"; {result.ended}, before it answered the interrupt" if result.ended else \
        f"; did not answer the interrupt within {grace:g} s (stuck in C or MPI)"
    frames = ["Where it was (most recent call last):\n" + stack.text() + "\n"] if stack is not None and stack.frames \
        else []
    natively, below = ("", []) if answered else in_error(result.native.get(rank), stack, code)
    return {"ename": ename, "evalue": f"{why}{', ' if where else ''}{where}{tail}{natively}",
            "traceback": frames + below}


def _paused(stack, code):
    """``paused in the debugger at cell line 5`` for a rank that waited in the visual debugger's panel (its
    frames below the cell's are the debugger's, never shown), else ``None``."""
    if stack is None or not paused_in(stack.frames):
        return None
    place, _ = stack.line(code)
    return f"paused in the debugger at {place or 'a frame of no cell'}"


def check_deaths(world, ranks, replies, result, code):
    dead = world.dead_ranks([rank for rank in ranks if rank not in replies])
    if not dead:
        return
    # no exit record comes from another host: once the first death is known, ranks there that end after it
    # ended with the job, and waiting for mpiexec's word on them only delays the cell
    later = result.first_death is not None and all(world.is_remote(rank) for rank in dead)
    deaths = death_report(world, dead, wait=0.0 if later else 2.0)
    ended = next((death.job_ended for death in deaths.values() if death.job_ended), "")
    if ended:  # the batch system ended the job: one cause, said once for every rank
        result.first_death = min(dead) if result.first_death is None else result.first_death
        for rank in dead:
            replies[rank] = CellReply(error=lost(f"{ended}, and every rank with it; {RESTART}"))
        return
    if result.first_death is None and all(d.returncode is None and not d.abort and d.host is None
                                          for d in deaths.values()):
        caller = next((d.aborted_by for d in deaths.values() if d.aborted_by), None)
        for rank in dead:  # nobody could record anything: the job was ended as a whole
            why = (f"rank {rank} was ended by mpiexec after rank {caller[0]} {caller[1]}" if caller else
                   f"rank {rank} died with the whole job at once, leaving no exit status (MPI_Abort on some rank, "
                   "or mpiexec was killed)")
            replies[rank] = CellReply(error=lost(why))
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
        elif _same_lost_host(death, deaths.get(result.first_death)):
            message = (f"rank {rank} died: its node {death.host} was lost too, as rank {result.first_death}'s" if
                       death.node_lost else
                       f"rank {rank} died: its engine on {death.host} stopped answering ipyparallel's heartbeats "
                       f"too, as rank {result.first_death}'s there did (the host cannot be reached, or its "
                       "processes ended)")
        elif death.returncode in (-signal.SIGKILL, None):
            cause = "called MPI_Abort" if deaths.get(result.first_death, death).abort else "died"
            message = f"rank {rank} was ended by mpiexec after rank {result.first_death} {cause}"
        else:
            message = f"rank {rank} died: {death.describe()} (after rank {result.first_death})"
        replies[rank] = CellReply(error=lost(message, frames))


def _same_lost_host(death, first):
    """Whether *death* is of a rank whose host went silent as the first dead rank's did (a node cut off, or
    down): both known only from missed heartbeats, on the same host."""
    return (first is not None and death.host is not None and death.host == first.host and
            death.returncode is None and death.reported is None and first.returncode is None and
            first.reported is None and not death.abort)


def why_stuck(recovery):
    failed = recovery.failed_steps()
    if failed:
        return "letting them out failed: " + "; ".join(f"rank {rank}: {', '.join(problems)}"
                                                       for rank, problems in sorted(failed.items()))
    if recovery.plan:
        return "they stayed in MPI after the other ranks completed what they waited for"
    if recovery.plan is not None:
        return "they stayed in MPI, in a collective every rank of it was in"
    return None


def lost(message, frames=()):
    return {"ename": RankLost.__name__, "evalue": message, "traceback": list(frames)}
