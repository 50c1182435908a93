"""A rank's native stack said in one line (``rank 1 is in MPI_Barrier (libmpi.so.12), called at cell line 3:
comm.Barrier()``), and its frames as text: names read from the tables below, first row that matches wins.

Only the native frames above the innermost Python frame say where the rank is (below it is the interpreter);
among them the call the Python code made (``PMPI_Barrier``, ``gloo::allreduce``) is the outermost one a row of
:data:`CALLS` names, a wait (a lock, poll) the innermost one a row of :data:`WAITS` names, and a library
(:data:`LIBRARIES`) is named when no function is.
"""

import os
import re

from ..diagnose import RankStack

# (pattern on a native function's name, what to call the place): the calls a rank waits in, the first row that
# matches any frame naming it (its outermost match)
CALLS = (
    (re.compile(r"^P?(MPIX?_[A-Z][a-z]\w*)"), "{0}"),  # PMPI_Barrier is MPI_Barrier, by its profiling name
    (re.compile(r"\bgloo::(?:\w+::)*?(allreduce|allgatherv?|alltoallv?|broadcast|barrier|reduce_scatter|reduce|"
                r"gather|scatter)\b"), "gloo's {0}"),
    (re.compile(r"\bc10d::ProcessGroupGloo\b"), "gloo"),
    (re.compile(r"\b(nccl[A-Z]\w*)"), "NCCL's {0}"),
    (re.compile(r"\bc10d::ProcessGroupNCCL\b"), "NCCL"),
)
# (pattern on a native function's name, what the rank is doing there): waits, innermost first
WAITS = (
    (re.compile(r"futex|__lll_lock_wait|pthread_mutex_(timed|clock)?lock|pthread_cond_\w*wait|sem_\w*wait|"
                r"pthread_join|pthread_rwlock_\w*lock"), "waiting on a lock in {function} ({library})"),
    (re.compile(r"^(poll|ppoll|epoll_p?wait2?|select|pselect6?)$"), "waiting in {function} ({library})"),
    (re.compile(r"nanosleep|^u?sleep$"), "sleeping in {function} ({library})"),
    (re.compile(r"^(read|recv|recvmsg|recvfrom)$"), "waiting to read in {function} ({library})"),
)
# (pattern on a library's file name, what it is): a place no function names, outermost first
LIBRARIES = (
    (re.compile(r"^lib(p?mpi|mpich|mpifort)\b"), "MPI"),
    (re.compile(r"gloo"), "gloo"),
    (re.compile(r"nccl"), "NCCL"),
    (re.compile(r"^lib(torch|c10)"), "PyTorch"),
    (re.compile(r"^lib(fabric|ucp|ucs|uct|psm2?)\b"), "MPI's network layer"),  # what MPI waits in across hosts
    (re.compile(r"^lib(c|pthread)[.-]"), "libc"),  # its own functions unnamed (a lock's, stripped)
)
# (pattern on a native function's name or a Python file, what called the place): innermost first
CALLERS = (
    (re.compile(r"\bc10d::Reducer\b|/torch/nn/parallel/distributed\.py$"), "DDP's backward"),
    (re.compile(r"/torch/autograd/|\btorch::autograd::Engine\b"), "autograd's backward"),
    (re.compile(r"^(ffi_call|_ctypes_callproc)$"), "ctypes"),
)

# the innermost Python frame of a rank between cells: ipyparallel's event loop waiting for the next message
IDLE = re.compile(r"/selectors\.py$|/asyncio/base_events\.py$|/tornado/")

FOLD = 8  # native frames a report of a rank that did not answer shows, innermost
_ADDRESS = re.compile(r"^0x[0-9a-f]+$")
_MPINB = re.compile(r"/mpinb/(rank|wire|notebook|widgets)/")


def python_stack(native, python=None):
    """A :class:`~mpinb.notebook.diagnosis.diagnose.RankStack` of *native*'s Python frames, its cell known from *python*
    (the faulthandler stack of the same rank, which names the cell's file)."""
    return RankStack(native.rank, frames=native.python, cell_file=getattr(python, "cell_file", ""),
                     cells=getattr(python, "cells", {}))


def place(native):
    """``"in MPI_Barrier (libmpi.so.12)"``, ``"waiting on a lock in __lll_lock_wait (libc.so.6)"``: where the
    native frames above the innermost Python frame are; ``None`` when there are none (the rank runs Python)."""
    run = _innermost_native(native.frames)
    for pattern, name in CALLS:  # the rows in order (gloo's own function before its process group's)
        for function, _, _, library in reversed(run):
            match = pattern.search(function)
            if match:
                return f"in {name.format(*match.groups())} ({library})"
    for function, _, _, library in run:
        for pattern, doing in WAITS:
            if pattern.search(function):
                return doing.format(function=function, library=library)
    for _, _, _, library in reversed(run):
        for pattern, name in LIBRARIES:
            if pattern.search(library):
                return f"in {name} ({library})"
    named = next(((function, library) for function, _, _, library in run if not _ADDRESS.match(function)), None)
    if named:
        return f"in {named[0]} ({named[1]})"
    return f"in {run[0][3]}" if run else None


def caller(native):
    """``"DDP's backward"``: the framework whose code called the place, when a row of :data:`CALLERS` names it."""
    for function, file, _, library in native.frames:
        for pattern, name in CALLERS:
            if pattern.search(function if library else file):
                return name
    return None


def idle(native, python=None):
    """Whether the rank waits for the next cell: no frame of a cell, and ipyparallel's event loop innermost."""
    frames = native.python
    cells = {getattr(python, "cell_file", "") or None, *getattr(python, "cells", {})}
    return bool(frames) and not any(file in cells for file, _, _ in frames) and bool(IDLE.search(frames[0][0]))


def summary(native, python=None, code="", *, who=None):
    """``rank 0 is in gloo's allreduce (libtorch_cpu.so), called from DDP's backward at cell line 8`` (with *who*
    ``None``, without its first words: ``in gloo's allreduce ...``)."""
    if idle(native, python):
        sentence = "waiting for the next cell"
        return f"{who} is {sentence}" if who else sentence
    stack = python_stack(native, python)
    where, text = stack.line(code)
    spot = place(native)
    if spot is None:  # in Python: the line it runs
        sentence = stack.where(code, verb="in")
    else:
        sentence = spot
        by = caller(native)
        if by:
            sentence += f", called from {by}" + (f" at {where}" if where else "")
        elif where:
            sentence += f", called at {where}"
        if where and text:
            sentence += f": {text}"
    return f"{who} is {sentence}" if who else sentence


def folded(native, limit=FOLD):
    """The innermost *limit* native frames above the innermost Python frame, outermost first like a traceback."""
    lines = _lines(_innermost_native(native.frames))[:limit]
    return "\n".join(reversed(lines))


def merged(native, python=None):
    """The whole main-thread stack, Python and native frames in order, from the cell inwards (outermost first),
    mpinb's own Python frames left out and runs of unnamed native frames folded into one line; nothing for a rank
    that waits for the next cell."""
    if idle(native, python):
        return ""
    frames = [frame for frame in native.frames if frame[3] is not None or not _MPINB.search(frame[1])]
    cell = getattr(python, "cell_file", "") or None
    cells = getattr(python, "cells", {})
    outermost = max((i for i, frame in enumerate(frames) if frame[3] is None and frame[1] in (cell, *cells)),
                    default=None)
    frames = frames[:outermost + 1] if outermost is not None else frames[:FOLD * 2]
    return "\n".join(reversed(_lines(frames, cells)))


def _innermost_native(frames):
    """The native frames above the innermost Python frame, innermost first."""
    run = []
    for frame in frames:
        if frame[3] is None:
            break
        run.append(frame)
    return run


def _lines(frames, cells=None):
    """One line per frame, innermost first; consecutive unnamed frames of one library as one line."""
    lines, index = [], 0
    while index < len(frames):
        function, file, line, library = frames[index]
        if library is None:
            place_ = f"Cell In[{cells[file]}], line {line}" if cells and file in cells else \
                f'File "{file}", line {line}, in {function}'
            lines.append(f"  {place_}")
            index += 1
            continue
        end = index
        while end < len(frames) and frames[end][3] == library and _ADDRESS.match(frames[end][0]):
            end += 1
        if end > index:  # their addresses differ from process to process: ranks alike read the same
            lines.append(f"  ... {end - index} frame{'s' if end - index > 1 else ''} in {library}")
            index = end
            continue
        where = f" {os.path.basename(file)}:{line}" if line and file else ""
        lines.append(f"  {function} ({library}{',' + where if where else ''})")
        index += 1
    return lines
