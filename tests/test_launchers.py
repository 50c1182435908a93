"""Launchers other than plain mpiexec here: the ssh launcher and hostfiles, and the job scripts of the batch
launchers (Slurm itself is exercised in test_slurm.py)."""

import os
import socket
import sys

import pytest
from conftest import leftover_ranks, new_world_tag
from IPython.core.error import UsageError
from traitlets.config import Config

from mpinb.notebook.world.launchers import SCHEDULERS, Placement


@pytest.mark.mpi
@pytest.mark.slow
def test_ssh_launcher_starts_the_ranks_of_a_hostfile(ip, magics, mpi, no_world, tmp_path, capsys):
    tag = new_world_tag()
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost:2\n")  # mpiexec starts ranks for this host without ssh
    ip.run_line_magic("mpi", f"start -n 2 --launcher ssh --hostfile {hostfile}")
    assert mpi("comm.allreduce(rank)") == {0: 1, 1: 1}
    ip.run_line_magic("mpi", "status")
    out = capsys.readouterr().out
    assert f"on hosts from {hostfile}" in out and f"{socket.gethostname()}: ranks 0-1" in out
    ip.run_line_magic("mpi", "stop")
    assert leftover_ranks(tag) == []


def test_remote_hosts_need_an_address_they_can_reach(ip, no_world, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a.invalid:4\nnode-b.invalid:4\n")
    with pytest.raises(UsageError, match="ranks on node-a.invalid, node-b.invalid cannot reach a controller that "
                                         "listens on 127.0.0.1: add --ip"):
        ip.run_line_magic("mpi", f"start -n 8 --hostfile {hostfile}")


def test_a_missing_hostfile_or_scheduler_is_named(ip, no_world, tmp_path):
    with pytest.raises(UsageError, match="hostfile not found: .*nowhere"):
        ip.run_line_magic("mpi", f"start -n 2 --hostfile {tmp_path / 'nowhere'}")
    os.environ["PATH"], saved = "/nonexistent", os.environ["PATH"]
    try:
        with pytest.raises(UsageError, match="bsub not found: --launcher lsf submits with it"):
            ip.run_line_magic("mpi", "start -n 2 --launcher lsf")
    finally:
        os.environ["PATH"] = saved


@pytest.mark.parametrize("launcher", sorted(SCHEDULERS))
def test_job_scripts_ask_for_n_tasks_and_run_one_mpiexec(launcher, tmp_path):
    """The script ipyparallel's own launcher writes from mpinb's template (what qsub or bsub would get)."""
    placement = Placement(launcher=launcher, partition="short", time="01:00:00", account="proj{1}",
                          scheduler_args=["--mem=4G"])
    config = Config()
    cls = placement.start().configure(config, mpiexec="/opt/mpi/bin/mpiexec", mpiexec_args=["-bind-to", "core"],
                                      engine_cmd=[sys.executable, "-m", "mpinb.rank.launch"], environment={},
                                      workdir=str(tmp_path))
    launcher_ = cls(config=config, cluster_id="abc", profile_dir=str(tmp_path))
    launcher_.write_batch_script(3)
    script = open(launcher_.batch_file).read()
    s = SCHEDULERS[launcher]
    assert launcher_.batch_file == str(tmp_path / "job.sh")
    assert script.startswith("#!/bin/sh\n")
    assert f"{s.prefix} {s.tasks.format(n=3)}\n" in script
    assert f"{s.prefix} {s.queue.format('short')}\n" in script
    assert f"{s.prefix} {s.time.format('01:00:00')}\n" in script
    assert f"{s.prefix} {s.account.format('proj{1}')}\n" in script
    assert f"{s.prefix} --mem=4G\n" in script
    last = script.strip().splitlines()[-1]
    assert last.startswith("exec /opt/mpi/bin/mpiexec -n 3 -bind-to core ")
    # (ipyparallel's Cluster adds --profile-dir and --cluster-id to the engine's arguments)
    assert last == f"exec /opt/mpi/bin/mpiexec -n 3 -bind-to core {sys.executable} -m mpinb.rank.launch"
