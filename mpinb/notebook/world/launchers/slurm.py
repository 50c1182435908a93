"""Ranks in a Slurm job: the job script ``sbatch`` submits, and the job as the world watches it while the ranks
register (queued, placed where they cannot reach the controller, refused, ended), while they run (its time
limit, its lost nodes) and once they stop (``scancel``, and the queue it leaves)."""

import logging
import re
import time

from ....errors import BadArguments, MPIError
from ..slurm_job import JobClock, SlurmJob
from .base import is_this_host
from .batch import SCHEDULERS, Batch

log = logging.getLogger("mpinb")

# Reasons a pending Slurm job gives when it will never start without a change (squeue %R)
NEVER_RUNS = {
    "PartitionConfig": "the partition cannot give that many tasks (fewer ranks, or another --partition)",
    "PartitionNodeLimit": "more nodes than the partition allows (fewer ranks, or another --partition)",
    "PartitionTimeLimit": "a longer --time than the partition allows",
    "BadConstraints": "no node satisfies the job's constraints (check --scheduler-arg)",
    "InvalidAccount": "the --account is not valid",
    "InvalidQOS": "the QOS is not valid",
    "AccountNotAllowed": "the account may not use this partition",
    "QOSNotAllowed": "the QOS may not use this partition",
    "JobHeldAdmin": "an administrator holds the job",
    "JobHeldUser": "the job is held (scontrol release)",
}
# a job over a limit its QOS or account puts on each job never runs (a limit per user or group only waits)
_OVER_PER_JOB_LIMIT = re.compile(r"^(QOS|Assoc)(Max\w*PerJob\w*|Min\w*)$")


def never_runs(reason):
    """Why Slurm will never run a job pending for *reason*, with what to do (``None``: it may yet run)."""
    if reason in NEVER_RUNS:
        return f"{NEVER_RUNS[reason]}; scontrol show partition lists what each partition allows"
    over = _OVER_PER_JOB_LIMIT.match(reason)
    if over:
        whose = "the job's QOS" if over.group(1) == "QOS" else "the account"
        return (f"it asks more than {whose} allows one job (fewer ranks, a shorter time limit, or another "
                f"{'--qos' if over.group(1) == 'QOS' else '--account'}); sacctmgr show qos and sacctmgr show assoc "
                "list the limits")
    return None


# what srun printed when its MPI plugin could not start the ranks, and what to do
SRUN_HINTS = {
    "can not load PMIx library": "Slurm's pmix plugin could not load libpmix.so (Debian and Ubuntu ship it in "
                                 "libpmix-dev): install it on every node, or start Open MPI's ranks with its own "
                                 "mpiexec inside the job (%mpi start --launcher slurm --mpi openmpi)",
    "Invalid MPI type": "srun has no such --mpi plugin: srun --mpi=list lists those this Slurm has",
}


def srun_hint(output):
    """``": what to do"`` when *output* shows srun could not start the ranks through its MPI plugin, else ``""``."""
    return next((f": {hint}" for said, hint in SRUN_HINTS.items() if said in output), "")



class Slurm(Batch):
    """A Slurm job of N tasks running ``mpiexec`` in its allocation; the job it submitted is :attr:`job`."""

    name, scheduler = "slurm", SCHEDULERS["slurm"]

    def __init__(self, placement):
        super().__init__(placement)
        self.job = None  # the SlurmJob the ranks run in, once launched
        self.clock = None  # its JobClock
        self._lost_hosts = (None, set(), {})  # when Slurm was last asked, about which hosts, which it said lost

    def launched(self, job_id):
        if job_id:
            self.job = SlurmJob(job_id)
            self.clock = JobClock(self.job)

    def waiting(self, world, output):
        if self.job is None:
            return None
        state, where = self.job.state()
        queued = self._check_job(world, state, where, output)
        reason = "" if where in ("", "(None)") else f" {where}"
        return (f"Slurm job {self.job.job_id} {state.lower()}{reason}" if queued else "ranks registered"), queued

    def _check_job(self, world, state, where, output):
        """Raise if the job ended, or runs where the ranks cannot reach the controller; return whether it is
        still queued."""
        if state is None:
            text = output()
            raise MPIError(f"Slurm job {self.job.job_id} ended before every rank registered{srun_hint(text)}; "
                           f"its output:\n{text}")
        if state == "PENDING":
            reason = where.strip("()")
            why = never_runs(reason)
            if why is not None:
                raise BadArguments(f"Slurm will not run job {self.job.job_id} as asked ({reason}): {why}")
            return True
        if state == "RUNNING" and world.loopback:
            away = [host for host in self.job.nodes(where) if not is_this_host(host)]
            if away:
                raise MPIError(
                    f"Slurm job {self.job.job_id} runs on {', '.join(away[:3])}, and ranks there cannot reach a "
                    f"controller that listens on {world.ip}: %mpi start --launcher slurm --ip ADDRESS (an address "
                    "of this host the compute nodes reach, or 0.0.0.0)"
                )
        return False

    def cancel_command(self):
        return f"scancel {self.job.job_id}" if self.job is not None else None

    @property
    def watches_hosts(self):
        # hosts of the job whose ranks all stopped answering heartbeats (cut off, or their node down): Slurm cannot
        # end the job there until it gives up on them, which stop does not wait for
        return self.job is not None

    def lost_hosts(self, hosts, *, within=2.0):
        """Hosts Slurm says are lost (a node down, or whose slurmd does not respond)."""
        if self.job is None or not hosts:
            return {}
        now = time.monotonic()
        when, asked, lost = self._lost_hosts
        if when is None or now - when >= within or not asked.issuperset(hosts):
            lost = self.job.lost_nodes(sorted(set(hosts)))
            self._lost_hosts = (now, set(hosts), lost)
        return {host: note for host, note in lost.items() if host in hosts}

    def time_warning(self):
        """:meth:`JobClock.warning`."""
        return self.clock.warning() if self.clock is not None else None

    def time_left(self):
        return self.clock.describe() if self.clock is not None else ""

    def ended(self):
        """What ended the job when Slurm ended it (its time limit, a preemption...)."""
        return self.job.ended() if self.job is not None else ""

    def stopped(self, *, unreachable=()):
        """``scancel`` was run by ipyparallel's launcher: wait (a minute at most) until the job leaves the queue."""
        job, self.job, self.clock = self.job, None, None
        if job is not None and not job.wait_gone(timeout=60, unreachable=unreachable):
            log.warning("Slurm job %s is still in the queue (%s) a minute after scancel", job.job_id, job.state()[0])
        elif unreachable and job.state()[0] is not None:
            log.info("Slurm job %s leaves the queue once Slurm gives up on %s, which cannot be reached", job.job_id,
                     ", ".join(sorted(unreachable)))

    def export_script(self, header, body):
        """A job script for ``mpinb export``: *header* directives, then the placement's, then *body*."""
        return self.script(header, body)
