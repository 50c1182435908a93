"""How a rank died: its exit code or signal and when, who called ``MPI_Abort``, and what it last wrote to stderr.

Deaths are read from the record each rank's launcher writes on this host (``rank/launch.py``) and from mpiexec's
own report (Hydra prints the pid, exit code or signal of the first process that failed, and ``MPI_Abort`` calls),
which ipyparallel keeps in the launcher's output file.
"""

import math
import os
import re
import signal
import time
from dataclasses import dataclass

from ...wire.abort_notices import aborts
from ...wire.rank_files import native_stderr_path, stderr_path
from ..world import ipp
from ..world.leftovers import oom_kills
from ..world.reaper import alive

RECORD_WAIT = 5.0  # s more that a death's record is waited for while the launcher that writes it runs


@dataclass
class Death:
    """How one rank's process ended, as its launcher recorded it (``rank/launch.py``)."""

    rank: int
    returncode: int = None  # negative: killed by that signal
    when: float = None
    abort: str = ""  # "called MPI_Abort(MPI_COMM_WORLD, 3)"
    abort_code: int = None
    aborted_by: tuple = None  # (rank, "called MPI_Abort(...)") of the rank whose MPI_Abort ended the job
    host: str = None  # the other host it ran on, when it did: its end is known from ipyparallel's heartbeats
    reported: int = None  # how mpiexec reported its end, when it ran on another host (negative: that signal)
    node_lost: str = ""  # what the batch system says of its node, when it says the node is lost
    job_ended: str = ""  # what ended the batch job, when the batch system did (its time limit...)
    unrecorded: bool = False  # on this host, its launcher ended too without recording how the engine ended
    oom_kills: int = 0  # processes the out-of-memory killer ended on this host since the world's ranks started

    def describe(self):
        if self.job_ended:
            return self.job_ended
        if self.abort:
            return self.abort
        if self.reported is not None and self.reported < 0:
            return f"its process on {self.host} was ended by {_signal_text(-self.reported)} (mpiexec reported it)"
        if self.reported is not None:
            return f"its process on {self.host} ended (mpiexec reported exit code {self.reported} on that host)"
        if self.node_lost:
            return f"its node {self.host} was lost: {self.node_lost}"
        if self.host is not None and self.returncode is None:
            return (f"its engine on {self.host} stopped answering ipyparallel's heartbeats (the process ended, or "
                    "the host cannot be reached)")
        if self.returncode is None:
            return "exit status unknown" + self.unknown_why()
        if self.returncode < 0:
            return _signal_text(-self.returncode)
        return f"exit code {self.returncode}"

    def unknown_why(self, *, many=False):
        """Why no exit status was recorded, as far as this host tells (``""``: nothing known); *many*: of
        several ranks that all died so."""
        if self.oom_kills:
            return (f": the kernel's out-of-memory killer ended {self.oom_kills} process"
                    f"{'es' if self.oom_kills > 1 else ''} on this host since the world started")
        if self.unrecorded:
            return (": the launchers that record it ended with them, so all were killed at once" if many else
                    ": the launcher that records it ended with it, so both were killed at once") + \
                " (mpiexec's end, the out-of-memory killer, or a signal from outside the world)"
        return ""


def _signal_text(number):
    name = signal.Signals(number).name if number in set(signal.Signals) else "?"
    return f"signal {number} ({name})"


def death_report(world, dead, *, wait=1.0):
    """``{rank: Death}`` for *dead* ranks: exit code or signal and when, waiting up to *wait* s for the records;
    ``MPI_Abort`` calls as mpiexec printed them."""
    deadline = time.monotonic() + wait
    while True:
        output = ipp.engines_output(world.cluster) + "\n" + _native_stderr(world, world.ranks)
        deaths = {rank: _death(world, rank, output) for rank in dead}
        # a rank that ended first, of its own cause: on another host, once mpiexec said how (its report comes
        # after the engine's nanny noticed the end)
        culprit = any(d.returncode not in (None, -signal.SIGKILL) or d.reported is not None or
                      (d.when == 0.0 and d.host is None) for d in deaths.values())
        if culprit or all(d.returncode is not None for d in deaths.values()) or aborts(output):
            break
        # past *wait*, a record still comes from a launcher that runs (on a busy machine it may not yet have
        # been scheduled to reap its engine): "exit status unknown" would hide how the rank died
        now = time.monotonic()
        if now > deadline and (now > deadline + RECORD_WAIT or not _records_coming(world, deaths)):
            break
        time.sleep(0.05)
    ended = world.launcher.ended()  # the batch system ended the job (its time limit...): every rank died of that
    since = world.footprint.oom_kills
    killed = (oom_kills() or 0) - since if since is not None else 0
    for death in deaths.values():
        death.job_ended = ended
        if death.returncode is None and not world.is_remote(death.rank):
            parent = world.identities.get(death.rank, {}).get("parent")
            death.unrecorded, death.oom_kills = bool(parent) and not alive(parent), max(killed, 0)
    for rank, comm, code in aborts(output):
        call = f"called MPI_Abort({comm}, {code})"
        for death in deaths.values():  # who ended the job, even when MPI_Abort let its caller go on (it can)
            death.aborted_by = death.aborted_by or (rank, call)
        if rank in deaths:
            deaths[rank].abort, deaths[rank].abort_code = call, code
            deaths[rank].when = min(deaths[rank].when or math.inf, 0.0)  # it started the end
    return deaths


def _records_coming(world, deaths):
    """Whether the launcher of a rank here that died with no record yet still runs: it writes one once it has
    reaped its engine (``rank/launch.py``)."""
    for death in deaths.values():
        parent = world.identities.get(death.rank, {}).get("parent")
        if death.returncode is None and parent and not world.is_remote(death.rank) and alive(parent):
            return True
    return False


def _native_stderr(world, ranks):
    """What C code on *ranks* wrote to standard error (MPI's own notices), from the ranks' files."""
    texts = []
    for rank in ranks:
        path = world.stack_files.get(rank)
        try:
            with open(native_stderr_path(path), errors="replace") as file:
                texts.append(file.read()[-(64 << 10):])
        except (OSError, TypeError):
            pass
    return "\n".join(texts)


# Hydra (MPICH's mpiexec) on a process of the job that ended badly: its host is right, its pid not always the one
_BAD_TERMINATION = re.compile(r"RUNNING AT (\S+)\s*\n=\s*EXIT CODE: (\d+)")
# Open MPI's launcher (mpirun 4, prterun 5) on the first process of the job that ended badly, by its MPI rank
_OMPI_SIGNAL = re.compile(r"noticed that process rank (\d+) with PID \d+ on node (\S+) exited on\s+signal (\d+)")
_OMPI_EXIT = re.compile(r"The first process to do so was:\s+Process name: \[(?:\[\d+,\d+\]|[^,\]]+),(\d+)\]\s+"
                        r"Exit code:\s+(\d+)")
# ipyparallel's nanny of an engine whose process ended, in the engines' log that mpiexec forwards, in order
_NANNY = re.compile(r"\[KernelNanny\.\d+\] (?:Parent|Pipe closed, parent) (\d+)")


def _reported(rank, host, output):
    """How mpiexec reported the end of *rank* on *host* (an exit code, or minus the signal), or ``None``: Open
    MPI names the rank; Hydra names only the host, which is *rank*'s if it was the first to end."""
    for number, node, signal_number in _OMPI_SIGNAL.findall(output):
        if int(number) == rank and node.split(".")[0] == host.split(".")[0]:
            return -int(signal_number)
    for number, code in _OMPI_EXIT.findall(output):
        if int(number) == rank:
            return int(code)
    return None


def _death(world, rank, output=""):
    if world.is_remote(rank):  # no exit record reaches this host: what mpiexec and the engines' nannies said
        who = world.identities.get(rank, {})
        noticed = [int(pid) for pid in _NANNY.findall(output)]
        when = float(noticed.index(who.get("pid"))) if who.get("pid") in noticed else None
        host = who.get("host") or ""
        reported = _reported(rank, host, output)
        if reported is not None:
            return Death(rank, host=who.get("host"), reported=reported, when=0.0 if when is None else when)
        lost = world.launcher.lost_hosts([host]).get(host, "") if host else ""
        if lost:
            return Death(rank, host=host, node_lost=lost, when=when)
        codes = [int(code) for named, code in _BAD_TERMINATION.findall(output) if named == host]
        return Death(rank, host=who.get("host"), reported=codes[0] if codes and when == 0.0 else None, when=when)
    pid = world.identities.get(rank, {}).get("pid")
    path = os.path.join(world.status_dir or "", f"exit-{pid}")
    try:
        with open(path) as status:
            _, code, when = status.read().split()
        return Death(rank, int(code), float(when))
    except (OSError, ValueError):
        return Death(rank)


def last_stderr(world, rank, received=""):
    """What *rank* last wrote to stderr: its on-disk copy when readable (complete even if the rank died right
    after writing), else what reached the notebook; then the last lines its C code wrote to descriptor 2 that
    did not reach the notebook (a library's message just before it aborted, written too late to be forwarded)."""
    path, text = world.stack_files.get(rank), received
    if path:
        try:
            with open(stderr_path(path), errors="replace") as kept:
                text = kept.read()
        except OSError:
            pass
        try:
            with open(native_stderr_path(path), "rb") as native:
                native.seek(max(0, os.fstat(native.fileno()).st_size - 4096))
                tail = native.read().decode(errors="replace").splitlines()[-5:]
        except OSError:
            tail = []
        unseen = [line for line in tail if line.strip() and line not in received]
        if unseen:
            text = text + ("" if not text or text.endswith("\n") else "\n") + "\n".join(unseen) + "\n"
    return text
