"""Where in C each rank is: its main thread's native frames merged with its Python ones, read by py-spy.

A rank that does not answer an interrupt is in C: an ``MPI_Wait``, gloo's allreduce under DDP's backward, a lock
in a destructor. Its Python frames (faulthandler's, ``diagnose.capture_stacks``) end at the call that went into C;
``py-spy dump --native`` reads the rest from outside the process, without the rank's GIL or its cooperation. py-spy
is optional (``pip install py-spy``): without it, or where the kernel may not ptrace the ranks, one line says why
and the Python frames are shown as before. ``$MPINB_PY_SPY`` names the py-spy to run (a path; one that is not an
executable file means none).

The ranks on this host are read, as many py-spys at once as there are cores. A rank on another host, which the
notebook cannot ptrace, reads itself: its roll-call thread runs py-spy on its own process there
(``rank/debug/native_stack.py``), which it can while the rank's main thread does not hold the GIL (a wait in MPI or
gloo); a rank holding it in C does not answer, and is shown with its Python frames.
"""

import itertools
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from ....rank.debug.native_stack import ATTEMPTS, PY_SPY, TIMEOUT, command, parse, py_spy, worth_retrying
from ....wire.rank_files import TRACER_ENV, tracer

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


def capture(world, ranks, *, timeout=TIMEOUT, elsewhere=True):
    """``({rank: NativeStack}, note)`` for *ranks* of *world*: every rank on this host read by a py-spy of its own
    (:func:`read`); with *elsewhere*, each rank on another host reads itself, asked through its roll-call thread
    (``rank/debug/native_stack.py``), which answers only while the rank's main thread does not hold the GIL. *note* is
    the one line said when the ranks here could not be read (no py-spy, no permission), else ``""``; a rank that
    could not be read has a :attr:`NativeStack.note` instead of frames."""
    stacks, pids, note = {}, {}, ""
    remote = [rank for rank in ranks if world.is_remote(rank)]
    if remote and elsewhere:
        stacks.update(_asked(world, remote, min(timeout, ASK_WAIT)))
    for rank in remote:
        if rank not in stacks:
            host = world.identities.get(rank, {}).get("host", "another host")
            stacks[rank] = NativeStack(rank, note=f"on {host}: its native stack is asked of it between cells only")
    here = [rank for rank in ranks if rank not in remote]
    tool = py_spy() if here else None
    if here and tool is None:
        return stacks, missing()
    for rank in here:
        pid = world.identities[rank]["pid"]
        note = note or refusal(pid)
        pids[rank] = pid
    if note:
        return stacks, note
    dumps = read(tool, list(pids.values()), timeout=timeout) if pids else {}
    for rank, pid in pids.items():
        stacks[rank] = _parse(rank, pid, *dumps[pid]) if pid in dumps else \
            NativeStack(rank, note=f"py-spy did not answer within {timeout:g} s")
    refused = [stacks[rank].note for rank in pids if stacks[rank].note.startswith("no native frames")]
    return stacks, refused[0] if refused and len(refused) == len(pids) else ""


def _asked(world, ranks, wait):
    """The native stacks of *ranks* (on other hosts) that their roll-call threads sent within *wait* s; one that
    did not answer is said to hold its GIL."""
    answers = world.channel.native(ranks, ("native", next(_asking)), wait) if world.channel is not None else {}
    stacks = {}
    for rank in ranks:
        host = world.identities.get(rank, {}).get("host", "another host")
        if rank in answers:
            frames, note = answers[rank]
            stacks[rank] = NativeStack(rank, frames=frames, note=f"on {host}: {note}" if note else "")
        else:
            stacks[rank] = NativeStack(rank, note=f"on {host}: it did not answer within {wait:g} s (its main "
                                                  "thread holds the GIL in C, so its roll call cannot run py-spy)")
    return stacks


_asking = itertools.count()
ASK_WAIT = 5.0  # s the ranks on other hosts get to read themselves (py-spy: 0.2 s idle, 2 s were too few when busy)


def read(tool, pids, *, timeout=TIMEOUT):
    """``{pid: (stdout, stderr, exit code)}`` of ``py-spy dump --native --json`` on each of *pids*, run again (up to
    ``ATTEMPTS`` times) when it fails in a way that may pass. A py-spy still running after *timeout* s is killed,
    its pid left out unless an earlier run of it ended.

    Ranks waiting in MPI spin (MPICH polls): eight of them on two cores leave a py-spy a tenth of a core. Where
    Linux groups processes by session for the scheduler (``sched_autogroup_enabled``), each py-spy runs in a session
    of its own, so it gets a group's share however many ranks spin, and all run at once; elsewhere as many run at
    once as there are cores, the ranks not being read stopped (``SIGSTOP``) meanwhile. Either way a rank read is
    stopped until the others are, and every rank stopped here is continued before this returns."""
    grouped = _read_int("/proc/sys/kernel/sched_autogroup_enabled") == 1
    held = [] if grouped else _stop(pids)
    width = len(pids) if grouped else max(os.cpu_count() or 1, 1)
    pending, running, done, tries = list(pids), {}, {}, {}
    deadline = time.monotonic() + timeout
    try:
        while (pending or running) and time.monotonic() < deadline:
            while pending and len(running) < width:
                pid = pending.pop(0)
                if pid in held:
                    _signal(pid, signal.SIGCONT)
                out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
                running[pid] = (subprocess.Popen(command(tool, pid), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                                 start_new_session=True), out, err)
            for pid, (process, out, err) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[pid]
                if pid in held:
                    _signal(pid, signal.SIGSTOP)
                else:
                    held += _stop([pid])
                out.seek(0)
                err.seek(0)
                done[pid] = (out.read(), err.read(), process.returncode)
                out.close()
                err.close()
                tries[pid] = tries.get(pid, 0) + 1
                if tries[pid] < ATTEMPTS and worth_retrying(*done[pid][1:]):
                    pending.append(pid)  # its unwinding failed this time: read again while the time allows
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
    frames, note = parse(pid, out, err, code)
    return NativeStack(rank, frames=frames, note=note)


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
