"""Ranks in a batch job: ipyparallel's own batch launchers (``sbatch``/``scancel``, ``qsub``/``qdel``,
``bsub``/``bkill``) submit it; mpinb only writes the job script: the scheduler's directives for N tasks, then
``mpiexec`` inside the job, which finds the job's nodes itself (MPICH's Hydra and Open MPI both read Slurm's,
PBS's and LSF's allocations)."""

import os
import shlex
import shutil
from dataclasses import dataclass

import psutil

from ....errors import BadArguments
from .. import ipp
from .base import OPTIONS, Launcher


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


class Batch(Launcher):
    """A batch job of N tasks that runs ``mpiexec`` inside its allocation; *scheduler* says how its script reads."""

    batch = True
    options = OPTIONS
    scheduler = None

    def check(self):
        if shutil.which(self.scheduler.submit) is None:
            raise BadArguments(f"{self.scheduler.submit} not found: --launcher {self.name} submits with it; run "
                               f"the notebook on a host of the {self.scheduler.name} cluster (a login node)")

    def describe(self, job_id=None):
        extra = ", ".join(f"{name} {getattr(self.placement, name)}" for name in ("partition", "time", "account")
                          if getattr(self.placement, name))
        return f"{self.scheduler.name} job {job_id or ''}".rstrip() + (f" ({extra})" if extra else "")

    def rank_processes(self, world):
        """Each engine of the job on this host and the ``mpinb.rank.launch`` parent above it."""
        processes = []
        for rank in world.local_ranks(world.ranks):
            try:
                engine = psutil.Process(world.identities[rank]["pid"])
                processes.append(engine)
                parent = engine.parent()
                if parent is not None and "mpinb.rank.launch" in parent.cmdline():
                    processes.append(parent)
            except psutil.NoSuchProcess:
                pass
        return processes

    def configure(self, config, *, mpiexec, mpiexec_args, engine_cmd, environment, workdir):
        """The job script is written to *workdir* (the job itself runs in the notebook's directory, as local ranks
        do)."""
        launcher = ipp.batch_launcher(self.name)
        section = getattr(config, launcher.config_section)
        section.engine_cmd = engine_cmd
        section.environment = environment
        section.batch_template = self.job_script(
            mpiexec=mpiexec, mpiexec_args=list(mpiexec_args) + self.placement.hostfile_args())
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
        """A job script: the *header* directives, then the placement's partition, time, account and scheduler
        arguments, each passed through *escape*, then the *body* lines."""
        s, placement = self.scheduler, self.placement
        directives = list(header)
        for name in ("partition", "time", "account"):
            value = getattr(placement, name)
            if value:
                template = s.queue if name == "partition" else getattr(s, name)
                directives.append(template.format(escape(value)))
        directives += [escape(arg) for arg in placement.scheduler_args]
        return "\n".join(["#!/bin/sh", *(f"{s.prefix} {d}" for d in directives), *body]) + "\n"


class Pbs(Batch):
    name, scheduler = "pbs", SCHEDULERS["pbs"]


class GridEngine(Batch):
    name, scheduler = "sge", SCHEDULERS["sge"]


class Lsf(Batch):
    name, scheduler = "lsf", SCHEDULERS["lsf"]


def _escape(text):
    return str(text).replace("{", "{{").replace("}", "}}")
