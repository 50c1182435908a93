"""Slurm across nodes, for real: slurmctld on the notebook's host (h0) and a slurmd on each of two other test hosts
(network namespaces, ``tests/hosts.py``), and ``%mpi start --launcher slurm`` placing ranks on both nodes: MPICH's
Hydra inside the job starts its proxies on the nodes through srun, and the ranks reach the notebook on h0.

Each test runs the notebook's side on h0 (``tests/multihost_driver.py``) and afterwards finds the queue empty and
no process of the world on any host."""

import codecs
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hosts import Hosts
from slurm_cluster import SlurmNodes
from slurm_node_runs import drive, no_leftovers, notebook, parsed
from waiting import wait_for

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.slurm, pytest.mark.hosts, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cluster():
    with Hosts(3) as hosts, SlurmNodes(hosts, controller=0, nodes=(1, 2)) as slurm:
        yield hosts, slurm


class Streamed:
    """What a process writes to *pipe*, read as it comes by a thread of its own (:attr:`text`: all of it so far)."""

    def __init__(self, pipe):
        self.parts, self.decoder = [], codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.thread = threading.Thread(target=self._read, args=(pipe.fileno(),), daemon=True)
        self.thread.start()

    def _read(self, fd):
        while chunk := os.read(fd, 1 << 16):
            self.parts.append(self.decoder.decode(chunk))

    @property
    def text(self):
        return "".join(self.parts)


def test_a_world_spans_two_slurm_nodes_and_every_feature_works_there(cluster):
    hosts, _ = cluster
    h1, h2 = hosts.names[1], hosts.names[2]
    result = drive(cluster, [
        ["line", "start -n 4"],
        ["cell", "", "import socket\nprint(socket.gethostname())"],
        ["cell", "", "if rank == 3:\n    raise ValueError(f'bad batch on {socket.gethostname()}')\ncomm.Barrier()"],
        ["line", "debug 3"],
        ["cell", "--gather x", "import numpy as np\nx = np.arange(1 << 18, dtype=np.float64) * (rank + 1)"],
        ["eval", "[bool((x[r] == __import__('numpy').arange(1 << 18) * (r + 1)).all()) for r in sorted(x)]"],
        ["cell", "", "import mpinb\nfor step in range(20):\n    mpinb.report(step=step, loss=1.0 / (step + 1))"],
        ["cell", "", "kept = rank * 10"],
        ["cell", "--timeout 3", "import time\ntime.sleep(100)"],
        ["cell", "", "kept"],
        ["cell", "--trace", "for i in range(5):\n    comm.allreduce(i)"],
        ["line", "status"],
    ], stdin="p (rank, socket.gethostname())\nq\n")
    start, hello, failing, post_mortem, gather, exact, report, _, timed_out, kept, traced, status = result["steps"]
    assert start["raised"] is None, start
    assert sorted(hello["stdout"].splitlines()) == [f"[rank 0] {h1}", f"[rank 1] {h1}", f"[rank 2] {h2}",
                                                     f"[rank 3] {h2}"], hello
    assert failing["raised"][0] == "RankError" and f"rank 3: ValueError: bad batch on {h2}" in failing["raised"][1]
    # pdb on rank 3, on h2, in the frame that raised; its prompt answered here
    assert post_mortem["raised"] is None and f"(3, '{h2}')" in post_mortem["stdout"], post_mortem
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
            ["line", "stop"],
        ], leftovers=False)
    finally:
        hosts.link_up(2)
    no_leftovers(cluster)  # once the node is back, Slurm ends what was left of the job there
    start, pulled, cut, status, stop = result["steps"]
    # stop ended what it could reach and did not wait for the cut-off node's part of the job, which Slurm ends
    assert stop["raised"] is None and "still in the queue" not in stop["stderr"], stop
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


def test_a_job_near_its_time_limit_is_warned_ended_at_it_said_so_and_a_restart_puts_the_variables_back(cluster):
    """A one-minute job (Slurm's shortest): the notebook says at 90% of it that the limit is near, while a cell
    runs; at the limit (slurmctld acts on it within 30 s) the cell fails saying Slurm ended the job there, and
    ``%mpi restart`` starts a new job with every rank's variables back."""
    result = drive(cluster, [
        ["line", "start -n 4"],
        ["cell", "", "import numpy as np\nkept = np.arange(3.0) + rank"],
        ["line", "status"],
        ["cell", "--timeout 240", "import time\ntime.sleep(300)"],
        ["line", "restart"],
        ["cell", "", "print(kept.tolist())"],
    ], time_limit="1", snapshot_lag=0.0)
    start, made, status, limited, restart, check = result["steps"]
    assert start["raised"] is None and made["raised"] is None, (start, made)
    assert re.search(r"Slurm job \d+ \(time 1\), 0:[0-5]\d of 1:00 left", status["stdout"]), status
    warned = re.search(r"\[mpinb\] Slurm job (\d+) reaches its time limit \(1:00\) in 0:0\d: Slurm will then end "
                       r"every rank", limited["stderr"])
    assert warned, limited
    name, text = limited["raised"]
    assert name == "RankError" and "Timeout" not in text, text
    assert f"ranks 0-3: RankLost: Slurm ended job {warned.group(1)} at its time limit (1:00), and every rank " \
           "with it" in text, text
    assert restart["raised"] is None and "restored every rank's variables" in restart["stdout"], restart
    assert sorted(check["stdout"].splitlines()) == [f"[rank {r}] [{r}.0, {r + 1}.0, {r + 2}.0]" for r in range(4)]


# what the start says while its job waits behind another
PENDING = re.compile(r"Slurm job \d+ pending \((Resources|Priority|Nodes required for job are DOWN[^)]*)\)")


def test_stop_cancels_a_start_queued_behind_another_job_and_interrupts_a_cell_on_both_nodes(cluster):
    """A job holding node h2 keeps ours in the queue: the start says Slurm's reason while it waits, and Stop
    cancels it, leaving the other job alone. Started again once the node is free, Stop while every rank runs
    Python interrupts the ranks on both nodes and keeps the world."""
    hosts, slurm = cluster
    h2 = hosts.names[2]
    blocker = slurm.command("sbatch", "--parsable", "-w", h2, "--exclusive", "--output=/dev/null",
                            "--wrap", "sleep 300").strip()
    marks = [slurm.root / f"looping-{rank}" for rank in range(4)]
    for mark in marks:
        mark.unlink(missing_ok=True)
    loop = (f"import time\nopen({str(slurm.root)!r} + f'/looping-{{rank}}', 'w').close()\nwhile True:\n"
            "    time.sleep(0.05)")
    steps = [["line", "start -n 4"], ["line", "start -n 4"], ["cell", "", "kept = rank * 10"], ["cell", "", loop],
             ["cell", "", "comm.allreduce(kept)"]]
    command, env = notebook(cluster, steps, echo_stderr=True)
    process = hosts.run(0, command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = Streamed(process.stdout), Streamed(process.stderr)
    try:
        # the start says why its job waits once it asked squeue (every 0.5 s) after the job queued
        wait_for(lambda: PENDING.search(err.text), "the start saying why its job waits in the queue", 120)
        process.send_signal(signal.SIGINT)  # what the Stop button sends the kernel
        wait_for(lambda: [job for job, *_ in slurm.squeue()] == [blocker], "the queued job cancelled", 60)
        slurm.command("scancel", blocker)
        wait_for(lambda: all(mark.exists() for mark in marks), "the looping cell running on every rank", 180)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=240)
        out.thread.join(timeout=10)
        err.thread.join(timeout=10)
    finally:
        process.kill()
        slurm.command("scancel", blocker)
    queued, start, _, looping, after = parsed(out.text, err.text)["steps"]
    name, text = queued["raised"]
    assert name == "StartInterrupted" and "no world is running" in text, queued
    assert PENDING.search(queued["stderr"]), queued
    assert start["raised"] is None, start
    name, text = looping["raised"]
    assert name == "Interrupted" and "ranks 0-3: KeyboardInterrupt: interrupted" in text, looping
    assert after["raised"] is None and after["value"] == {str(r): "60" for r in range(4)}, after
    no_leftovers(cluster)


OPENMPI = "/usr/bin/mpiexec.openmpi"  # Debian's openmpi-bin (make mpis)
# Open MPI between the test hosts: TCP on eth0 (they share one kernel, so not its shared-memory transport)
OPENMPI_ENV = {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,self", "OMPI_MCA_btl_tcp_if_include": "eth0",
               "OMPI_MCA_oob_tcp_if_include": "eth0"}


@pytest.mark.parametrize("how", ["MPICH, srun --mpi=pmi2", "Open MPI, srun --mpi=pmix", "Open MPI, its mpiexec"])
def test_each_mpi_starts_its_ranks_on_both_nodes_through_slurm(cluster, how, monkeypatch):
    """srun in place of mpiexec, Slurm's PMI wiring the world across the nodes (PMI-2 for MPICH, PMIx for Open
    MPI), one task each; or Open MPI's own mpiexec inside the job, which starts its daemons on the nodes with
    srun. Each world runs a collective, gathers exactly, and names the rank killed on the other node."""
    hosts, _ = cluster
    setup = {"mpiexec": "srun", "mpiexec_args": ["--mpi=pmi2"]}
    if how.startswith("Open MPI"):
        if not Path(OPENMPI).exists():
            if os.environ.get("MPINB_TEST_ALL_MPIS"):
                pytest.fail(f"{OPENMPI} is missing: make mpis installs it (Debian's openmpi-bin)")
            pytest.skip(f"{OPENMPI} is missing: make mpis installs it")
        for name, value in OPENMPI_ENV.items():
            monkeypatch.setenv(name, value)
        setup = ({"default_mpi": "openmpi", "mpiexec": "srun", "mpiexec_args": ["--mpi=pmix"]} if "srun" in how else
                 {"default_mpi": "openmpi", "mpiexec": OPENMPI})
    result = drive(cluster, [
        ["line", "start -n 4"],
        ["cell", "", "import os, socket\n"
                     "print(comm.allreduce(rank), os.environ.get('SLURM_PROCID'), socket.gethostname())"],
        ["cell", "--gather x", "import numpy as np\nx = np.arange(1 << 16, dtype=np.float64) * (rank + 1)"],
        ["eval", "[bool((x[r] == __import__('numpy').arange(1 << 16) * (r + 1)).all()) for r in sorted(x)]"],
        ["cell", "--timeout 120", "import os, time\nif rank == 3:\n    time.sleep(1)\n    os.kill(os.getpid(), 9)\n"
                                  "time.sleep(100)"],
    ], **setup)
    start, hello, gather, exact, killed = result["steps"]
    assert start["raised"] is None and how.split(",")[0] in start["stdout"], start
    h1, h2 = hosts.names[1], hosts.names[2]
    # srun starts each rank as a task of its own (SLURM_PROCID is the rank); Open MPI's mpiexec starts one daemon
    # per node with srun, and the ranks under them
    tasks = [str(r) for r in range(4)] if "srun" in how else ["0"] * 4
    assert sorted(hello["stdout"].splitlines()) == [f"[rank {r}] 6 {tasks[r]} {host}" for r, host in
                                                     enumerate([h1, h1, h2, h2])], hello
    assert gather["raised"] is None and exact["value"] == "[True, True, True, True]", (gather, exact)
    name, text = killed["raised"]
    assert name == "RankError" and "Timeout" not in text, killed
    assert text.splitlines()[1].startswith(f"rank 3: RankLost: rank 3 died: its "), text
    assert h2 in text.splitlines()[1], text


def test_an_exported_notebook_runs_across_both_nodes_as_a_slurm_job_with_the_same_loss(cluster, tmp_path):
    """The training notebook's export (``mpinb export --sbatch``) submitted across the two nodes gives the loss
    the same script gives under plain mpiexec here (which is the notebook's: ``test_export.py``)."""
    from training import export, final_loss, training_notebook

    from mpinb.notebook.world.mpis import default_mpiexec

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
