"""Slurm across nodes, for real: slurmctld on the notebook's host (h0) and a slurmd on each of two other test hosts
(network namespaces, ``tests/hosts.py``), and ``%mpi start --launcher slurm`` placing ranks on both nodes: MPICH's
Hydra inside the job starts its proxies on the nodes through srun, and the ranks reach the notebook on h0.

Each test runs the notebook's side on h0 (``tests/multihost_driver.py``) and afterwards finds the queue empty and
no process of the world on any host."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hosts import Hosts, wait_for
from slurm_cluster import SlurmNodes

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.slurm, pytest.mark.hosts, pytest.mark.timeout(600)]

DRIVER = Path(__file__).with_name("multihost_driver.py")


@pytest.fixture(scope="module")
def cluster():
    with Hosts(3) as hosts, SlurmNodes(hosts, controller=0, nodes=(1, 2)) as slurm:
        yield hosts, slurm


def drive(cluster, steps, *, timeout=300, leftovers=True, **setup):
    """Run *steps* on h0 against a world started through Slurm on both nodes; the parsed result."""
    hosts, slurm = cluster
    config = {"setup": {"launcher": "slurm", "ip": hosts.addresses[0], "scheduler_args": ["--nodes=2"], **setup},
              "steps": steps}
    done = hosts.output(0, [sys.executable, str(DRIVER), json.dumps(config)], timeout=timeout,
                        env={**os.environ, **slurm.env, **hosts.mpi_env})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the notebook's side printed no result:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    if leftovers:
        wait_for(lambda: not slurm.squeue(), "the job to leave the queue", 60)
        for i in range(hosts.n):
            left = [pid for pid in hosts.pids_on(i) if pid not in slurm.daemon_pids()]
            assert left == [], f"processes left on {hosts.names[i]}: {left}"
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_a_world_spans_two_slurm_nodes_and_every_feature_works_there(cluster):
    hosts, _ = cluster
    h1, h2 = hosts.names[1], hosts.names[2]
    result = drive(cluster, [
        ["line", "start -n 4"],
        ["cell", "", "import socket\nprint(socket.gethostname())"],
        ["cell", "", "if rank == 3:\n    raise ValueError(f'bad batch on {socket.gethostname()}')\ncomm.Barrier()"],
        ["cell", "--gather x", "import numpy as np\nx = np.arange(1 << 18, dtype=np.float64) * (rank + 1)"],
        ["eval", "[bool((x[r] == __import__('numpy').arange(1 << 18) * (r + 1)).all()) for r in sorted(x)]"],
        ["cell", "", "import mpinb\nfor step in range(20):\n    mpinb.report(step=step, loss=1.0 / (step + 1))"],
        ["cell", "", "kept = rank * 10"],
        ["cell", "--timeout 3", "import time\ntime.sleep(100)"],
        ["cell", "", "kept"],
        ["cell", "--trace", "for i in range(5):\n    comm.allreduce(i)"],
        ["line", "status"],
    ])
    start, hello, failing, gather, exact, report, _, timed_out, kept, traced, status = result["steps"]
    assert start["raised"] is None, start
    assert sorted(hello["stdout"].splitlines()) == [f"[rank 0] {h1}", f"[rank 1] {h1}", f"[rank 2] {h2}",
                                                     f"[rank 3] {h2}"], hello
    assert failing["raised"][0] == "RankError" and f"rank 3: ValueError: bad batch on {h2}" in failing["raised"][1]
    assert gather["raised"] is None and exact["value"] == "[True, True, True, True]", (gather, exact)
    assert report["raised"] is None and result["history"] == 4 * 20
    name, text = timed_out["raised"]
    assert name == "RankError" and "Timeout: still running after 3 s" in text, text
    assert kept["raised"] is None and kept["value"] == {"0": "0", "1": "10", "2": "20", "3": "30"}, kept
    assert traced["raised"] is None, traced
    assert "in Slurm job" in status["stdout"] and f"{h1}: ranks 0-1; {h2}: ranks 2-3" in status["stdout"], status
    assert result["hosts"] == {h1: [0, 1], h2: [2, 3]}


def test_a_node_cut_off_mid_cell_is_named_with_its_ranks_and_the_notebook_goes_on(cluster):
    hosts, slurm = cluster
    pull = f"__import__('subprocess').run(['ip', '-n', {hosts.switch!r}, 'link', 'set', 'p2', 'down']).returncode"
    try:
        result = drive(cluster, [
            ["line", "start -n 4"],
            ["eval", pull],
            ["cell", "--timeout 60", "import time\ncomm.Barrier()\ntime.sleep(100)"],
            ["line", "status"],
        ], leftovers=False)
    finally:
        hosts.link_up(2)
    wait_for(lambda: not slurm.squeue(), "the job to leave the queue", 120)
    start, pulled, cut, status = result["steps"]
    assert start["raised"] is None and pulled["value"] == "0", (start, pulled)
    name, text = cut["raised"]
    assert name == "RankError" and "Timeout" not in text, text
    h2 = hosts.names[2]
    # whichever comes first: the hub misses the ranks' heartbeats, or Slurm misses the node's slurmd
    assert (f"its engine on {h2} stopped answering ipyparallel's heartbeats" in text or
            f"its node {h2} was lost: Slurm says the slurmd of node {h2} does not respond" in text), text
    assert f"its engine on {h2} stopped answering ipyparallel's heartbeats too" in text or \
        f"its node {h2} was lost too" in text, text
    assert status["raised"] is None, status


def test_a_node_whose_slurmd_dies_mid_cell_is_named_with_its_ranks_and_what_slurm_says(cluster):
    """slurmd on h2 is killed while the cell runs: Slurm marks the node down and ends the job; the cell fails
    naming h2, both its ranks, and what Slurm says of the node."""
    hosts, slurm = cluster
    mark = slurm.root / "running"
    code = f"import time\nopen({str(mark)!r}, 'w').close()\ncomm.Barrier()\ntime.sleep(120)"

    def kill_when_running():
        wait_for(mark.exists, "the cell running", 120)
        slurm.kill_slurmd(hosts.names[2])

    killer = threading.Thread(target=kill_when_running, daemon=True)
    killer.start()
    try:
        result = drive(cluster, [["line", "start -n 4"], ["cell", "--timeout 150", code], ["line", "status"]],
                       leftovers=False)
    finally:
        killer.join(timeout=5)
        slurm.restart_slurmd(hosts.names[2])
    start, cut, status = result["steps"]
    assert start["raised"] is None, start
    name, text = cut["raised"]
    h2 = hosts.names[2]
    assert name == "RankError" and "Timeout" not in text, text
    assert f"its node {h2} was lost: Slurm says the slurmd of node {h2} does not respond" in text, text
    assert f"died: its node {h2} was lost too" in text, text
    assert "dead" in status["stdout"], status


def test_srun_starts_the_ranks_on_both_nodes_through_slurms_pmi(cluster):
    """srun --mpi=pmi2 in place of mpiexec: Slurm's PMI wires the world across the nodes, one task each."""
    hosts, _ = cluster
    result = drive(cluster, [
        ["line", "start -n 4"],
        ["cell", "", "import os, socket\n"
                     "print(comm.allreduce(rank), os.environ['SLURM_PROCID'], socket.gethostname())"],
    ], mpiexec="srun", mpiexec_args=["--mpi=pmi2"])
    start, hello = result["steps"]
    assert start["raised"] is None, start
    h1, h2 = hosts.names[1], hosts.names[2]
    assert sorted(hello["stdout"].splitlines()) == [f"[rank 0] 6 0 {h1}", f"[rank 1] 6 1 {h1}",
                                                     f"[rank 2] 6 2 {h2}", f"[rank 3] 6 3 {h2}"], hello


def test_an_exported_notebook_runs_across_both_nodes_as_a_slurm_job_with_the_same_loss(cluster, tmp_path):
    """The training notebook's export (``mpinb export --sbatch``) submitted across the two nodes gives the loss
    the same script gives under plain mpiexec here (which is the notebook's: ``test_export.py``)."""
    from test_export import export, final_loss, training_notebook

    from mpinb.notebook.mpis import default_mpiexec

    hosts, slurm = cluster
    notebook = training_notebook(tmp_path / "train.ipynb")
    done = export(notebook, "-o", str(tmp_path / "train.py"), "--sbatch", str(tmp_path / "train.sbatch"))
    assert done.returncode == 0, done.stderr
    here = subprocess.run([default_mpiexec(), "-n", "2", sys.executable, "train.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert here.returncode == 0, here.stderr
    job = slurm.command("sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", f"--chdir={tmp_path}",
                        str(tmp_path / "train.sbatch")).strip()
    assert job.isdigit(), job
    wait_for(lambda: not slurm.squeue(), "the exported job to end", 180)
    output = (tmp_path / f"train-{job}.out").read_text()
    assert final_loss(output) == final_loss(here.stdout), output
    assert "rank 1 of 2 says goodbye" in output
