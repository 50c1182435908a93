"""What mpinb uses of ipyparallel beyond its documented API, in one place, for the major version pyproject.toml
pins. Each use is listed in :data:`PRIVATE`; ``tests/test_ipp.py`` checks every one against the installed
ipyparallel and names the part that changed when an upgrade breaks one.

Typed instead of probed: a launcher's process, output file and job id are read from the ipyparallel class that
defines them (local processes, batch jobs), and connection files from the controller launcher's own property.
"""

import os
import shlex
import subprocess
from pathlib import Path

import psutil
from ipyparallel.cluster.launcher import (BatchSystemLauncher, LocalProcessLauncher, MPIEngineSetLauncher,
                                          find_launcher_class)

from ...errors import BadArguments

PRIVATE = {  # what is used -> why no public API does
    "BatchSystemLauncher._run_command": "the only place the scheduler's refusal (sbatch's stderr) can be read",
    "Cluster._async_thread, Cluster._thread_loop": "the event-loop thread *_sync calls start is never stopped",
    "IPController.init_hub's time.sleep": "a fixed 0.25 s before the connection files are written; no setting "
                                          "skips it (notebook/world/controller.py)",
}


def process(launcher):
    """The ``psutil.Process`` a local launcher started (controller, ``mpiexec``), or ``None``."""
    return launcher.process if isinstance(launcher, LocalProcessLauncher) else None


def output_file(launcher):
    """The file a launcher's process or job writes its output to, or ``""``."""
    return launcher.output_file if isinstance(launcher, (LocalProcessLauncher, BatchSystemLauncher)) else ""


def job_id(launcher):
    """The batch job a launcher submitted, or ``""``."""
    return launcher.job_id if isinstance(launcher, BatchSystemLauncher) else ""


def connection_files(cluster):
    """The controller's connection files (owner-only, holding the world's key), as its launcher names them."""
    controller = cluster.controller
    return list(controller.connection_files.values()) if controller is not None else []


def engine_connection_file(cluster):
    """The controller's connection file for engines, or ``""``."""
    controller = cluster.controller
    return controller.connection_files.get("engine", "") if controller is not None else ""


def end_event_thread(cluster):
    """Stop the event-loop thread ipyparallel starts for a Cluster's ``*_sync`` calls made where an event loop
    already runs (a Jupyter kernel), and close its loop: it is never stopped otherwise, and each world left a
    thread and its descriptors behind in the kernel."""
    thread, loop = cluster._async_thread, getattr(cluster, "_thread_loop", None)
    if thread is None or loop is None:
        return
    loop.add_callback(loop.stop)
    thread.join(timeout=5)
    if not thread.is_alive():
        loop.close(all_fds=False)
    cluster._async_thread = cluster._thread_loop = None


class ReadsAnyBytes:
    """``get_output`` that reads what the launched processes printed as UTF-8 with replacement characters.

    ipyparallel reads a launcher's output file strictly: one byte that is not UTF-8, which a rank's C code or
    ``os.write(1, b"\\xff")`` sends through mpiexec, raised ``UnicodeDecodeError`` from the launcher's stop
    callback (logged by tornado) and from ``%mpi stop``. Read once and kept, as ipyparallel does; *remove*
    (by default for batch jobs, as there) deletes the file."""

    _read_output = None

    def get_output(self, remove=None):
        path = self.output_file
        if self._read_output is None:
            try:
                with open(path, encoding="utf-8", errors="replace") as output:
                    self._read_output = output.read()
            except OSError:  # not written (yet), or no file at all
                self._read_output = ""
        if path and (isinstance(self, BatchSystemLauncher) if remove is None else remove):
            try:
                Path(path).unlink(missing_ok=True)
            except OSError as exc:  # as ipyparallel: a file another process holds is not worth a failure
                self.log.error("Failed to remove %s: %s", path, exc)
        return self._read_output


class MPIEngines(ReadsAnyBytes, MPIEngineSetLauncher):
    """ipyparallel's ``mpi`` engine launcher (``mpiexec`` on this host), its output read as
    :class:`ReadsAnyBytes` reads it."""

    entrypoint_name = "mpi"


def batch_launcher(name):
    """ipyparallel's engine-set launcher called *name*, saying why when the scheduler refuses the job.

    ipyparallel runs ``sbatch``/``qsub``/``scancel`` with ``check_output``: the scheduler's reason (``invalid
    partition specified``) would go to the kernel's own stderr, which the notebook never shows.
    """
    base = find_launcher_class(name, "engine")

    class Launcher(ReadsAnyBytes, base):
        entrypoint_name = name
        config_section = base.__name__  # the ipyparallel class whose settings it takes

        def _run_command(self, command, **kwargs):
            self.log.debug("Running command: %s", shlex.join(command))
            done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=120, start_new_session=True, **kwargs)
            said = done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}"
            if done.returncode != 0 and command[:1] != self.delete_command[:1]:
                raise BadArguments(f"{command[0]} refused the job: {said}")
            if done.returncode != 0:  # cancelling a job that has already ended: nothing left to do
                self.log.debug("%s: %s", command[0], said)
            return done.stdout

    Launcher.__name__ = Launcher.__qualname__ = f"Reporting{base.__name__}"
    return Launcher


def launched_processes(cluster):
    """The processes this kernel started for ipyparallel's *cluster*: the controller, and ``mpiexec`` (or the
    batch launcher) with everything below it."""
    processes = []
    for launcher in [cluster.controller, *cluster.engines.values()]:
        started = process(launcher)
        if started is None:
            continue
        try:
            processes.append(started)
            processes.extend(started.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    return processes


def engines_output(cluster):
    """What the engines' launcher (``mpiexec``, or the batch job) printed so far, Hydra's reports of failed
    processes among it (``""`` without a cluster)."""
    texts = []
    for launcher in (cluster.engines.values() if cluster is not None else ()):
        path = output_file(launcher)
        if path and os.path.exists(path):
            with open(path, errors="replace") as output:
                texts.append(output.read())
    return "\n".join(texts)
