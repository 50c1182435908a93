"""Where is this rank? Python stacks on demand, even while the main thread is blocked inside an MPI call in C.

``faulthandler`` dumps every thread's stack from a C signal handler when the rank gets :data:`SIGNAL`, so it
works whatever the main thread is doing: measured on this machine, a helper thread calling
``sys._current_frames()`` also runs while the rank waits in ``comm.recv`` (mpi4py releases the GIL), but not
while a C call holds the GIL (it ran 2 times in 1.5 s there, faulthandler answered at once). Dumps are appended
to one file per rank; the lines ``main 0x…`` and ``cell FILE`` say which thread runs cells and which file the
running cell was compiled as, so the notebook can name the cell line, and ``named N FILE`` that FILE is the cell
the notebook ran as ``In[N]``, so its frames read ``Cell In[N], line L`` as in IPython's tracebacks (not the
kernel's ``/tmp/ipykernel_PID/HASH.py``). A fatal signal (a segfault in C code, an
abort) dumps the stacks to the same file before the rank dies, so the notebook can say where it crashed.
"""

import atexit
import contextlib
import faulthandler
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

from ..wire import files
from ..wire.rank_files import STACK_SIGNAL, native_stderr_path, native_stdout_path, stack_path, stderr_path
from . import signal_actions

SIGNAL = STACK_SIGNAL
_file = None
_installed = {}  # signal -> the address of the handler faulthandler installed for it
_path = None  # the path of _file
_stderr = None
_native = None  # descriptor of the native_stderr_path file, once keep_native_output pointed descriptor 2 at it
current_cell_file = ""  # the file the running (or last) cell was compiled as
STDERR_LIMIT = 64 << 10  # bytes of a rank's recent stderr kept on disk for a post-mortem




def rank_directory():
    """Where this rank keeps its files: the world's private directory (``$MPINB_STATUS_DIR``, which the notebook
    removes with the world) where this host has it, else a private one of the rank's own, removed at its exit.
    Never a name in the shared temporary directory that another user could have taken first."""
    directory = os.environ.get("MPINB_STATUS_DIR")
    if files.private_directory(directory):
        return directory
    directory = tempfile.mkdtemp(prefix="mpinb-rank-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory








def keep_native_output():
    """Point file descriptors 1 and 2 at this rank's :func:`native_stdout_path` and :func:`native_stderr_path`
    files (appending); return ``{"stdout": path, "stderr": path}``, or ``None`` before :func:`install`.

    The engine's kernel had pointed both at pipes that a thread drains later into ipyparallel's output, which
    the notebook does not show, so what C code and subprocesses wrote never reached it, and what they wrote just
    before the process ended, MPI's own ``MPI_Abort`` notice among it, was lost; Hydra's forwarding to mpiexec
    races with its ending the job just the same. A file keeps every line at once: the rank forwards what is new
    in it to the notebook (``native_output.py``), and the notebook reads the rest after a death.
    """
    global _native
    if _file is None:
        return None
    paths = {"stdout": native_stdout_path(_path), "stderr": native_stderr_path(_path)}
    out = files.open_own(paths["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(out, 1)
    os.close(out)
    native = files.open_own(paths["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(native, 2)
    if _native is not None:
        os.close(_native)
    _native = native  # kept open: its size is read at every cell
    return paths


def native_stderr_size():
    """How many bytes this rank's C code has written to its standard error so far."""
    try:
        if _native is not None:  # asked before and after every cell: the open file, not its path
            return os.fstat(_native).st_size
        return os.path.getsize(native_stderr_path(_path)) if _file is not None else 0
    except OSError:
        return 0


def native_stderr_since(offset):
    """What this rank's C code wrote to its standard error after *offset* bytes."""
    try:
        with open(native_stderr_path(_path), errors="replace") as file:
            file.seek(offset)
            return file.read(1 << 16)
    except (OSError, AttributeError):
        return ""


def install(directory=None):
    """Dump stacks to a per-rank file in *directory* (default :func:`rank_directory`) on :data:`SIGNAL`; return
    the file's path. Idempotent.

    Before faulthandler takes :data:`SIGNAL`, Python is told to ignore it: what faulthandler puts back when it is
    unregistered, and what ``signal.getsignal()`` reports, so code that restores every signal as it found it
    (Lightning's ``Trainer.fit``) leaves a stack request unanswered instead of ending the rank."""
    global _file, _path
    if _file is None:
        _path = stack_path(os.getpid(), directory or rank_directory())
        _file = open(files.open_own(_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a", buffering=1)
        with contextlib.suppress(ValueError):  # not the main thread: the default action stays behind it
            signal.signal(SIGNAL, signal.SIG_IGN)
        faulthandler.register(SIGNAL, file=_file, all_threads=True, chain=False)
        faulthandler.enable(file=_file, all_threads=True)
        _installed.update({SIGNAL: signal_actions.handler(SIGNAL), signal.SIGSEGV: signal_actions.handler(
            signal.SIGSEGV)})
        _file.write(f"main 0x{threading.main_thread().ident:016x}\n")
    return _path


def rearm():
    """Put the stack-dump and crash handlers back where a cell's code replaced them (Lightning's ``Trainer.fit``
    sets every signal back to what ``signal.getsignal()`` said before, which cannot see faulthandler's handlers).

    Each is put back only when ``sigaction`` says it is no longer faulthandler's: putting one back unregisters it
    first, and a stack request that arrives in between (the notebook asks the ranks still running the moment one
    fails, which is when they too end their cell) met no handler and ended the rank."""
    if _file is None:
        return
    if _taken(SIGNAL):
        faulthandler.unregister(SIGNAL)
        faulthandler.register(SIGNAL, file=_file, all_threads=True, chain=False)
        _installed[SIGNAL] = signal_actions.handler(SIGNAL)
    if _taken(signal.SIGSEGV):
        faulthandler.disable()
        faulthandler.enable(file=_file, all_threads=True)
        _installed[signal.SIGSEGV] = signal_actions.handler(signal.SIGSEGV)


def _taken(signum):
    """Whether *signum*'s handler is no longer the one faulthandler installed (unknown counts as taken)."""
    now = signal_actions.handler(signum)
    return now is None or now != _installed.get(signum)


def note_stderr(text):
    """Keep *text* (what the running cell wrote to stderr) on disk at once: a rank that dies right after
    (``os._exit``, a signal) still leaves its last words, which the batched channel may not have sent."""
    global _stderr
    if _file is None:
        return
    if _stderr is None or _stderr.tell() > STDERR_LIMIT:
        if _stderr is not None:
            _stderr.close()
        _stderr = open(files.open_own(stderr_path(_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w",
                       errors="replace")
    _stderr.write(text)
    _stderr.flush()


cell_numbers = {}  # file a cell was compiled as -> its In[N] in the notebook


def cell_started(filename, number):
    """Note the file the cell about to run (the notebook's ``In[number]``) was compiled as."""
    global current_cell_file
    current_cell_file = filename
    cell_numbers[filename] = number
    if _file is not None:
        _file.write(f"named {number} {filename}\ncell {filename}\n")


@contextlib.contextmanager
def running_file(path):
    """A script (``%mpi run``) runs inside the cell: its file, not the one-line cell that called it, is where the
    user's lines are while it runs."""
    global current_cell_file
    cell = current_cell_file
    current_cell_file = path
    if _file is not None:
        _file.write(f"cell {path}\n")
    try:
        yield
    finally:
        current_cell_file = cell
        if _file is not None:
            _file.write(f"cell {cell}\n")


def remove():
    global _file, _native
    if _native is not None:
        os.close(_native)
        _native = None
    if _file is not None:
        faulthandler.unregister(SIGNAL)
        faulthandler.disable()
        path = _path
        _file.close()
        _file = None
        Path(path).unlink(missing_ok=True)


def main_thread_stack():
    """The main thread's stack as faulthandler would dump it, read from another thread (it runs while the main
    thread waits in MPI, which releases the GIL): ``{"frames": [(file, line, function), ...] most recent first,
    "cell_file": ..., "cells": {file: "N"}}``."""
    import sys

    frame = sys._current_frames().get(threading.main_thread().ident)
    frames = []
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return {"frames": frames, "cell_file": current_cell_file,
            "cells": {file: str(number) for file, number in cell_numbers.items()}}
