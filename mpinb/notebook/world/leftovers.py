"""What a world leaves if nothing cleans up: the reaper that ends its processes when the kernel dies without
stopping it, the shared-memory files its ranks mapped, and ipyparallel's files of a world that did not end
cleanly."""

import os
import subprocess
import sys
from pathlib import Path

import psutil


class Footprint:
    """What one world started on this host and would leave there: its processes (the controller, ``mpiexec`` and
    what it started, the engines, a batch job's ranks on this host), the shared-memory files its ranks mapped, and
    the reaper that ends them all if the kernel dies without stopping the world."""

    def __init__(self):
        self.processes = []  # as psutil.Process, once every rank registered; empty once stopped
        self.shared_files = set()  # mapped by the ranks here (MPI's own segments among them): removed at stop
        self.shared_files_seen = set()  # every one this world's ranks mapped (all removed at stop)
        self.reaper = None
        self.oom_kills = None  # the host's count of out-of-memory kills when the ranks registered

    def watch(self, processes, status_dir, *, cancel, kept_state):
        """A reaper that ends *processes* and runs *cancel* if this process dies without stopping the world, and
        removes *kept_state*'s folder; it replaces the one started before."""
        self.reaper = start_reaper(processes, status_dir, cancel=cancel, kept=kept_state.root,
                                   previous=self.reaper or kept_state.release())

    def registered(self, processes):
        """Every rank registered: *processes* are all the world's here, and the shared memory they mapped is noted
        (removed at stop if a rank that died left it)."""
        self.processes = processes
        self.shared_files = mapped_shared_files(processes)
        self.oom_kills = oom_kills()

    def note_shared_files(self, processes):
        """Add the shared-memory files *processes* map now (ranks still alive, at stop)."""
        self.shared_files |= mapped_shared_files(processes)

    def remove_shared_files(self):
        """MPI removes its segments at MPI_Finalize; a rank that died cannot, so what is left once every process
        of the world is gone is removed here (only files these ranks had mapped)."""
        for path in self.shared_files:
            Path(path).unlink(missing_ok=True)
        self.shared_files_seen |= self.shared_files
        self.shared_files = set()

    def release_reaper(self, kept_state):
        """The world stopped: its reaper is handed to *kept_state* when the ranks' variables outlive the world
        (until the kernel does), else ended."""
        if self.reaper is not None and kept_state.holds():
            kept_state.adopt(self.reaper)
        elif self.reaper is not None:
            self.reaper.kill()
            self.reaper.wait(timeout=5)
        self.reaper = None


def oom_kills():
    """How many processes the kernel's out-of-memory killer has ended on this host since it booted (``None``:
    the kernel does not say)."""
    try:
        with open("/proc/vmstat") as file:
            for line in file:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


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
