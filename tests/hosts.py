"""Several real hosts on this machine for the tests: network namespaces joined by a switch, each running sshd.

``with Hosts(3) as hosts:`` builds hosts ``h0``, ``h1``, ``h2``:

- each host is a network namespace of its own (``ip netns``, named ``mpinb-h<pid>-<n>-<i>`` so that two test runs
  side by side never collide) plus a UTS namespace that carries its hostname, held by a ``sleep`` process that
  the fixture starts and kills; every process the fixture starts on a host (its sshd, ``hosts.run``) enters both,
  so it sees the host's hostname and network, and so does everything sshd starts there;
- the hosts are joined through a bridge in one more namespace (the switch): one veth link per host, ``eth0`` in
  the host, ``p<i>`` on the switch. ``link_down(i)`` takes the switch's end down, like pulling a cable: host i
  keeps its address, nothing reaches it and nothing leaves it (a connection to it times out, or fails with "No
  route to host" once ARP went unanswered, about 3 s);
- addresses are ``10.199.<k>.<i+1>/24`` on each host's ``eth0`` (``k`` from the pid), with loopback up; they exist
  only inside these namespaces: the machine's own namespace gets no address, route or firewall rule;
- names resolve through ``/etc/netns/<namespace>/hosts``, which ``ip netns exec`` binds over ``/etc/hosts``: every
  host knows every host's name (and ``localhost``); the files are removed at teardown (``/etc/netns`` itself is
  left, another run may be using it);
- each host runs Debian's ``sshd`` (``make sshd`` installs openssh-server) on port 22 of its address, with a host
  key, an ``sshd_config`` and the client's key pair generated in the fixture's temporary directory: root logs in by
  that key only, no PAM, ``StrictModes no`` (the key lives under /tmp). ``hosts.ssh_config`` is a client config
  (IdentityFile, a known_hosts already holding every host's key, StrictHostKeyChecking accept-new, BatchMode yes,
  ConnectTimeout 5) so ``ssh -F <config> h1 cmd`` works from any host to any host.

Teardown (also when the body raises) kills by pid every process still inside the namespaces (found through
``/proc/<pid>/ns/net``), sshd and the holders included, deletes the namespaces, the ``/etc/netns`` entries and the
temporary directory. Where this machine cannot build namespaces (not root, no ``ip``, ``unshare`` fails) or has
no sshd, ``Hosts`` raises ``pytest.skip`` with the reason.

MPICH across these hosts (see tests/test_hosts.py): Hydra's ssh launcher through a wrapper script that runs
``ssh -F <config> "$@"`` (``hosts.ssh_wrapper``), ``mpiexec -launcher ssh -launcher-exec <wrapper> -hosts h0,h1,h2``,
run on host 0 (``hosts.hydra_options()`` gives those options). Hydra needs nothing more: its proxies connect back to
``h0`` by name, which every host resolves to host 0's address. MPICH's ranks do: the wheel's default netmod, UCX,
sees one machine (same boot id) and moves the data through shared memory (sysv, cma) even between hosts, so
``hosts.mpi_env`` sets ``UCX_TLS=tcp,self`` and ``UCX_NET_DEVICES=eth0`` (and, for the ofi netmod,
``FI_TCP_IFACE=eth0``, ``FI_SOCKETS_IFACE=eth0``): then an allreduce of 32 MB moves 32 MB through each eth0.
``eth0`` is each host's only interface besides loopback. Open MPI: ``hosts.openmpi_options()`` (its ssh agent is
the same wrapper; TCP on eth0 for its daemons and its ranks).
"""

import contextlib
import itertools
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
from waiting import wait_for

SSHD = "/usr/sbin/sshd"
NETNS_ETC = Path("/etc/netns")
NETNS_RUN = Path("/run/netns")
SUBNET = "10.199"

_uses = itertools.count()

SSHD_CONFIG = """\
ListenAddress {address}:22
HostKey {host_key}
PidFile none
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
MaxStartups 200
MaxSessions 200
LogLevel INFO
"""

SSH_CONFIG = """\
Host *
    User root
    IdentityFile {key}
    IdentitiesOnly yes
    UserKnownHostsFile {known_hosts}
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking accept-new
    BatchMode yes
    ConnectTimeout 5
    LogLevel ERROR
"""


def _ip(*args, timeout=30):
    """``ip ARGS``; raises RuntimeError with ip's own message when it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def netns_inode(name):
    """The inode of network namespace ``name`` (what ``/proc/<pid>/ns/net`` names as ``net:[inode]``)."""
    return os.stat(NETNS_RUN / name).st_ino


def pids_in_netns(inode):
    """Pids of the live processes whose network namespace has ``inode``."""
    link = f"net:[{inode}]"
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/ns/net") == link:
                pids.append(int(entry.name))
        except OSError:  # gone, or a zombie
            pass
    return pids


def _preflight():
    """The reason this machine cannot build hosts, or None."""
    if os.geteuid() != 0:
        return f"building network namespaces needs root (uid {os.geteuid()})"
    for tool in ("ip", "unshare", "nsenter", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} not found on PATH"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} not found: `make sshd` installs Debian's openssh-server"
    probe = subprocess.run(["unshare", "--net", "--uts", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode:
        return f"unshare --net --uts fails here: {probe.stderr.strip() or probe.returncode}"
    return None


class Hosts:
    """``n`` hosts, each a network + UTS namespace with its own hostname, address and sshd.

    Args:
        n (int): how many hosts.
        prefix (str, default "h"): host i is named ``f"{prefix}{i}"``.
        timeout (float, default 20): seconds to wait for each host's daemons to come up.

    Example::

        with Hosts(3) as hosts:
            out = hosts.output(0, ["ssh", "-F", hosts.ssh_config, hosts.names[1], "hostname"])
            assert out.stdout.strip() == hosts.names[1]
    """

    def __init__(self, n, *, prefix="h", timeout=20.0):
        self.n = n
        self.timeout = timeout
        tag = f"mpinb-h{os.getpid()}-{next(_uses)}"
        self.namespaces = [f"{tag}-{i}" for i in range(n)]
        self.switch = f"{tag}-sw"
        self.names = [f"{prefix}{i}" for i in range(n)]
        k = os.getpid() % 254 + 1
        self.addresses = [f"{SUBNET}.{k}.{i + 1}" for i in range(n)]
        self.dir = None
        self.ssh_config = None
        self.ssh_wrapper = None
        # MPI's traffic between hosts over eth0, not through shared memory nor lo (see the module's docstring)
        self.mpi_env = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth0", "FI_TCP_IFACE": "eth0",
                        "FI_SOCKETS_IFACE": "eth0"}
        self._made = []  # namespaces created, to delete
        self._holders = []  # per host: the process holding its UTS namespace
        self._sshds = []
        self._started = []  # every Popen started, waited on at teardown
        self._inodes = []

    # -- building ---------------------------------------------------------------------------------------------

    def __enter__(self):
        reason = _preflight()
        if reason:
            pytest.skip(reason)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _build(self):
        self.dir = Path(tempfile.mkdtemp(prefix="mpinb-hosts-"))
        try:
            _ip("netns", "add", self.switch)
        except RuntimeError as e:
            pytest.skip(f"cannot create network namespaces here: {e}")
        self._made.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate(self.namespaces):
            _ip("netns", "add", ns)
            self._made.append(ns)
            self._inodes.append(netns_inode(ns))
            _ip("-n", self.switch, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0")
            _ip("-n", self.switch, "link", "set", f"p{i}", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        self._write_hosts_files()
        self._write_keys()
        for i in range(self.n):
            self._start_holder(i)
        for i in range(self.n):
            self._start_sshd(i)
        for i in range(self.n):
            log = self.dir / f"sshd{i}.log"
            wait_for(lambda: "Server listening" in log.read_text() or self._sshds[i].poll() is not None,
                      f"sshd on {self.names[i]}", self.timeout)
            if self._sshds[i].poll() is not None:
                raise RuntimeError(f"sshd on {self.names[i]} exited: {log.read_text().strip()}")

    def _write_hosts_files(self):
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines += [f"{address} {name}" for address, name in zip(self.addresses, self.names)]
        for ns in self.namespaces:
            (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / ns / "hosts").write_text("\n".join(lines) + "\n")

    def _keygen(self, path):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
                       check=True, capture_output=True, timeout=30)

    def _write_keys(self):
        d = self.dir
        self._keygen(d / "id_ed25519")
        shutil.copy(d / "id_ed25519.pub", d / "authorized_keys")
        known = []
        for i in range(self.n):
            self._keygen(d / f"host{i}_ed25519")
            kind, key = (d / f"host{i}_ed25519.pub").read_text().split()[:2]
            known.append(f"{self.names[i]},{self.addresses[i]} {kind} {key}")
            (d / f"sshd{i}_config").write_text(SSHD_CONFIG.format(
                address=self.addresses[i], host_key=d / f"host{i}_ed25519", authorized_keys=d / "authorized_keys"))
        (d / "known_hosts").write_text("\n".join(known) + "\n")
        self.ssh_config = str(d / "ssh_config")
        Path(self.ssh_config).write_text(SSH_CONFIG.format(key=d / "id_ed25519", known_hosts=d / "known_hosts"))
        # what Hydra's -launcher-exec (or any tool that runs `ssh host cmd`) can call
        self.ssh_wrapper = str(d / "ssh")
        Path(self.ssh_wrapper).write_text(f'#!/bin/sh\nexec ssh -F {shlex.quote(self.ssh_config)} "$@"\n')
        os.chmod(self.ssh_wrapper, 0o755)
        # sshd refuses to start without its privilege separation directory (the package makes it at boot)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)

    def _popen(self, argv, **kwargs):
        process = subprocess.Popen(argv, **kwargs)
        self._started.append(process)
        return process

    def _start_holder(self, i):
        """A process in host i's network namespace and a new UTS namespace named ``names[i]``."""
        holder = self._popen(["ip", "netns", "exec", self.namespaces[i], "unshare", "--uts", "sh", "-c",
                              'hostname "$0" && exec sleep infinity', self.names[i]],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._holders.append(holder)

        def named():
            if holder.poll() is not None:
                raise RuntimeError(f"the holder of {self.names[i]} exited: {holder.stderr.read().decode()}")
            done = subprocess.run(["nsenter", "-t", str(holder.pid), "--uts", "hostname"],
                                  capture_output=True, text=True, timeout=10)
            return done.stdout.strip() == self.names[i]

        wait_for(named, f"hostname {self.names[i]}", self.timeout)

    def _start_sshd(self, i):
        log = open(self.dir / f"sshd{i}.log", "wb")
        with log:
            sshd = self.run(i, [SSHD, "-D", "-e", "-f", str(self.dir / f"sshd{i}_config")],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._sshds.append(sshd)

    # -- using ------------------------------------------------------------------------------------------------

    def command(self, i, cmd, *, sysfs=False):
        """The argv that runs ``cmd`` (an argv list, or a shell string) on host i, in its namespaces. With
        *sysfs*, the machine's ``/sys`` stays in view: ``ip netns exec`` mounts a ``/sys`` of the namespace's own,
        without the cgroup hierarchy a daemon such as slurmd needs; the host's names file is mounted as it does."""
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        uts = ["nsenter", "-t", str(self._holders[i].pid), "--uts"]
        if sysfs:
            hosts = NETNS_ETC / self.namespaces[i] / "hosts"
            return [*uts, f"--net={NETNS_RUN / self.namespaces[i]}", "unshare", "--mount", "sh", "-c",
                    f'mount --bind {shlex.quote(str(hosts))} /etc/hosts && exec "$@"', "sh", *argv]
        # ip netns exec: network namespace + /etc/netns/<ns>/hosts over /etc/hosts; nsenter: the hostname
        return ["ip", "netns", "exec", self.namespaces[i], *uts, *argv]

    def run(self, i, cmd, *, sysfs=False, **popen_kwargs):
        """Start ``cmd`` (argv list or shell string) on host i; the Popen (its pid is the command's own)."""
        return self._popen(self.command(i, cmd, sysfs=sysfs), **popen_kwargs)

    def output(self, i, cmd, *, timeout=60, check=False, **kwargs):
        """Run ``cmd`` on host i to the end; CompletedProcess with text stdout and stderr."""
        return subprocess.run(self.command(i, cmd), capture_output=True, text=True, timeout=timeout, check=check,
                              **kwargs)

    def hydra_options(self, hosts=None):
        """MPICH ``mpiexec`` (Hydra) options that start ranks on ``hosts`` (indices, default all) through ssh,
        with ``mpi_env`` passed to every rank; run that mpiexec on one of the hosts."""
        names = [self.names[i] for i in (range(self.n) if hosts is None else hosts)]
        options = ["-launcher", "ssh", "-launcher-exec", self.ssh_wrapper, "-hosts", ",".join(names)]
        for key, value in self.mpi_env.items():
            options += ["-genv", key, value]
        return options

    def openmpi_options(self):
        """Open MPI ``mpirun`` options that start its daemons on other hosts through ssh (the wrapper) and keep its
        own and MPI's traffic on eth0 (TCP, not shared memory: the hosts share one kernel); the hosts come from a
        hostfile (``h1 slots=2``)."""
        return ["--mca", "plm_rsh_agent", self.ssh_wrapper, "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0"]

    @property
    def daemon_pids(self):
        """Pids of the processes the fixture keeps on the hosts (the holders and sshds)."""
        return {p.pid for p in self._holders + self._sshds}

    def pids_on(self, i, *, daemons=False):
        """Pids of the live processes on host i (in its network namespace); without the fixture's own daemons
        unless ``daemons``."""
        pids = pids_in_netns(self._inodes[i])
        return pids if daemons else [pid for pid in pids if pid not in self.daemon_pids]

    def left_behind(self, *, within=60):
        """``{host: [command line, ...]}`` of the processes still on any host after *within* seconds (empty when
        none is). A world's processes on other hosts end after the notebook's ``mpiexec`` does, through ssh (the
        proxy there ends its ranks, each given a few seconds to end): the check waits for that, and names what is
        left when it does not happen."""
        wait_for(lambda: not any(self.pids_on(i) for i in range(self.n)), "no process left on the hosts", within,
                 0.1, required=False)
        left = {}
        for i in range(self.n):
            for pid in self.pids_on(i):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as file:
                        line = file.read().replace(b"\0", b" ").decode(errors="replace").strip()
                except OSError:  # ended just now
                    continue
                left.setdefault(self.names[i], []).append(f"{pid}: {line}")
        return left

    def link_down(self, i):
        """Pull host i's cable: its link on the switch goes down."""
        _ip("-n", self.switch, "link", "set", f"p{i}", "down")

    def link_up(self, i):
        """Plug host i's cable back in."""
        _ip("-n", self.switch, "link", "set", f"p{i}", "up")

    # -- teardown ---------------------------------------------------------------------------------------------

    def close(self):
        """Kill every process on the hosts, delete the namespaces, /etc/netns entries and temporary directory."""
        inodes = list(self._inodes)
        with contextlib.suppress(FileNotFoundError):
            inodes.append(netns_inode(self.switch))
        try:
            self._kill_all(inodes)
        finally:
            for ns in reversed(self._made):
                with contextlib.suppress(RuntimeError):
                    _ip("netns", "delete", ns)
            self._made.clear()
            for ns in self.namespaces:
                shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
            if self.dir is not None:
                shutil.rmtree(self.dir, ignore_errors=True)

    def _kill_all(self, inodes, timeout=20.0):
        def alive():
            return [pid for inode in inodes for pid in pids_in_netns(inode)]

        left = []

        def all_gone():  # each time: kill what is still there
            for process in self._started:  # reap what already ended, so that zombies are not counted
                process.poll()
            left[:] = alive()
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return not left

        wait_for(all_gone, lambda: f"the processes on the hosts to end (still there: {left})", timeout)
        for process in self._started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
            if process.stderr:
                process.stderr.close()


def setup_across(hosts, ranks=(1, 2), per_host=2, *, openmpi=None):
    """``MPIMagics`` settings for a world of *per_host* ranks on each of *ranks*' hosts, the notebook on host 0:
    a hostfile, the launcher's ssh options and ``--ip`` on host 0's address; Hydra's, or with *openmpi* (the path
    of its ``mpiexec``) Open MPI's."""
    hostfile = hosts.dir / "hostfile"
    if openmpi:
        hostfile.write_text("".join(f"{hosts.names[i]} slots={per_host}\n" for i in ranks))
        options, extra = hosts.openmpi_options(), {"default_mpi": "openmpi", "mpiexec": openmpi}
    else:
        hostfile.write_text("".join(f"{hosts.names[i]}:{per_host}\n" for i in ranks))
        options, extra = hosts.hydra_options(list(ranks)), {}
        where = options.index("-hosts")
        del options[where:where + 2]  # the hostfile says where
    return {"launcher": "ssh", "hostfile": str(hostfile), "ip": hosts.addresses[0], "mpiexec_args": options,
            **extra}


def hosts_or_exit(n):
    """For a script: *n* hosts built (leave them with ``close()``), or exit saying why this machine cannot."""
    try:
        return Hosts(n).__enter__()
    except pytest.skip.Exception as exc:
        raise SystemExit(f"cannot build hosts on this machine: {exc}") from None


@pytest.fixture
def make_hosts():
    """Fixture factory: ``hosts = make_hosts(3)`` builds hosts that are torn down when the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda n, **kwargs: stack.enter_context(Hosts(n, **kwargs))
