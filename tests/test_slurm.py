"""Worlds started through a real Slurm (``tests/slurm_cluster.py``: munged, slurmctld and slurmd on this host)."""

import json
import os
import socket
import stat

import psutil
import pytest
from conftest import leftover_ranks, new_world_tag
from IPython.core.error import UsageError
from slurm_cluster import SlurmCluster
from training import TRAINING, export, final_loss, training_notebook
from waiting import wait_for

from mpinb.errors import MPIError
from mpinb.wire.channel import reachable_address

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]


@pytest.fixture(scope="module")
def slurm():
    with SlurmCluster() as cluster:
        saved = {name: os.environ.get(name) for name in cluster.env}
        os.environ.update(cluster.env)
        try:
            yield cluster
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        daemons = cluster.daemon_pids()
    assert not [pid for pid in daemons if psutil.pid_exists(pid)], "a Slurm daemon outlived the tests"
    assert not cluster.steps_left, f"job steps outlived the tests: {cluster.steps_left}"


def listening_addresses(pid):
    """The addresses a process listens on (TCP)."""
    return {c.laddr.ip for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def test_a_world_in_a_slurm_job(ip, magics, mpi, slurm, no_world, capsys):
    tag = new_world_tag()
    ip.run_line_magic("mpi", "start -n 2 --launcher slurm --partition debug --time 00:10:00 "
                             "--scheduler-arg=--comment=mpinb-test")
    world = magics.world
    job = world.job_id()
    [(queued, name, state)] = slurm.squeue()
    assert (queued, state) == (job, "RUNNING") and name.startswith("mpinb-")
    details = slurm.command("scontrol", "show", "job", job)
    assert "NumTasks=2" in details and "Partition=debug" in details and "TimeLimit=00:10:00" in details
    assert "Comment=mpinb-test" in details

    # every rank runs inside the job, and the ranks still form one MPI world
    values = mpi("import os\n"
                 "slurm = {k: v for k, v in os.environ.items() if k.startswith('SLURM_')}\n"
                 "total = comm.allreduce(rank + 1)", "--gather slurm total")
    assert values is None
    slurm_env, total = ip.user_ns["slurm"], ip.user_ns["total"]
    assert dict(total) == {0: 3, 1: 3}
    for rank in (0, 1):
        assert slurm_env[rank]["SLURM_JOB_ID"] == job
        assert slurm_env[rank]["SLURM_JOB_PARTITION"] == "debug"
        assert slurm_env[rank]["SLURM_JOB_NODELIST"] == slurm.host
        assert "SLURM_STEP_ID" in slurm_env[rank]  # started as a job step (mpiexec bootstraps with srun)

    # the rank -> host mapping, and the job, in %mpi status
    ip.run_line_magic("mpi", "status")
    out = capsys.readouterr().out
    assert f"in Slurm job {job} (partition debug, time 00:10:00)" in out
    assert f"{socket.gethostname()}: ranks 0-1" in out

    # the controller and the cell channel stay on loopback unless --ip says otherwise; files are owner-only
    controller = world.cluster.controller.process.pid
    assert listening_addresses(controller) == {"127.0.0.1"}
    assert world.channel.cells_url.startswith("tcp://127.0.0.1:")
    security = os.path.join(world.cluster.profile_dir, "security")
    files = [os.path.join(security, f) for f in os.listdir(security) if world.cluster.cluster_id in f]
    assert len(files) == 2
    for path in files:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
        assert json.load(open(path))["key"]  # messages are signed with the world's key
    ranks = [world.identities[rank]["pid"] for rank in world.ranks]

    ip.run_line_magic("mpi", "stop")
    assert slurm.squeue() == []  # %mpi stop cancelled the job
    assert not [pid for pid in ranks if psutil.pid_exists(pid)]
    assert leftover_ranks(tag) == []
    assert not [f for f in files if os.path.exists(f)]


def test_controller_beyond_loopback_only_when_asked(ip, magics, mpi, slurm, no_world):
    address = reachable_address()
    assert not address.startswith("127.")
    ip.run_line_magic("mpi", f"start -n 2 --launcher slurm --ip {address}")
    world = magics.world
    assert listening_addresses(world.cluster.controller.process.pid) == {address}
    assert world.channel.cells_url.startswith(f"tcp://{address}:")
    assert mpi("comm.allreduce(rank)") == {0: 1, 1: 1}
    ip.run_line_magic("mpi", "stop")
    assert slurm.squeue() == []


def test_srun_in_place_of_mpiexec(ip, magics, mpi, slurm, no_world):
    """srun --mpi=pmi2 starts the ranks itself (Slurm's PMI); they still form one world, one task each."""
    ip.run_line_magic("mpi", "start -n 2 --launcher slurm --mpiexec srun --mpiexec-arg=--mpi=pmi2")
    assert mpi("import os\n(comm.allreduce(rank), os.environ['SLURM_PROCID'])") == {0: (1, "0"), 1: (1, "1")}
    ip.run_line_magic("mpi", "stop")
    assert slurm.squeue() == []


def test_srun_with_an_mpi_plugin_slurm_lacks_says_how_to_list_them(ip, magics, slurm, no_world):
    with pytest.raises(MPIError, match=r"ended before every rank registered: srun has no such --mpi plugin: "
                                       r"srun --mpi=list lists those this Slurm has; its output:\n"
                                       r"(.|\n)*Invalid MPI type 'nosuch'"):
        ip.run_line_magic("mpi", "start -n 2 --launcher slurm --mpiexec srun --mpiexec-arg=--mpi=nosuch")
    assert slurm.squeue() == []


def test_a_job_the_scheduler_refuses_says_why_and_leaves_nothing(ip, magics, slurm, no_world):
    tag = new_world_tag()
    with pytest.raises(UsageError, match="sbatch refused the job: sbatch: error: invalid partition specified: nosuch"):
        ip.run_line_magic("mpi", "start -n 2 --launcher slurm --partition nosuch")
    assert magics.world is None or not magics.world.running
    assert slurm.squeue() == []
    assert leftover_ranks(tag) == []


def test_a_job_larger_than_the_cluster_is_refused(ip, magics, slurm, no_world):
    # sbatch accepts it, and it would wait in the queue for ever
    with pytest.raises(UsageError, match=r"Slurm will not run job \d+ as asked \(PartitionConfig\): the partition "
                                         "cannot give that many tasks"):
        ip.run_line_magic("mpi", "start -n 64 --launcher slurm")
    assert slurm.squeue() == []


@pytest.mark.parametrize("reason, never", [
    ("QOSMaxCpuPerJobLimit", "more than the job's QOS allows one job"),
    ("QOSMaxWallDurationPerJobLimit", "more than the job's QOS allows one job"),
    ("AssocMaxNodePerJobLimit", "more than the account allows one job"),
    ("QOSMinCpuNotSatisfied", "more than the job's QOS allows one job"),
    ("PartitionTimeLimit", "a longer --time than the partition allows"),
    ("QOSMaxCpuPerUserLimit", None), ("QOSGrpCpuLimit", None), ("Priority", None), ("Resources", None),
])
def test_a_pending_reason_is_read_as_never_or_not_yet(reason, never):
    """Reasons a job waits for: over a limit on each job (of its QOS or account) it never runs, and the start
    says so at once; over a limit per user or group, or behind other jobs, it waits (the test cluster has no
    accounting database, so no QOS to put a job over)."""
    from mpinb.notebook.world.launchers.slurm import never_runs

    said = never_runs(reason)
    assert said == never if never is None else never in said


def test_scheduler_options_need_a_batch_launcher(ip, no_world):
    with pytest.raises(UsageError, match="partition only mean something to a batch launcher"):
        ip.run_line_magic("mpi", "start -n 2 --partition debug")
    with pytest.raises(UsageError, match="one by one"):
        ip.run_line_magic("mpi", "start -n 2 --launcher local")
    with pytest.raises(UsageError, match="unknown launcher 'slurmm'; choose one of: mpi, ssh, slurm"):
        ip.run_line_magic("mpi", "start -n 2 --launcher slurmm")
    with pytest.raises(UsageError, match="--launcher ssh needs --hostfile"):
        ip.run_line_magic("mpi", "start -n 2 --launcher ssh")


def test_an_exported_notebook_runs_as_a_slurm_job_with_the_same_loss(ip, magics, mpi, slurm, no_world, tmp_path):
    """The training notebook's cells through a Slurm-launched world, then its export submitted with sbatch."""
    ip.run_line_magic("mpi", "start -n 2 --launcher slurm")
    for cell in TRAINING:
        first, _, body = cell.source.partition("\n")
        if first.startswith("%%mpi"):
            mpi(body, first[len("%%mpi"):].strip())
    in_notebook = ip.user_ns["final"][0]
    ip.run_line_magic("mpi", "stop")

    notebook = training_notebook(tmp_path / "train.ipynb")
    done = export(notebook, "-o", str(tmp_path / "train.py"), "--sbatch", str(tmp_path / "train.sbatch"),
                  "--partition", "debug", "--time", "00:05:00")
    assert done.returncode == 0, done.stderr
    job = slurm.command("sbatch", "--parsable", f"--chdir={tmp_path}", str(tmp_path / "train.sbatch")).strip()
    assert job.isdigit()
    wait_for(lambda: not slurm.squeue(), "the exported job to end", 120, 0.2)
    output = (tmp_path / f"train-{job}.out").read_text()
    assert final_loss(output) == in_notebook, output


def test_a_killed_kernel_leaves_no_job_in_the_queue(slurm):
    """SIGKILL the kernel (no atexit, no %mpi stop): its watcher cancels the job."""
    from jupyter_client import KernelManager

    manager = KernelManager(kernel_name="python3")
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    outputs = []
    try:
        client.wait_for_ready(timeout=60)
        reply = client.execute_interactive(
            "%load_ext mpinb\n%mpi start -n 2 --launcher slurm\n"
            "world = get_ipython().magics_manager.registry['MPIMagics'].world\n"
            "print('JOB', world.job_id(), *[world.identities[r]['pid'] for r in world.ranks])",
            timeout=120, output_hook=outputs.append)
        assert reply["content"]["status"] == "ok"
    finally:
        client.stop_channels()
    text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
    job, *ranks = text.split("JOB", 1)[1].split()
    assert [queued for queued, *_ in slurm.squeue()] == [job]
    manager.shutdown_kernel(now=True)  # SIGKILL
    wait_for(lambda: not slurm.squeue(), "the killed kernel's job to leave the queue", 30, 0.2)
    assert "JobState=CANCELLED" in slurm.command("scontrol", "show", "job", job)  # not ended by its ranks dying
    _, alive = psutil.wait_procs([psutil.Process(int(pid)) for pid in ranks if psutil.pid_exists(int(pid))],
                                 timeout=10)
    assert not alive


def test_time_in_the_queue_does_not_count_against_start_timeout(ip, magics, mpi, slurm, no_world, monkeypatch):
    # a job that takes the whole node for 6 s
    blocker = slurm.command("sbatch", "--parsable", "-n", "4", "--output=/dev/null", "--wrap", "sleep 6").strip()
    monkeypatch.setattr(magics, "start_timeout", 4.0)
    # the blocker holds the node: ours queues behind it for the rest of its 6 s
    wait_for(lambda: "RUNNING" in [state for job, _, state in slurm.squeue() if job == blocker], "the blocker running",
             60, 0.1)
    ip.run_line_magic("mpi", "start -n 2 --launcher slurm")
    assert mpi("rank") == {0: 0, 1: 1}
    ip.run_line_magic("mpi", "stop")
    assert blocker not in [job for job, *_ in slurm.squeue()]


def test_interrupting_a_queued_start_cancels_the_job(ip, magics, slurm, no_world):
    import _thread
    import threading

    blocker = slurm.command("sbatch", "--parsable", "-n", "4", "--output=/dev/null", "--wrap", "sleep 60").strip()
    timer = threading.Timer(3, _thread.interrupt_main)  # what the kernel's Stop button does
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ip.run_line_magic("mpi", "start -n 2 --launcher slurm")
    finally:
        timer.cancel()
    assert [job for job, *_ in slurm.squeue()] == [blocker]  # ours was cancelled; the blocker is not ours
    slurm.command("scancel", blocker)
