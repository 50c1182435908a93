"""This process's main-thread stack, native frames and Python ones, as py-spy reads it (``py-spy dump --native``).

The notebook reads the ranks on its own host with py-spy itself (``notebook/diagnosis/native/``); a rank on another host it
cannot ptrace, so it asks the rank's roll-call thread (:class:`~mpinb.wire.kinds.AskNative`), which runs py-spy on
its own process here (:func:`own`). That thread runs only while the main thread does not hold the GIL (a wait in
MPI, in gloo, on a lock released the GIL): a rank in C that holds it does not answer. Where Linux's Yama lets only
ancestors ptrace (``ptrace_scope`` 1), the process names its py-spy as its tracer while it is read.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

from ...wire.rank_files import TRACER_ENV

PY_SPY = "MPINB_PY_SPY"  # the environment variable that names the py-spy to run
TIMEOUT = 10.0  # seconds one py-spy dump may take (it takes about 0.2 s)
PR_SET_PTRACER = 0x59616D61


def py_spy():
    """The py-spy executable to run, or ``None``: ``$MPINB_PY_SPY`` when set (one that is not an executable file
    means none), else py-spy on ``PATH`` or beside this Python (a virtual environment's ``bin`` not on ``PATH``)."""
    named = os.environ.get(PY_SPY)
    if named:
        return named if os.path.isfile(named) and os.access(named, os.X_OK) else None
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return shutil.which("py-spy") or (beside if os.access(beside, os.X_OK) else None)


def command(tool, pid):
    """The py-spy command that dumps *pid*'s threads, native frames too, as JSON."""
    return [tool, "dump", "--native", "--json", "--pid", str(pid)]


def parse(pid, out, err, code):
    """``(frames, note)`` of *pid*'s main thread from py-spy's ``--json`` dump (*out*, *err*, exit *code*): each
    frame ``(function, file, line, library)``, most recent first, *library* the shared object's name for a native
    frame and ``None`` for a Python one; *note* says why there are none."""
    text = err.decode(errors="replace").strip() if isinstance(err, bytes) else (err or "").strip()
    if code != 0 or not out.strip():
        last = text.splitlines()[-1] if text else f"exit code {code}"
        if "ermission" in text or "not permitted" in text:
            return [], (f"no native frames: py-spy may not ptrace the ranks ({last}): sudo sysctl "
                        "kernel.yama.ptrace_scope=1, or run the kernel with CAP_SYS_PTRACE")
        lines = text.splitlines()
        for at, line in enumerate(lines):  # anyhow's error and its first cause, more telling than its last line
            if line.startswith("Error:"):
                last = line.removeprefix("Error:").strip()
                cause = next((rest.strip().removeprefix("0:").strip() for rest in lines[at + 1:]
                              if rest.strip() and rest.strip() != "Caused by:"), "")
                if cause and not cause.startswith("Stack backtrace"):
                    last = f"{last} ({cause})"
                break
        return [], f"py-spy could not read it: {last}"
    try:
        threads = json.loads(out)
    except ValueError:
        return [], "py-spy's output could not be read"
    main = next((thread for thread in threads if thread.get("os_thread_id") == pid), None) or \
        next((thread for thread in threads if thread.get("thread_name") == "MainThread"), None) or \
        (threads[0] if threads else {})
    frames = [(frame.get("name") or "?", frame.get("filename") or "", frame.get("line") or 0,
               os.path.basename(frame["module"]) if frame.get("module") else None)
              for frame in main.get("frames", [])]
    return frames, ""


def worth_retrying(err, code):
    """Whether a py-spy that ended with *err* and exit *code* may read the process if run again: its unwinding
    fails now and then on a thread caught between two states ("Failed to get stack traces" with libunwind's
    ``UNW_EBADREG``); a refusal to ptrace stays one."""
    text = err.decode(errors="replace") if isinstance(err, bytes) else err or ""
    return code != 0 and "ermission" not in text and "not permitted" not in text


ATTEMPTS = 3  # py-spy runs per process read, while the time allows


def own(timeout=TIMEOUT):
    """``(frames, note)`` of this process's main thread, read by a py-spy this process starts (:func:`parse`),
    again when one fails in a way that may pass (:func:`worth_retrying`)."""
    tool = py_spy()
    if tool is None:
        return [], (f"no native frames: py-spy is not installed on {socket.gethostname()} (pip install py-spy "
                    "in the ranks' environment there)")
    deadline = time.monotonic() + timeout
    for _ in range(ATTEMPTS):
        process = subprocess.Popen(command(tool, os.getpid()), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL)
        _allow(process.pid)  # py-spy takes a tenth of a second before it attaches: long after this
        try:
            out, err = process.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            return [], f"py-spy did not answer within {timeout:g} s"
        finally:
            host, _, kernel = os.environ.get(TRACER_ENV, "").rpartition(":")
            _allow(int(kernel) if kernel.isdigit() and host == socket.gethostname() else 0)  # as the launcher left it
        if not worth_retrying(err, process.returncode) or time.monotonic() >= deadline:
            break
    return parse(os.getpid(), out, err, process.returncode)


def _allow(pid):
    """Let *pid* (0: none) ptrace this process under Yama's ``ptrace_scope`` 1; nothing without Yama."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PTRACER, pid, 0, 0, 0)
    except (OSError, AttributeError):
        pass
