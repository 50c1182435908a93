"""Watch the notebook's kernel; if it dies without stopping its world (SIGKILL, OOM), end the world's processes.

Started by :class:`~mpinb.notebook.world.cluster.World` in a session of its own, so a kill of the kernel's process group does
not take it along. It ends only the processes it was given, each checked by pid *and* start time, and exits as
soon as they are all gone or the world is stopped normally. A world in a batch job also gives the command that
cancels the job (``--cancel "scancel 1234"``), run when the kernel dies. A world that keeps its ranks' variables
gives the folder they are kept in (``--forget DIR``): it is for a restart in the same kernel, so it is removed
when the kernel dies, also after the world's processes ended (then the reaper waits for the kernel).

    python -m mpinb.notebook.world.reaper [--cancel COMMAND] [--forget DIR] KERNEL_PID STATUS_DIR PID:START_TIME ...
"""

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ...wire.rank_files import every_path, stack_path


def main(argv):
    cancel = forget = None
    if argv[0] == "--cancel":
        cancel, argv = shlex.split(argv[1]), argv[2:]
    if argv[0] == "--forget":
        forget, argv = argv[1], argv[2:]
    watched, status_dir = int(argv[0]), argv[1]
    processes = []
    for item in argv[2:]:
        pid, started = item.split(":")
        try:
            process = psutil.Process(int(pid))
        except psutil.NoSuchProcess:
            continue
        if abs(process.create_time() - float(started)) < 0.01:
            processes.append(process)
    while alive(watched) and any(alive(p) for p in processes):
        time.sleep(0.5)
    if cancel and not alive(watched):
        subprocess.run(cancel, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=60, check=False)
    signal_all(processes, "terminate")
    end_processes(processes, grace=3)
    if status_dir and not alive(watched):  # what they started that was not listed (cluster.World.stop does it
        # when the kernel stops the world)
        from .leftovers import marked

        since = min((process.create_time() for process in processes), default=0.0) - 1.0
        strays = marked(status_dir, since)
        signal_all(strays, "terminate")
        end_processes(strays, grace=2)
    remove_world_files(status_dir, [process.pid for process in processes])
    if forget:
        while alive(watched):  # the world ended, its kernel lives: a restart may still restore what is kept
            time.sleep(1.0)
        shutil.rmtree(forget, ignore_errors=True)


def alive(process):
    """Whether *process* (a pid or a ``psutil.Process``) still runs; a zombie (killed, not yet waited for by
    its parent) does not."""
    try:
        process = psutil.Process(process) if isinstance(process, int) else process
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def has_ended(process):
    """Whether *process* (a ``psutil.Process`` made while it ran) has exited or is a zombie: one read of its
    state, cheap enough to do before every cell."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def signal_all(processes, how):
    """``process.terminate()`` or ``.kill()`` on each of *processes* still there."""
    for process in processes:
        try:
            getattr(process, how)()
        except psutil.NoSuchProcess:
            pass


def end_processes(processes, *, grace):
    """Wait up to *grace* s for *processes* to exit, then kill the rest by pid and wait for them."""
    left = _wait_dead(processes, grace)
    signal_all(left, "kill")
    _wait_dead(left, 5)


def _wait_dead(processes, timeout):
    """Those of *processes* still running after up to *timeout* s. A process that has exited counts at once,
    whoever is to reap it: orphans wait for the system's init to reap them, which can take a second or more
    (psutil's wait_procs waited for that). Exited children of this process are reaped here."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for process in processes:
            if alive(process):
                left.append(process)
            else:
                _reap(process)
        if not left or time.monotonic() >= deadline:
            return left
        processes = left
        time.sleep(0.02)


def _reap(process):
    """Collect *process*'s exit status if it is an exited child of this process (so no zombie stays here)."""
    try:
        if process.ppid() == os.getpid():
            os.waitpid(process.pid, os.WNOHANG)
    except (psutil.NoSuchProcess, ChildProcessError, OSError):
        pass


def remove_world_files(status_dir, pids, stack_files=()):
    """What a world's ranks leave on disk: the launchers' status directory and each rank's stack and stderr
    files (``rank/stacks.py``), for *pids* and any other *stack_files* known."""
    if status_dir:
        shutil.rmtree(status_dir, ignore_errors=True)
    # the ranks' files are in the status directory on this host (rank/stacks.py); elsewhere, where they said
    for path in {*stack_files, *(stack_path(pid, status_dir) for pid in pids if status_dir)}:
        for kept in every_path(path):
            Path(kept).unlink(missing_ok=True)

if __name__ == "__main__":
    main(sys.argv[1:])
