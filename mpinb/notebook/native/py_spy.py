"""Where in C each rank is: its main thread's native frames merged with its Python ones, read by py-spy.

A rank that does not answer an interrupt is in C: an ``MPI_Wait``, gloo's allreduce under DDP's backward, a lock
in a destructor. Its Python frames (faulthandler's, ``diagnose.capture_stacks``) end at the call that went into C;
``py-spy dump --native`` reads the rest from outside the process, without the rank's GIL or its cooperation. py-spy
is optional (``pip install py-spy``): without it, or where the kernel may not ptrace the ranks, one line says why
and the Python frames are shown as before. ``$MPINB_PY_SPY`` names the py-spy to run (a path; one that is not an
executable file means none).

The ranks on this host are read, as many py-spys at once as there are cores. Ranks on other hosts are out of
reach: the notebook cannot ptrace a process there, and the rank's own roll-call thread cannot run py-spy while
the rank's main thread holds the GIL; they are said to be on that host, with their Python frames.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from ...wire.rank_files import TRACER_ENV, tracer

PY_SPY = "MPINB_PY_SPY"  # the environment variable that names the py-spy to run
TIMEOUT = 10.0  # seconds one py-spy dump may take (it takes about 0.2 s)
CAP_SYS_PTRACE = 19
INSTALL = "pip install py-spy"


@dataclass
class NativeStack:
    """One rank's main thread as py-spy saw it, most recent call first: each frame ``(function, file, line,
    library)``, *library* being the shared object's name for a native frame and ``None`` for a Python one."""

    rank: int
    frames: list = field(default_factory=list)
    note: str = ""  # why there are no frames

    @property
    def python(self):
        """The Python frames alone, ``(file, line, function)`` as ``diagnose.RankStack`` holds them."""
        return [(file, line, function) for function, file, line, library in self.frames if library is None]


def py_spy():
    """The py-spy executable to run, or ``None``: ``$MPINB_PY_SPY`` when set, else py-spy on ``PATH`` or beside
    this Python (a kernel started from a virtual environment's ``bin`` without it on ``PATH``)."""
    named = os.environ.get(PY_SPY)
    if named:
        return named if os.path.isfile(named) and os.access(named, os.X_OK) else None
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return shutil.which("py-spy") or (beside if os.access(beside, os.X_OK) else None)


def missing():
    """The one line said when there is no py-spy to run: how to get it."""
    named = os.environ.get(PY_SPY)
    if named:
        return (f"no native frames: ${PY_SPY} names {named}, which is not an executable py-spy ({INSTALL} in the "
                f"kernel's environment, or unset ${PY_SPY})")
    return (f"no native frames (where in C or MPI each rank is): py-spy is not installed; {INSTALL} in the kernel's "
            "environment shows them")


def refusal(pid):
    """Why this process may not ptrace *pid* (so py-spy cannot read it), and what to do; ``""`` when it may.

    Linux's Yama (``/proc/sys/kernel/yama/ptrace_scope``): 0 lets a process trace its user's processes; 1 only its
    descendants, or processes that named it their tracer (mpinb's launcher names the kernel, ``$MPINB_TRACER``;
    py-spy, the kernel's child, is allowed through it); 2 only processes with ``CAP_SYS_PTRACE``; 3 none."""
    scope = _read_int("/proc/sys/kernel/yama/ptrace_scope")
    capable = _has_capability(CAP_SYS_PTRACE)
    fix = "sudo sysctl kernel.yama.ptrace_scope=1, or run the kernel with CAP_SYS_PTRACE (docker run --cap-add " \
          "SYS_PTRACE)"
    if scope == 3:
        return ("no native frames: kernel.yama.ptrace_scope is 3, so no process may read another's stack until the "
                "machine reboots (then sudo sysctl kernel.yama.ptrace_scope=1)")
    if scope == 2 and not capable:
        return f"no native frames: kernel.yama.ptrace_scope is 2 and the kernel lacks CAP_SYS_PTRACE: {fix}"
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return ""  # gone, or not Linux: py-spy says so itself
    if owner != os.geteuid() and not capable:
        return (f"no native frames: the ranks run as user {owner} and the kernel as {os.geteuid()} without "
                f"CAP_SYS_PTRACE: run the kernel as their user, or with CAP_SYS_PTRACE")
    if scope == 1 and not capable and _environment(pid).get(TRACER_ENV) != tracer():
        return ("no native frames: kernel.yama.ptrace_scope is 1 and these ranks were not started by this kernel's "
                f"mpinb (which lets it trace them): sudo sysctl kernel.yama.ptrace_scope=0, or run the kernel with "
                "CAP_SYS_PTRACE")
    return ""


def capture(world, ranks, *, timeout=TIMEOUT):
    """``({rank: NativeStack}, note)`` for *ranks* of *world*: every rank on this host read by a py-spy of its own
    (:func:`read`). *note* is the one line said when none could be read (no py-spy, no permission), else ``""``;
    a rank on another host, or one py-spy could not read, has a :attr:`NativeStack.note` instead of frames."""
    tool = py_spy()
    if tool is None:
        return {}, missing()
    stacks, pids = {}, {}
    for rank in ranks:
        who = world.identities.get(rank, {})
        if world.is_remote(rank):
            stacks[rank] = NativeStack(rank, note=f"on {who.get('host', 'another host')}, which the notebook "
                                                  "cannot ptrace: Python frames only")
            continue
        why = refusal(who["pid"])
        if why:
            return {}, why
        pids[rank] = who["pid"]
    dumps = read(tool, list(pids.values()), timeout=timeout)
    for rank, pid in pids.items():
        stacks[rank] = _parse(rank, pid, *dumps[pid]) if pid in dumps else \
            NativeStack(rank, note=f"py-spy did not answer within {timeout:g} s")
    refused = [stack.note for stack in stacks.values() if stack.note.startswith("no native frames")]
    return stacks, refused[0] if refused and len(refused) == len(pids) else ""


def read(tool, pids, *, timeout=TIMEOUT):
    """``{pid: (stdout, stderr, exit code)}`` of ``py-spy dump --native --json`` on each of *pids*, as many at once
    as there are cores. Ranks waiting in MPI spin (MPICH polls): eight of them on two cores leave a py-spy a
    tenth of a core, so the ranks not being read are stopped (``SIGSTOP``) meanwhile, and every rank stopped
    here is continued before this returns. A py-spy still running after *timeout* s is killed, its pid left out."""
    held = _stop(pids)
    width, pending, running, done = max(os.cpu_count() or 1, 1), list(pids), {}, {}
    deadline = time.monotonic() + timeout
    try:
        while (pending or running) and time.monotonic() < deadline:
            while pending and len(running) < width:
                pid = pending.pop(0)
                if pid in held:
                    _signal(pid, signal.SIGCONT)
                out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
                running[pid] = (subprocess.Popen([tool, "dump", "--native", "--json", "--pid", str(pid)], stdout=out,
                                                 stderr=err, stdin=subprocess.DEVNULL), out, err)
            for pid, (process, out, err) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[pid]
                if pid in held:
                    _signal(pid, signal.SIGSTOP)
                out.seek(0)
                err.seek(0)
                done[pid] = (out.read(), err.read(), process.returncode)
                out.close()
                err.close()
            time.sleep(0.005)
    finally:
        for process, out, err in running.values():  # the py-spys started here; a rank one paused resumes
            process.kill()
            process.wait()
            out.close()
            err.close()
        for pid in held:
            _signal(pid, signal.SIGCONT)
    return done


def _stop(pids):
    """Stop those of *pids* that run (not stopped already, by a debugger or a user): the ones to continue after."""
    held = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                state = stat.read().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"T", b"t", b"Z", b"X") and _signal(pid, signal.SIGSTOP):
            held.append(pid)
    return held


def _signal(pid, number):
    try:
        os.kill(pid, number)
        return True
    except OSError:
        return False


def _parse(rank, pid, out, err, code):
    """The main thread of py-spy's ``--json`` dump of *pid*."""
    text = err.decode(errors="replace").strip()
    if code != 0 or not out.strip():
        if "ermission" in text or "not permitted" in text:
            return NativeStack(rank, note=f"no native frames: py-spy may not ptrace the ranks ({text.splitlines()[-1]})"
                                          ": sudo sysctl kernel.yama.ptrace_scope=1, or run the kernel with "
                                          "CAP_SYS_PTRACE")
        last = text.splitlines()[-1] if text else f"exit code {code}"
        return NativeStack(rank, note=f"py-spy could not read it: {last}")
    try:
        threads = json.loads(out)
    except ValueError:
        return NativeStack(rank, note="py-spy's output could not be read")
    main = next((thread for thread in threads if thread.get("os_thread_id") == pid), None) or \
        next((thread for thread in threads if thread.get("thread_name") == "MainThread"), None) or \
        (threads[0] if threads else {})
    frames = [(frame.get("name") or "?", frame.get("filename") or "", frame.get("line") or 0,
               os.path.basename(frame["module"]) if frame.get("module") else None)
              for frame in main.get("frames", [])]
    return NativeStack(rank, frames=frames)


def _read_int(path):
    try:
        with open(path) as file:
            return int(file.read().strip())
    except (OSError, ValueError):
        return None  # no Yama: Linux's ordinary rules (same user, or CAP_SYS_PTRACE)


def _has_capability(number):
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> number & 1)
    except (OSError, ValueError):
        pass
    return False


def _environment(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            items = file.read().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1) for item in items if b"=" in item)
