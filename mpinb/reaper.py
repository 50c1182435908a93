"""Watch the notebook's kernel; if it dies without stopping its world (SIGKILL, OOM), end the world's processes.

Started by :class:`~mpinb.cluster.World` in a session of its own, so a kill of the kernel's process group does
not take it along. It ends only the processes it was given, each checked by pid *and* start time, and exits as
soon as they are all gone or the world is stopped normally.

    python -m mpinb.reaper KERNEL_PID STATUS_DIR PID:START_TIME [PID:START_TIME ...]
"""

import os
import shutil
import sys
import time

import psutil

from .rank.stacks import stack_path, stderr_path


def main(argv):
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
    while psutil.pid_exists(watched) and any(p.is_running() for p in processes):
        time.sleep(0.5)
    alive = [p for p in processes if p.is_running()]
    for process in alive:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(alive, timeout=3)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    shutil.rmtree(status_dir, ignore_errors=True)  # where the ranks' launchers wrote how they ended
    for process in processes:  # the ranks' stack and stderr files (rank/stacks.py)
        for path in (stack_path(process.pid), stderr_path(stack_path(process.pid))):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


if __name__ == "__main__":
    main(sys.argv[1:])
