"""What went wrong on a rank: where it is stuck (its main thread's stack, the line of the cell it is at, the call
it waits in); how it died is in deaths.py.

Stacks come from the ranks' faulthandler dumps (``rank/stacks.py``): the notebook signals a rank on its host and
reads the file; a rank on another host is asked through the cell channel. A rank a fatal signal ended left its
last one in the same file.
"""

import os
import re
import time
from dataclasses import dataclass, field

from ...wire.rank_files import STACK_SIGNAL, WRAPPERS
from ...wire.script_cells import script_in

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
