"""The files each rank keeps for the notebook in the world's private directory, named after the one its
faulthandler dumps stacks to (``mpinb-stacks-<pid>``, sent in the rank's :class:`~mpinb.wire.kinds.Hello`), and
the signal that asks for the dump. The rank writes them (``rank/stacks.py``, ``rank/tracing/ledger.py``); the
notebook reads them after a rank is stuck or gone (``notebook/diagnosis/diagnose.py``, ``deaths.py``,
``mismatch.py``) and removes them with the world (``notebook/world/reaper.py``)."""

import os
import signal
import socket

STACK_SIGNAL = signal.SIGUSR2  # a rank dumps every thread's stack to its stack file on it
# in the ranks' environment: the pid of the kernel, which the rank's launcher lets ptrace it (and py-spy, the kernel's
# child, read its native stack) where Linux's Yama allows only ancestors (``rank/launch.py``, ``notebook/diagnosis/native/``)
TRACER_ENV = "MPINB_TRACER"


def tracer():
    """``"HOST:PID"`` of this process: the value of :data:`TRACER_ENV` that names it (a pid says which process on
    its own host only)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def stack_path(pid, directory):
    """The file the rank with process id *pid* dumps its stacks to, in *directory* (the world's private one)."""
    return os.path.join(directory, f"mpinb-stacks-{pid}")


def stderr_path(path):
    """Where the rank that dumps stacks to *path* keeps its recent stderr."""
    return path.replace("mpinb-stacks-", "mpinb-stderr-")


def ledger_path(path):
    """Where the rank that dumps stacks to *path* mirrors the collective it waits in (``wire/mirror.py``)."""
    return path.replace("mpinb-stacks-", "mpinb-ledger-")


def native_stderr_path(path):
    """Where the rank that dumps stacks to *path* sends what C code writes to its standard error."""
    return path.replace("mpinb-stacks-", "mpinb-cstderr-")


def native_stdout_path(path):
    """Where the rank that dumps stacks to *path* sends what C code and subprocesses write to its standard output."""
    return path.replace("mpinb-stacks-", "mpinb-cstdout-")


def every_path(path):
    """The stack file *path* and the files named after it."""
    return path, stderr_path(path), native_stderr_path(path), native_stdout_path(path), ledger_path(path)


# mpinb's wrappers around MPI calls (every module of rank/tracing/; the mpi4py backend of torch.distributed,
# rank/torch_backend/, whose errors then read as raised by the torch call the cell made), and the guards that stand
# in for what a rank must not call (rank/guards.py): not where the user's code is, so left out of the stacks and
# tracebacks users see; and Python's bdb, which the visual debugger (rank/debug/visual_debugger.py) runs a cell
# under: its frames sit above the line a rank is paused at. Whole folders, so a module split off stays left out.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modules(folder):
    return tuple(f"mpinb/{folder}/{name}" for name in sorted(os.listdir(os.path.join(_PACKAGE, folder)))
                 if name.endswith(".py"))


WRAPPERS = _modules("rank/tracing") + _modules("rank/torch_backend") + (
    "mpinb/rank/guards.py", "mpinb/rank/sampler_epochs.py",
    os.path.join(os.path.dirname(os.__file__), "bdb.py"))
