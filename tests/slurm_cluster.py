"""A real single-node Slurm on this machine for the tests: ``munged``, ``slurmctld`` and ``slurmd`` started as
processes the tests own, configured in a directory of their own, and stopped by pid.

Debian's ``slurm-wlm`` and ``munge`` are installed first when missing (through sudo when not root). Nothing
in /etc or /run is used: the munge key and socket, Slurm's state, spool, logs and pid files all live in the
cluster's directory, and every Slurm command finds the configuration through ``SLURM_CONF``.
"""

import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from waiting import wait_for

PACKAGES = ("slurm-wlm", "munge", "libpmix-dev")  # libpmix-dev: the libpmix.so Slurm's pmix plugin loads
PMIX = "/usr/lib/*/pmix2/lib/libpmix.so"  # where Debian's libpmix-dev puts it
SBIN = "/usr/sbin:/sbin"

SLURM_CONF = """\
ClusterName=mpinb-test
# job ids unlike any earlier cluster's: MPICH names its shared memory after the job (srun's PMI gives it
# "jobid.step"), and a segment left in /dev/shm by a killed rank of an earlier cluster's job of the same id was
# opened again, its stale contents read as the new job's (MPI_Init failed now and then)
FirstJobId={first_job}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.sock
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# 4 CPUs on a 2-core machine: ranks mostly wait on each other
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
NodeName={host} NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def install():
    """``apt-get install slurm-wlm munge libpmix-dev`` when one of them is missing."""
    if all(which(daemon) for daemon in ("munged", "slurmctld", "slurmd", "sbatch")) and glob.glob(PMIX):
        return
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", *PACKAGES], check=True, env=env, timeout=900,
                   stdout=subprocess.DEVNULL)


def which(name):
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:{SBIN}")


def first_job_id():
    """A first job id for a new cluster, random below Slurm's MaxJobId (67043328 by default): its jobs' ids are
    most likely none an earlier cluster used."""
    return 1000 + secrets.randbelow(60_000_000)


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class SlurmCluster:
    """One node (this host, as ``hostname -s`` names it), one partition ``debug``, 4 CPUs; a context manager.

    ``env`` holds what a client needs (``SLURM_CONF``); ``squeue()`` lists the jobs in the queue.
    """

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="mpinb-slurm-"))
        self.steps_left = []
        self.root.chmod(0o755)  # munged wants its socket's directory searchable by everyone
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        self.processes = {}

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def start(self, timeout=60):
        install()
        for sub in ("munge", "state", f"spool/{self.host}", "log", "run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o755)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf.write_text(SLURM_CONF.format(host=self.host, root=self.root, ctld_port=_free_port(),
                                               slurmd_port=_free_port(), user=_user(), first_job=first_job_id()))
        munge = self.root / "munge"
        try:
            self._daemon("munged", "-F", f"--key-file={key}", f"--socket={munge}/munge.sock",
                         f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
                         f"--seed-file={munge}/munged.seed")
            wait_for(lambda: (munge / "munge.sock").exists(), _said("munged to open its socket", self.root), timeout,
                     0.1)
            self._daemon("slurmctld", "-D", "-i", "-f", str(self.conf))
            self._daemon("slurmd", "-D", "-f", str(self.conf))
            wait_for(self._node_idle, _said("the node to become idle", self.root), timeout, 0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def command(self, *args, timeout=30):
        """Run a Slurm client command against this cluster; its stdout."""
        done = subprocess.run([which(args[0]) or args[0], *args[1:]], capture_output=True, text=True,
                              env={**os.environ, **self.env}, timeout=timeout)
        return done.stdout

    def squeue(self):
        """``[(job id, name, state)]`` of every job in the queue."""
        lines = self.command("squeue", "-h", "-o", "%i|%j|%T").splitlines()
        return [tuple(line.split("|")) for line in lines if line.strip()]

    def stop(self):
        """Cancel what is queued, wait for the job steps to end, then stop the daemons this object started."""
        if "slurmctld" in self.processes and self.processes["slurmctld"].poll() is None:
            jobs = [job for job, *_ in self.squeue()]
            if jobs:
                self.command("scancel", *jobs)
            wait_for(lambda: not self.squeue() and not self._step_sockets(), "the queue to empty", 30, 0.1,
                     required=False)
        # a job step still running keeps its socket in this cluster's own spool: it would outlive slurmd
        self.steps_left = [path.name for path in self._step_sockets()]
        for name in ("slurmd", "slurmctld", "munged"):
            daemon = self.processes.pop(name, None)
            if daemon is None or daemon.poll() is not None:
                continue
            daemon.terminate()
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)

    def daemon_pids(self):
        return [daemon.pid for daemon in self.processes.values()]

    # ---------------------------------------------------------------- internals

    def _daemon(self, name, *args):
        path = which(name)
        log = open(self.root / "log" / f"{name}.stdout", "wb")
        with log:
            self.processes[name] = subprocess.Popen([path, *args], stdin=subprocess.DEVNULL, stdout=log,
                                                    stderr=subprocess.STDOUT, env={**os.environ, **self.env})

    def _node_idle(self):
        for name, daemon in self.processes.items():
            if daemon.poll() is not None:
                log = (self.root / "log" / f"{name}.stdout").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited ({daemon.returncode}) while Slurm started:\n{log}")
        return self.command("sinfo", "-h", "-o", "%t").strip() == "idle"

    def _step_sockets(self):
        spool = self.root / "spool" / self.host
        return [path for path in spool.glob("*") if path.is_socket()]


def _user():
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


NODES_CONF = """\
ClusterName=mpinb-nodes
# job ids unlike any earlier cluster's (see SLURM_CONF)
FirstJobId={first_job}
SlurmctldHost={controller}({controller_address})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.sock
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
# the hosts share one filesystem: each node's own temporary folder (srun --mpi=pmix makes its PMIx folders there)
TmpFS={root}/tmp/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=6
MessageTimeout=2
# between SIGTERM and SIGKILL when a job ends: longer than anything here waits for a job to leave the queue,
# so a process that ignores SIGTERM is left behind and found (Slurm's default is 30 s)
KillWait=120
MailProg=/bin/true
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
{nodes}
PartitionName=nodes Nodes={node_list} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmNodes:
    """Slurm across test hosts (``tests/hosts.py``): ``slurmctld`` on host *controller*, a ``slurmd`` on each host
    of *nodes* (named as the host, reached at its address), one partition ``nodes`` of them, *cpus* CPUs each.

    The hosts share this machine's filesystem, so one ``munged`` serves them all through its socket in the
    cluster's folder, and one ``slurm.conf`` is read by every daemon and client. Started and stopped by pid, as
    :class:`SlurmCluster`; client commands run on the controller's host (``command``)."""

    def __init__(self, hosts, *, controller=0, nodes=(1, 2), cpus=2):
        self.hosts, self.controller, self.nodes, self.cpus = hosts, controller, list(nodes), cpus
        self.root = Path(tempfile.mkdtemp(prefix="mpinb-slurm-nodes-"))
        self.root.chmod(0o755)
        self.conf = self.root / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        self.processes = {}
        self.names = [hosts.names[i] for i in self.nodes]

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def start(self, timeout=90):
        install()
        for sub in ("munge", "state", "log", "run", *(f"{kind}/{name}" for name in self.names
                                                       for kind in ("spool", "tmp"))):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o755)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        hosts = self.hosts
        nodes = "\n".join(f"NodeName={hosts.names[i]} NodeAddr={hosts.addresses[i]} CPUs={self.cpus} State=UNKNOWN"
                          for i in self.nodes)
        self.conf.write_text(NODES_CONF.format(
            controller=hosts.names[self.controller], controller_address=hosts.addresses[self.controller],
            root=self.root, ctld_port=_free_port(), slurmd_port=_free_port(), user=_user(), nodes=nodes,
            node_list=",".join(self.names), first_job=first_job_id()))
        munge = self.root / "munge"
        try:
            self._daemon("munged", None, "-F", f"--key-file={key}", f"--socket={munge}/munge.sock",
                         f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
                         f"--seed-file={munge}/munged.seed")
            wait_for(lambda: (munge / "munge.sock").exists(), _said("munged to open its socket", self.root), timeout,
                     0.2)
            self._daemon("slurmctld", self.controller, "-D", "-i", "-f", str(self.conf))
            for i in self.nodes:
                self._daemon(f"slurmd-{hosts.names[i]}", i, "-D", "-N", hosts.names[i], "-f", str(self.conf))
            wait_for(self._nodes_idle, _said("every node to become idle", self.root), timeout, 0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def command(self, *args, timeout=30):
        """Run a Slurm client command on the controller's host; its stdout."""
        done = self.hosts.output(self.controller, [which(args[0]) or args[0], *args[1:]], timeout=timeout,
                                 env={**os.environ, **self.env})
        return done.stdout

    def squeue(self):
        lines = self.command("squeue", "-h", "-o", "%i|%j|%T").splitlines()
        return [tuple(line.split("|")) for line in lines if line.strip()]

    def node_states(self):
        """``{node: state}`` as ``sinfo`` says (``idle``, ``alloc``, ``down*``...)."""
        lines = self.command("sinfo", "-h", "-N", "-o", "%N|%t").splitlines()
        return dict(line.split("|") for line in lines if "|" in line)

    def kill_slurmd(self, name):
        """Kill node *name*'s slurmd (SIGKILL), as a node that crashes."""
        self.processes[f"slurmd-{name}"].kill()
        self.processes[f"slurmd-{name}"].wait(timeout=10)

    def restart_slurmd(self, name, timeout=90):
        """Start node *name*'s slurmd again (when it is not running) and wait until every node is idle."""
        daemon = self.processes.get(f"slurmd-{name}")
        if daemon is None or daemon.poll() is not None:
            self._daemon(f"slurmd-{name}", self.hosts.names.index(name), "-D", "-N", name, "-f", str(self.conf))

        def idle():
            if self.node_states().get(name, "").startswith("down") and not self.node_states()[name].endswith("*"):
                self.command("scontrol", "update", f"NodeName={name}", "State=RESUME")  # as an administrator would
            return self._nodes_idle()

        wait_for(idle, lambda: _said(f"every node to become idle again (they are {self.node_states()}, the queue "
                                     f"{self.squeue()})", self.root), timeout, 0.2)

    def stop(self):
        if "slurmctld" in self.processes and self.processes["slurmctld"].poll() is None:
            jobs = [job for job, *_ in self.squeue()]
            if jobs:
                self.command("scancel", *jobs)
            wait_for(lambda: not self.squeue(), "the queue to empty", 30, 0.2, required=False)
        for name in sorted(self.processes, key=lambda name: ("slurmd" not in name, name == "munged")):
            daemon = self.processes.pop(name)
            if daemon.poll() is not None:
                continue
            daemon.terminate()
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)

    def daemon_pids(self):
        """The daemons' pids, and slurmctld's own helpers (slurmscriptd); not what slurmd starts for jobs."""
        import psutil

        pids = [daemon.pid for daemon in self.processes.values()]
        controller = self.processes.get("slurmctld")
        if controller is not None and controller.poll() is None:
            try:
                pids += [child.pid for child in psutil.Process(controller.pid).children(recursive=True)]
            except psutil.Error:
                pass
        return pids

    def _daemon(self, name, host, *args):
        path = which(name.split("-")[0])
        log = open(self.root / "log" / f"{name}.stdout", "wb")
        env = {**os.environ, **self.env}
        with log:
            argv = [path, *args]
            if host is None:
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                           env=env)
            else:
                process = self.hosts.run(host, argv, sysfs=True, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env)
            self.processes[name] = process

    def _nodes_idle(self):
        for name, daemon in self.processes.items():
            if daemon.poll() is not None:
                log = (self.root / "log" / f"{name}.stdout").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited ({daemon.returncode}) while Slurm started:\n{log}")
        states = self.node_states()
        return sorted(states) == sorted(self.names) and set(states.values()) == {"idle"}


def _said(what, root):
    """*what* a wait was for, with where the daemons' logs are."""
    return f"{what}; logs in {root / 'log'}"
