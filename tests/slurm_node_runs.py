"""The notebook's side of a world started through Slurm on two nodes of the test hosts (tests/slurm_cluster.py's
SlurmNodes): tests/multihost_driver.py run on the controller's host with the steps given, and the check that the job
and its processes are gone afterwards."""

import json
import os
import sys

from multihost_runs import DRIVER
from waiting import wait_for


def notebook(cluster, steps, *, echo_stderr=False, **setup):
    """The command that runs the notebook's side on h0 with *steps*, its world started through Slurm on both nodes
    (*echo_stderr*: what the steps write to stderr goes to its own stderr as it is written); the environment it
    needs."""
    hosts, slurm = cluster
    config = {"setup": {"launcher": "slurm", "ip": hosts.addresses[0], "scheduler_args": ["--nodes=2"], **setup},
              "steps": steps, "echo_stderr": echo_stderr}
    return [sys.executable, str(DRIVER), json.dumps(config)], {**os.environ, **slurm.env, **hosts.mpi_env}


def parsed(stdout, stderr):
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the notebook's side printed no result:\n{stdout[-3000:]}\n{stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


def no_leftovers(cluster):
    """The queue empty, and no process on any host but Slurm's own daemons."""
    hosts, slurm = cluster
    wait_for(lambda: not slurm.squeue(), "the job to leave the queue", 60)
    for i in range(hosts.n):
        left = [pid for pid in hosts.pids_on(i) if pid not in slurm.daemon_pids()]
        assert left == [], f"processes left on {hosts.names[i]}: {left}"


def drive(cluster, steps, *, timeout=300, leftovers=True, stdin=None, **setup):
    """Run *steps* on h0 against a world started through Slurm on both nodes (*stdin*: what the user types at
    prompts); the parsed result."""
    hosts, _ = cluster
    command, env = notebook(cluster, steps, **setup)
    done = hosts.output(0, command, timeout=timeout, env=env, input=stdin)
    result = parsed(done.stdout, done.stderr)
    if leftovers:
        no_leftovers(cluster)
    return result
