"""The hosts of tests/hosts.py are real enough to run MPI across: own hostnames, ssh between them, Hydra's ssh
launcher, MPI traffic on their links, partitions, and a teardown that leaves nothing behind."""

import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from hosts import NETNS_ETC, NETNS_RUN, Hosts
from waiting import wait_for

pytestmark = pytest.mark.hosts

BIN = Path(sys.executable).parent
MPIEXEC = str(BIN / "mpiexec")
PYTHON = sys.executable

# each rank: its rank, its host, the sum of rank+1 over the world, and an allreduce of 16 MB through the links
RANK_PROGRAM = """\
import socket
import sys
import numpy
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1)
big = numpy.full(2_000_000, float(comm.rank))
out = numpy.empty_like(big)
comm.Allreduce(big, out)
sys.stdout.write(f"{comm.rank} {socket.gethostname()} {total} {out[0]}\\n")  # one write: whole lines
sys.stdout.flush()
"""
BIG_BYTES = 2_000_000 * 8


@pytest.fixture(scope="module")
def hosts():
    """Three hosts shared by the checks that leave them as they found them."""
    with Hosts(3) as hosts:
        yield hosts


def ssh(hosts, src, dst, cmd, timeout=30):
    """``ssh -F <config> <host dst> cmd`` run on host src."""
    return hosts.output(src, ["ssh", "-F", hosts.ssh_config, hosts.names[dst], cmd], timeout=timeout)


def rx_bytes(hosts, i):
    done = hosts.output(i, "cat /sys/class/net/eth0/statistics/rx_bytes", timeout=10, check=True)
    return int(done.stdout)


def test_each_host_has_its_own_hostname_and_address(hosts):
    for i in range(3):
        done = hosts.output(i, "hostname; hostname -I", timeout=10, check=True)
        name, addresses = done.stdout.split("\n")[:2]
        assert name == hosts.names[i]
        assert addresses.split() == [hosts.addresses[i]]
    # the machine's own namespace got none of these addresses
    own = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, timeout=10, check=True).stdout
    assert not any(address in own for address in hosts.addresses)


def test_ssh_from_every_host_to_every_host_reaches_that_host(hosts):
    for src in range(3):
        for dst in range(3):
            done = ssh(hosts, src, dst, "hostname")
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip() == hosts.names[dst]


def test_host0_reaches_host2_by_name(hosts):
    done = hosts.output(0, ["getent", "hosts", hosts.names[2]], timeout=10, check=True)
    assert done.stdout.split() == [hosts.addresses[2], hosts.names[2]]
    banner = hosts.output(0, [PYTHON, "-c", "import socket, sys; s = socket.create_connection((sys.argv[1], 22), "
                              "timeout=10); print(s.recv(64).decode().strip())", hosts.names[2]],
                          timeout=30, check=True)
    assert banner.stdout.startswith("SSH-2.0-")


def test_processes_sshd_starts_are_on_its_host_and_found_there(hosts):
    done = ssh(hosts, 0, 2, "hostname; nohup sleep 120 >/dev/null 2>&1 </dev/null & echo $!")
    assert done.returncode == 0, done.stderr
    name, pid = done.stdout.split()
    assert name == hosts.names[2]
    sleeper = psutil.Process(int(pid))
    try:
        assert sleeper.pid in hosts.pids_on(2)
        assert sleeper.pid not in hosts.pids_on(0) + hosts.pids_on(1)
    finally:
        sleeper.kill()
    wait_for(lambda: sleeper.pid not in hosts.pids_on(2), "the sleep to end", timeout=10)


@pytest.mark.mpi
def test_hydra_starts_one_rank_on_each_host_and_mpi_runs_over_the_links(hosts):
    before = [rx_bytes(hosts, i) for i in range(3)]
    # -prepend-rank labels each line by rank: the check sees which rank printed what
    done = hosts.output(0, [MPIEXEC, *hosts.hydra_options(), "-prepend-rank", "-n", "3", PYTHON, "-c", RANK_PROGRAM],
                        timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = sorted(line.split() for line in done.stdout.splitlines() if line.strip())
    assert lines == [[f"[{rank}]", str(rank), hosts.names[rank], "6", "3.0"] for rank in range(3)], done.stdout
    # the allreduce's data went through every host's link, not through shared memory
    received = [rx_bytes(hosts, i) - before[i] for i in range(3)]
    assert all(got >= BIG_BYTES // 2 for got in received), received
    # and nothing of that world stays on any host (the ssh sessions' own sshd processes may take a moment)
    wait_for(lambda: not any(hosts.pids_on(i) for i in range(3)), "the world's processes to leave the hosts")


@pytest.mark.slow
def test_a_host_whose_link_is_down_cannot_be_reached_until_it_is_up_again():
    with Hosts(3) as hosts:
        hosts.link_down(2)
        done = ssh(hosts, 0, 2, "hostname")  # ConnectTimeout 5 in the client config
        # a timeout (ConnectTimeout 5 in the client config), or no route once ARP for host 2 went unanswered
        assert done.returncode == 255
        assert "timed out" in done.stderr or "No route to host" in done.stderr, done.stderr
        assert ssh(hosts, 0, 1, "hostname").stdout.strip() == hosts.names[1]
        assert ssh(hosts, 2, 0, "hostname").returncode == 255
        hosts.link_up(2)
        done = ssh(hosts, 0, 2, "hostname")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == hosts.names[2]


def record(hosts):
    """What a Hosts made that teardown must remove, with two processes left on its hosts."""
    stray = hosts.run(1, ["sleep", "600"])
    detached = ssh(hosts, 0, hosts.n - 1, "nohup sleep 600 >/dev/null 2>&1 </dev/null & echo $!")
    procs = [psutil.Process(pid) for pid in hosts.daemon_pids | {stray.pid, int(detached.stdout)}]
    assert len(procs) == 2 * hosts.n + 2
    return {"namespaces": hosts.namespaces + [hosts.switch], "dir": hosts.dir, "procs": procs,
            "addresses": hosts.addresses}


def assert_gone(made):
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=True).stdout
    for ns in made["namespaces"]:
        assert ns not in listed
        assert not (NETNS_RUN / ns).exists()
        assert not (NETNS_ETC / ns).exists()
    assert not made["dir"].exists()
    _, alive = psutil.wait_procs(made["procs"], timeout=10)
    assert not alive, alive
    own = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, timeout=10, check=True).stdout
    assert not any(f" {address}/" in own for address in made["addresses"])


def test_teardown_leaves_no_namespace_process_or_file():
    with Hosts(3) as hosts:
        made = record(hosts)
    assert_gone(made)


def test_teardown_also_when_the_body_raises():
    with pytest.raises(ZeroDivisionError):
        with Hosts(2) as hosts:
            made = record(hosts)
            1 / 0
    assert_gone(made)
