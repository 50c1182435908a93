"""A submitted Slurm job as the notebook reads it: its state or why it waits, its nodes and which of them Slurm
has lost, its time limit and what is left of it, and what ended it when Slurm did."""

import re
import subprocess
import time

# how Slurm ended a job, by its final state (scontrol's JobState), when the ranks did not end it themselves; a
# node that failed (NODE_FAIL) is named with its ranks by the lost-node check instead (SlurmJob.lost_nodes)
ENDED_BY_SLURM = {
    "TIMEOUT": "Slurm ended job {job} at its time limit ({limit})",
    "DEADLINE": "Slurm ended job {job} at its deadline",
    "PREEMPTED": "Slurm preempted job {job} (a job of higher priority took its nodes)",
    "OUT_OF_MEMORY": "Slurm ended job {job}: it went over its memory limit",
    "CANCELLED": "job {job} was cancelled (scancel)",
}


def _run(*command, timeout=30):
    """*command*'s stdout, or ``None`` when it failed or could not run."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, start_new_session=True)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def seconds(text):
    """Seconds in a Slurm duration (``minutes``, ``minutes:seconds``, ``hours:minutes:seconds``,
    ``days-hours[:minutes[:seconds]]``); ``None`` for ``UNLIMITED``, ``NOT_SET``, ``INVALID`` and the like."""
    days, _, rest = text.strip().rpartition("-")
    parts = rest.split(":")
    if not (days.isdigit() or days == "") or not all(part.isdigit() for part in parts) or len(parts) > 3:
        return None
    numbers = [int(part) for part in parts]
    if days:  # days-hours, days-hours:minutes, days-hours:minutes:seconds
        hours, minutes, secs = (numbers + [0, 0])[:3]
    else:  # minutes, minutes:seconds, hours:minutes:seconds
        hours, minutes, secs = ([0] * (3 - len(numbers)) + numbers) if len(numbers) != 1 else (0, numbers[0], 0)
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + secs


def duration(total):
    """*total* seconds as Slurm writes a duration: ``1:00``, ``1:02:03``, ``2-00:00:00``."""
    total = int(round(total))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours}:{minutes:02d}:{secs:02d}" if hours or days else f"{minutes}:{secs:02d}"
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}" if days else text


class SlurmJob:
    """The state of a submitted Slurm job, read with ``squeue``, ``sinfo`` and ``scontrol``."""

    def __init__(self, job_id):
        self.job_id = str(job_id)

    def state(self):
        """``(state, nodes or reason)``, e.g. ``("RUNNING", "vm")`` or ``("PENDING", "(Resources)")``;
        ``(None, "")`` once the job has left the queue; ``("UNKNOWN", "")`` when Slurm did not answer."""
        try:
            done = subprocess.run(["squeue", "-h", "-j", self.job_id, "-o", "%T|%R"], capture_output=True,
                                  text=True, timeout=30, start_new_session=True)
        except (OSError, subprocess.TimeoutExpired):
            return "UNKNOWN", ""
        line = done.stdout.strip()
        if done.returncode != 0 or not line:
            return None, ""
        state, _, where = line.partition("|")
        return state, where

    def time_left(self):
        """``(limit, left)`` in seconds while the job runs (``left`` is 0 once past the limit, before Slurm acts
        on it); ``(None, None)`` for a job without a limit, or when Slurm did not answer."""
        out = _run("squeue", "-h", "-j", self.job_id, "-o", "%l|%L", timeout=5)  # asked while cells run
        limit, _, left = (out or "").strip().partition("|")
        limit = seconds(limit) if limit else None
        if limit is None:
            return None, None
        left = seconds(left)
        return limit, 0 if left is None else left  # INVALID: over the limit, which slurmctld checks every 30 s

    def ended(self):
        """What ended the job, when Slurm ended it (``ENDED_BY_SLURM``): e.g. ``"Slurm ended job 12 at its time
        limit (1:00)"``; ``""`` while it runs, when it ended as its ranks did, or once Slurm forgot it."""
        out = _run("scontrol", "show", "job", "-o", self.job_id, timeout=10) or ""
        state = re.search(r"\bJobState=(\S+)", out)
        if state is None or state.group(1) not in ENDED_BY_SLURM:
            return ""
        limit = re.search(r"\bTimeLimit=(\S+)", out)
        limit = seconds(limit.group(1)) if limit else None
        return ENDED_BY_SLURM[state.group(1)].format(job=self.job_id, limit="?" if limit is None else duration(limit))

    def lost_nodes(self, nodes):
        """``{node: what Slurm says}`` for those of *nodes* Slurm has down, failing, or whose slurmd does not
        respond (``sinfo``'s state ends in ``*``), with the reason slurmctld or an administrator gave."""
        out = _run("sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%t|%E", timeout=5)
        lost = {}
        for line in (out or "").splitlines():
            node, _, rest = line.partition("|")
            state, _, reason = rest.partition("|")
            reason = "" if reason.strip() in ("", "none") else f": {reason.strip()}"
            if state.endswith("*"):
                lost[node] = f"Slurm says the slurmd of node {node} does not respond (state {state}){reason}"
            elif state.startswith(("down", "drain", "fail")):
                lost[node] = f"Slurm has node {node} {state}{reason}"
        return lost

    def nodes(self, nodelist):
        """The hosts of a Slurm *nodelist* (``node[01-03]``), expanded (``scontrol show hostnames``)."""
        return (_run("scontrol", "show", "hostnames", nodelist) or "").split()

    def wait_gone(self, timeout, *, unreachable=()):
        """Wait up to *timeout* s for the job to leave the queue; whether it did, or waits only on nodes that
        cannot end their part now: *unreachable* ones (the notebook heard nothing from their ranks), or those
        still completing that Slurm has lost. Slurm ends the job once it gives up on them (``SlurmdTimeout``, then
        ``KillWait``), srun on the other nodes waiting for them till then; nothing of the ranks runs there."""
        deadline = time.monotonic() + timeout
        asked = time.monotonic()
        while True:
            state, where = self.state()
            if state is None:
                return True
            if state == "COMPLETING" and unreachable:
                return True
            if state == "COMPLETING" and time.monotonic() - asked > 1.0:
                asked = time.monotonic()
                nodes = self.nodes(where)  # those still completing
                if nodes and set(nodes) <= set(self.lost_nodes(nodes)):
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)


class JobClock:
    """The time limit of a running *job* as the notebook sees it coming: read from Slurm at most every *every*
    seconds (a limit can be changed while the job runs: ``scontrol update``), counted here in between."""

    WARN_AT = 0.9  # the share of the limit gone when the notebook is warned, once

    def __init__(self, job, *, every=10.0):
        self.job, self.every = job, every
        self.read_at = self.ends_at = self.limit = None
        self.warned = False

    def left(self, now=None):
        """Seconds left before the limit (never below 0), or ``None`` when the job has none."""
        now = time.monotonic() if now is None else now
        if self.read_at is None or now - self.read_at >= self.every:
            self.limit, left = self.job.time_left()
            self.read_at, self.ends_at = now, None if left is None else now + left
        return None if self.ends_at is None else max(0.0, self.ends_at - now)

    def warning(self, now=None):
        """The warning once :data:`WARN_AT` of the limit is gone, the first time it is; else ``None``."""
        if self.warned:
            return None
        left = self.left(now)
        if left is None or not self.limit or left > (1 - self.WARN_AT) * self.limit:
            return None
        self.warned = True
        return (f"Slurm job {self.job.job_id} reaches its time limit ({duration(self.limit)}) in {duration(left)}: "
                "Slurm will then end every rank. Save what you need now; after that, %mpi restart starts a new job "
                "with every rank's variables as of the last cell they all finished (%mpi start --time for a longer "
                "limit)")

    def describe(self, now=None):
        """``"0:37 of 1:00 left"`` for ``%mpi status``; ``""`` without a limit."""
        left = self.left(now)
        return "" if left is None else f"{duration(left)} of {duration(self.limit)} left"
