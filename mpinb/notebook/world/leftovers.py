"""What a world leaves if nothing cleans up: the reaper that ends its processes when the kernel dies without
stopping it, the shared-memory files its ranks mapped, and ipyparallel's files of a world that did not end
cleanly."""

import os
import subprocess
import sys
from pathlib import Path

import psutil


def start_reaper(processes, status_dir, *, cancel=None, kept=None, previous=None):
    """A watcher (``python -m mpinb.notebook.world.reaper``) that ends *processes*, runs *cancel* (a shell command) and removes the folder
    *kept* (the ranks' kept variables), if this process dies without stopping its world; *previous*, the one
    started before the ranks registered, is stopped."""
    items = []
    for process in processes:
        try:
            items.append(f"{process.pid}:{process.create_time()}")
        except psutil.NoSuchProcess:
            pass
    cancel = ["--cancel", cancel] if cancel else []
    cancel += ["--forget", kept] if kept else []
    if previous is not None:
        previous.kill()
        previous.wait(timeout=5)
    return subprocess.Popen([sys.executable, "-m", "mpinb.notebook.world.reaper", *cancel, str(os.getpid()), status_dir,
                             *items], start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


MARK = "MPINB_STATUS_DIR"  # in the environment of every process of a world on this host: its status folder


def marked(value, since):
    """This user's processes on this host started at or after *since* (a time) whose environment says *MARK* =
    *value*: whatever a world's processes started, detached or forked after mpinb listed them (ipyparallel's
    controller forks its schedulers while it starts), which stopping the listed ones leaves running."""
    found, here = [], _host_namespace("self")
    for process in psutil.process_iter(["uids", "create_time"]):
        try:
            if process.info["uids"].real != os.getuid() or process.info["create_time"] < since:
                continue
            # this host's only: a container, or a test's network namespace standing for another host, may share
            # the kernel's process table, and the batch system or mpiexec ends what runs there
            if process.environ().get(MARK) == value and process.pid != os.getpid() and \
                    _host_namespace(process.pid) == here:
                found.append(process)
        except (psutil.Error, AttributeError, OSError):  # gone meanwhile, or a process we may not read
            continue
    return found


def _host_namespace(pid):
    """The UTS and network namespaces of process *pid* (``"self"``: this one): what makes a host of it."""
    return tuple(os.readlink(f"/proc/{pid}/ns/{kind}") for kind in ("uts", "net"))


def mapped_shared_files(processes):
    """Shared-memory files *processes* have mapped (MPI's own segments among them)."""
    files = set()
    for process in processes:
        try:  # /proc/PID/maps, not psutil's memory_maps(), which reads smaps: 30 ms a rank
            with open(f"/proc/{process.pid}/maps") as maps:
                lines = maps.read().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(None, 5)  # address perms offset device inode [path]
            path = fields[5].strip() if len(fields) == 6 else ""
            if path.startswith("/dev/shm/") and not path.endswith("(deleted)"):
                files.add(path)
    return files


def remove_files(paths):
    """What ipyparallel removes itself when a world ends cleanly, but not when its controller or mpiexec was
    killed: connection files and launcher logs."""
    for path in paths:
        if not os.path.isdir(path):
            Path(path).unlink(missing_ok=True)
