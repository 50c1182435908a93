"""What went wrong on a rank: where it is stuck (its stack, the cell line, the call) and how it died.

Stacks come from the ranks' faulthandler dumps (``rank/stacks.py``): the notebook signals a rank on its host and
reads the file. Deaths are read from mpiexec's own report (Hydra prints the pid, exit code or signal of the
first process that failed, and ``MPI_Abort`` calls), which ipyparallel keeps in the launcher's output file.
"""

import math
import os
import re
import signal
import time
from dataclasses import dataclass, field

from ...wire.abort_notices import aborts
from ...wire.rank_files import STACK_SIGNAL, WRAPPERS, native_stderr_path, stderr_path
from ...wire.script_cells import script_in
from ..world import ipp
from ..world.leftovers import oom_kills
from ..world.reaper import alive

RECORD_WAIT = 5.0  # s more that a death's record is waited for while the launcher that writes it runs

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')


@dataclass
class RankStack:
    """One rank's main-thread stack, most recent call first, and where in the cell it is."""

    rank: int
    frames: list = field(default_factory=list)  # (file, line, function), most recent first
    cell_file: str = ""
    note: str = ""
    cells: dict = field(default_factory=dict)  # file a cell was compiled as -> its number N in the notebook's In[N]

    def __post_init__(self):  # mpinb's wrappers of MPI calls are not where the user's code is
        self.frames = [frame for frame in self.frames if not frame[0].endswith(WRAPPERS)]

    @property
    def cell_line(self):
        return next((line for file, line, _ in self.frames if file == self.cell_file), None)

    def line(self, cell_source=""):
        """``("cell line 3", "comm.recv(source=1)")``: where in the user's code the rank is, and that line's text;
        in a script ``%mpi run`` runs, ``("train.py line 40", ...)``. ``(None, "")`` outside of them."""
        line = self.cell_line
        if not line:
            return None, ""
        script = script_in(cell_source)
        if script is not None and self.cell_file == script:
            return f"{os.path.basename(script)} line {line}", _source_line(script, line).strip()
        lines = cell_source.splitlines()
        return f"cell line {line}", lines[line - 1].strip() if line <= len(lines) else ""

    def where(self, cell_source="", *, verb="blocked in"):
        """``blocked in comm.recv(source=1) at cell line 3`` (or what can be said)."""
        if not self.frames:
            return self.note or "stack not available"
        place, text = self.line(cell_source)
        # inside mpinb's own code (mpinb.report, its gather), the call the cell made is where the rank is
        own = [frame for frame in self.frames if not _MPINB_FILE.search(frame[0])] or self.frames
        innermost_file, innermost_line, function = own[0]
        if innermost_file == self.cell_file:
            return f"{verb} {text} at {place}" if text else f"at {place}"
        inside = f"{function} ({self._place(innermost_file, innermost_line)})"
        if place:
            return f"{verb} {inside}, called at {place}: {text}"
        return f"{verb} {inside}"

    def in_communication(self, cell_source=""):
        """Whether the rank waits inside a communication call (MPI, torch.distributed, mpinb's own), where an
        interrupt does not reach it: its innermost Python frame is in one of those libraries, or is a line of
        the cell that calls one."""
        if not self.frames:
            return False
        file, line, _ = self.frames[0]
        if any(part in file for part in _COMMUNICATION_FILES):
            return True
        lines = cell_source.splitlines()
        in_cell = file == self.cell_file and script_in(cell_source) is None
        text = lines[line - 1] if in_cell and 0 < line <= len(lines) else _source_line(file, line)
        return bool(_COMMUNICATION_CALL.search(text))

    def text(self):
        """The stack from the cell inwards as ``File ..., line N in f`` lines, outermost first like a traceback
        (the engine's own frames above the cell say nothing about the cell)."""
        frames = list(reversed(self.frames))
        cell = next((i for i, (file, _, _) in enumerate(frames) if file == self.cell_file), 0)
        # mpinb's own frames (mpinb.report's outbox, say) are not the user's: the cell line that called it is
        return "\n".join(self._frame(*frame) for frame in frames[cell:] if not _MPINB_FILE.search(frame[0]))

    def _place(self, file, line):
        """``Cell In[3], line 2`` for a cell (as IPython names it), else ``file.py:2``."""
        if file in self.cells:
            return f"Cell In[{self.cells[file]}], line {line}"
        return f"{os.path.basename(file)}:{line}"

    def _frame(self, file, line, function):
        if file in self.cells:  # IPython's traceback line for a cell: the function only when there is one
            return f"  {self._place(file, line)}" + ("" if function == "<module>" else f", in {function}")
        return f'  File "{file}", line {line}, in {function}'


_MPINB_FILE = re.compile(r"/mpinb/(rank|wire|notebook|widgets)/(\w+/)?\w+\.py$|/mpinb/\w+\.py$")
_COMMUNICATION_FILES = ("/mpi4py/", "/torch/distributed/", "/mpinb/rank/data_parallel/collectives.py",
                        "/mpinb/rank/gather.py")
_COMMUNICATION_CALL = re.compile(
    r"\b(comm|MPI|dist|world|COMM_WORLD)\b[\w.]*\.\w+\(|\.(Barrier|barrier|I?[Aa]ll[Rr]educe|[Aa]llgather|"
    r"[Bb]cast|[Ss]catter|[Gg]ather|[Rr]educe|[Ss]end|[Rr]ecv|Sendrecv|sendrecv|[Ww]ait|[Ww]aitall|"
    r"all_reduce|all_gather|broadcast|synchronize)\(|\b(allreduce_gradients|broadcast_parameters)\(")


def _source_line(file, line):
    import linecache

    return linecache.getline(file, line)


def capture_stacks(world, ranks, *, wait=1.5):
    """``{rank: RankStack}`` for *ranks*: read from faulthandler dumps the ranks on this host write when
    signalled, and asked of the roll-call threads of those on other hosts."""
    starts, stacks, remote = {}, {}, []
    for rank in ranks:
        who, path = world.identities.get(rank, {}), world.stack_files.get(rank)
        if path is None or world.is_remote(rank) or not os.path.exists(path) or \
                not _catches(who.get("pid"), STACK_SIGNAL):
            remote.append(rank)  # the signal would end a rank whose code took mpinb's handler away: asked instead
            continue
        starts[rank] = os.path.getsize(path)
        try:
            os.kill(who["pid"], STACK_SIGNAL)
        except ProcessLookupError:
            stacks[rank] = RankStack(rank, note="process gone")
            starts.pop(rank)
    deadline, sizes = time.monotonic() + wait, {}
    stacks.update(_remote_stacks(world, remote, wait) if remote else {})
    while starts and time.monotonic() < deadline:
        time.sleep(0.03)
        for rank in list(starts):
            size = os.path.getsize(world.stack_files[rank])
            if size > starts[rank] and sizes.get(rank) == size:  # written, and no longer growing
                stacks[rank] = parse(_read(world.stack_files[rank]), starts[rank], rank)
                starts.pop(rank)
            sizes[rank] = size
    for rank in starts:
        stacks[rank] = RankStack(rank, note="did not answer the stack request")
    return stacks


def _catches(pid, signum):
    """Whether process *pid* has a handler for *signum* (``SigCgt`` in ``/proc/PID/status``); true where that
    cannot be read (not Linux: the signal is sent, as before)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, TypeError):
        pass
    return True


def _remote_stacks(world, ranks, wait):
    """Stacks of *ranks* (on other hosts) through the cell channel; a rank whose roll-call thread cannot answer
    (a C call that holds the GIL) is said to be silent, with its host."""
    global _asked
    _asked += 1
    answers = world.channel.stacks(ranks, ("stack", _asked), wait) if world.channel is not None else {}
    stacks = {}
    for rank in ranks:
        host = world.identities.get(rank, {}).get("host", "another host")
        if rank in answers:
            stacks[rank] = RankStack(rank, **answers[rank])
        else:
            stacks[rank] = RankStack(rank, note=f"on {host}: did not answer the stack request")
    return stacks


_asked = 0


def fatal_stack(world, rank):
    """Where *rank* was when a fatal signal ended it (faulthandler's dump before dying), or ``None``."""
    path = world.stack_files.get(rank)
    try:
        text = _read(path) if path else ""
    except OSError:
        return None
    start = text.rfind("Fatal Python error")
    return parse(text, start, rank) if start >= 0 else None


def _read(path):
    with open(path, errors="replace") as file:
        return file.read()


def parse(text, start, rank):
    """The main thread's frames from the dump that begins at *start* in a stack file's *text*."""
    head = text[:start].splitlines()
    main = next((int(line.split()[1], 16) for line in reversed(head) if line.startswith("main ")), None)
    cell = next((line[5:] for line in reversed(head) if line.startswith("cell ")), "")
    cells = {}
    for line in head:
        if line.startswith("named "):
            _, number, file = line.split(" ", 2)
            cells[file] = number
    blocks, current = {}, None
    for line in text[start:].splitlines():
        thread = _THREAD.match(line)
        if thread:
            current = blocks.setdefault(int(thread.group(1), 16), [])
            continue
        frame = _FRAME.match(line)
        if frame and current is not None:
            current.append((frame.group(1), int(frame.group(2)), frame.group(3)))
    frames = blocks.get(main) or next(iter(blocks.values()), [])
    return RankStack(rank, frames=frames, cell_file=cell, cells=cells)




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
