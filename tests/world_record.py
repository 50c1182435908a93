"""Which processes the tests' own worlds started, wherever they run: in the test process, or in the kernels and
Jupyter servers the tests start (through an IPython startup file, see ``conftest.py``).

Every process mpinb lists as a world's own (what its reaper watches, ``Footprint.watch``) is
noted, pid and start time, in the file ``$MPINB_TEST_RECORD`` names; a check for leftovers then looks at exactly
those, never at the rest of the machine, where other MPI jobs and mpinb worlds may run.
"""

import os

import psutil

ENV = "MPINB_TEST_RECORD"


def install():
    """Note the processes of every world this process starts from now on (idempotent)."""
    from mpinb.notebook.world import ipp
    from mpinb.notebook.world.leftovers import Footprint

    method = Footprint.watch
    if getattr(method, "recorded", False):
        return

    def noting(self, processes, *args, **kwargs):
        note(processes)
        return method(self, processes, *args, **kwargs)

    noting.recorded = True
    Footprint.watch = noting
    # also what a start that failed before its reaper watched had launched (the controller of a job the scheduler
    # refused), which the stop that cleans up lists through this function
    listed = ipp.launched_processes

    def listing(cluster):
        processes = listed(cluster)
        note(processes)
        return processes

    ipp.launched_processes = listing


def note(processes):
    path = os.environ.get(ENV)
    if not path:
        return
    lines = []
    for process in processes:
        try:
            lines.append(f"{process.pid} {process.create_time()}\n")
        except psutil.NoSuchProcess:
            pass
    with open(path, "a") as record:
        record.writelines(lines)


def noted(path):
    """How many processes *path* names."""
    try:
        with open(path) as record:
            return sum(1 for line in record if line.strip())
    except FileNotFoundError:
        return 0


def still_running(path, timeout=10):
    """The processes noted in *path* still running after up to *timeout* s (a zombie has ended)."""
    processes = []
    try:
        with open(path) as record:
            entries = {tuple(line.split()) for line in record if line.strip()}
    except FileNotFoundError:
        return []
    for pid, started in entries:
        try:
            process = psutil.Process(int(pid))
            if abs(process.create_time() - float(started)) < 0.01:
                processes.append(process)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    running = []
    for process in alive:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
        except psutil.NoSuchProcess:
            pass
    return running


STARTUP = f"""\
# Written by the mpinb test suite: kernels it starts note the processes of every world they start.
import os, sys
if os.environ.get({ENV!r}) and not os.environ.get("MPINB_STATUS_DIR"):  # not on the ranks themselves
    sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
    import world_record
    world_record.install()
"""
