"""Where a world's ranks run: one ``mpiexec`` on this host (``mpi``, ``ssh``), or one inside a batch job.

Every launcher starts the ranks with a single ``mpiexec -n N``, so they form one MPI world whatever starts
them. The batch launchers are ipyparallel's own (``sbatch``/``scancel``, ``qsub``/``qdel``, ``bsub``/``bkill``);
mpinb only writes the job script: the scheduler's directives for N tasks, then ``mpiexec`` inside the job, which
finds the job's nodes itself (MPICH's Hydra and Open MPI both read Slurm's, PBS's and LSF's allocations).
"""

import os
import shlex
import shutil
import socket
from dataclasses import dataclass

from ...errors import BadArguments
from . import ipp


@dataclass(frozen=True)
class Scheduler:
    """A batch system: the directive prefix of its job scripts and the directives mpinb writes."""

    name: str
    prefix: str
    tasks: str  # directive asking for {n} MPI tasks
    queue: str
    time: str
    account: str
    submit: str  # the command that submits, to say what is missing when it is not installed
    header: tuple  # job name, output file, and the notebook's environment passed on


SCHEDULERS = {
    "slurm": Scheduler("Slurm", "#SBATCH", "--ntasks={n}", "--partition={}", "--time={}", "--account={}",
                       "sbatch", ("--job-name=mpinb-{cluster_id}", "--output={output_file}", "--export=ALL")),
    "pbs": Scheduler("PBS", "#PBS", "-l select={n}:ncpus=1:mpiprocs=1", "-q {}", "-l walltime={}", "-A {}",
                     "qsub", ("-N mpinb", "-j oe", "-o {output_file}", "-V")),
    "sge": Scheduler("Grid Engine", "#$", "-pe mpi {n}", "-q {}", "-l h_rt={}", "-A {}", "qsub",
                     ("-N mpinb", "-j y", "-o {output_file}", "-V", "-S /bin/sh")),
    "lsf": Scheduler("LSF", "#BSUB", "-n {n}", "-q {}", "-W {}", "-P {}", "bsub",
                     ("-J mpinb-{cluster_id}", "-o {output_file}")),
}
LOCAL = ("mpi", "ssh")
LAUNCHERS = LOCAL + tuple(SCHEDULERS)
# ipyparallel launchers that start engines one by one: they cannot make one MPI world
_NOT_MPI = ("local", "sshproxy", "winhpc", "htcondor", "batch")


@dataclass
class Placement:
    """How and where to start a world's ranks (everything ``%mpi start`` takes beyond ``-n``).

    Parameters
    ----------
    launcher : str, default ``"mpi"``
        ``mpi``: ``mpiexec`` on this host (with *hostfile*, also on the hosts listed there). ``ssh``: the same,
        with *hostfile* required: mpiexec reaches its hosts over ssh. ``slurm``, ``pbs``, ``sge``, ``lsf``: a
        batch job of N tasks that runs ``mpiexec`` inside its allocation.
    hostfile : str, optional
        Hosts for ``mpiexec`` (``mpiexec --hostfile``: one host per line, ``host:slots`` for MPICH).
    partition, time, account : str, optional
        The job's partition (queue), time limit (``HH:MM:SS``) and account, for a batch launcher.
    scheduler_args : list of str, default ``[]``
        More directives for the job script, each as on the command line (``--gres=gpu:1``, ``-l mem=4gb``).
    """

    launcher: str = "mpi"
    hostfile: str = None
    partition: str = None
    time: str = None
    account: str = None
    scheduler_args: tuple = ()

    def __post_init__(self):
        self.launcher = (self.launcher or "mpi").lower()
        self.scheduler_args = list(self.scheduler_args or ())
        if self.launcher in _NOT_MPI:
            raise BadArguments(
                f"ipyparallel's {self.launcher!r} launcher starts engines one by one, so they would not form "
                f"one MPI world; use one of: {', '.join(LAUNCHERS)}"
            )
        if self.launcher not in LAUNCHERS:
            raise BadArguments(f"unknown launcher {self.launcher!r}; choose one of: {', '.join(LAUNCHERS)}")
        if self.launcher == "ssh" and not self.hostfile:
            raise BadArguments("--launcher ssh needs --hostfile FILE: the hosts mpiexec starts ranks on over ssh")
        if self.hostfile:
            self.hostfile = os.path.abspath(os.path.expanduser(self.hostfile))
            if not os.path.isfile(self.hostfile):
                raise BadArguments(f"hostfile not found: {self.hostfile}")
        asked = [name for name in ("partition", "time", "account") if getattr(self, name)]
        if self.scheduler_args:
            asked.append("scheduler_args")
        if asked and self.scheduler is None:
            raise BadArguments(f"{', '.join(asked)} only mean something to a batch launcher "
                             f"(--launcher {'|'.join(SCHEDULERS)}), not to {self.launcher!r}")

    @property
    def scheduler(self):
        return SCHEDULERS.get(self.launcher)

    @property
    def batch(self):
        return self.scheduler is not None

    def describe(self, job_id=None):
        """How the ranks were placed, for ``%mpi status`` (``""`` for plain mpiexec here)."""
        if self.batch:
            extra = ", ".join(f"{name} {getattr(self, name)}" for name in ("partition", "time", "account")
                              if getattr(self, name))
            return f"{self.scheduler.name} job {job_id or ''}".rstrip() + (f" ({extra})" if extra else "")
        return f"hosts from {self.hostfile}" if self.hostfile else ""

    def check(self):
        """Raise ``BadArguments`` when the scheduler's submit command is not here."""
        if self.scheduler is not None and shutil.which(self.scheduler.submit) is None:
            raise BadArguments(f"{self.scheduler.submit} not found: --launcher {self.launcher} submits with it; run "
                             f"the notebook on a host of the {self.scheduler.name} cluster (a login node)")

    def remote_hosts(self):
        """Hosts of *hostfile* other than this one (their ranks need a controller they can reach)."""
        if not self.hostfile:
            return []
        hosts = []
        with open(self.hostfile) as listing:
            for line in listing:
                host = line.split("#")[0].strip().split(":")[0].split()[:1]
                if host and not is_this_host(host[0]):
                    hosts.append(host[0])
        return hosts

    def configure(self, config, *, mpiexec, mpiexec_args, engine_cmd, environment, workdir):
        """Fill ipyparallel's *config* for this launcher; return the engine launcher (name or class) for
        ``Cluster(engines=...)``.

        A batch launcher's job script is written to *workdir* (the job itself runs in the notebook's directory,
        as local ranks do)."""
        args = list(mpiexec_args) + (["--hostfile", self.hostfile] if self.hostfile else [])
        if not self.batch:
            config.MPILauncher.mpi_cmd = [mpiexec]
            config.MPILauncher.mpi_args = args
            config.MPIEngineSetLauncher.engine_cmd = engine_cmd
            config.MPIEngineSetLauncher.environment = environment
            return ipp.MPIEngines
        launcher = ipp.batch_launcher(self.launcher)
        section = getattr(config, launcher.config_section)
        section.engine_cmd = engine_cmd
        section.environment = environment
        section.batch_template = self.job_script(mpiexec=mpiexec, mpiexec_args=args)
        section.batch_file_name = os.path.join(workdir, "job.sh")
        return launcher

    def job_script(self, *, mpiexec, mpiexec_args):
        """The batch script template: directives, then one ``mpiexec -n {n}`` of the engines.

        ``{n}``, ``{cluster_id}``, ``{output_file}`` and ``{program_and_args}`` are filled in by ipyparallel;
        braces in the user's own values are escaped.
        """
        command = " ".join(shlex.quote(_escape(word)) for word in [mpiexec, "-n"]) + " {n} "
        command += " ".join(shlex.quote(_escape(word)) for word in mpiexec_args)
        return self.script([self.scheduler.tasks, *self.scheduler.header], [f"exec {command} {{program_and_args}}"],
                           escape=_escape)

    def script(self, header, body, *, escape=str):
        """A job script: the *header* directives, then this placement's partition, time, account and scheduler
        arguments, each passed through *escape*, then the *body* lines."""
        s = self.scheduler
        directives = list(header)
        for name in ("partition", "time", "account"):
            value = getattr(self, name)
            if value:
                template = s.queue if name == "partition" else getattr(s, name)
                directives.append(template.format(escape(value)))
        directives += [escape(arg) for arg in self.scheduler_args]
        return "\n".join(["#!/bin/sh", *(f"{s.prefix} {d}" for d in directives), *body]) + "\n"


def _escape(text):
    return str(text).replace("{", "{{").replace("}", "}}")


def is_this_host(host):
    """Whether *host* names this machine (its name, ``localhost``, or one of its addresses)."""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()) or host.startswith("127."):
        return True
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return False
    return address.startswith("127.") or address in _addresses()


def _addresses():
    import psutil

    return {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
