"""Every rank has the environment ``torchrun`` gives a worker, so ``dist.init_process_group("gloo")`` (env://) and
the frameworks that read it work in any ``%%mpi`` cell, after ``%mpi restart`` too, and ``mpinb.torch``'s helper
meets where they do."""

import errno
import json
import socket
import subprocess
import sys
import textwrap

import pytest
import zmq

from mpinb.notebook.world.mpis import default_mpiexec

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]

NAMES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
         "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT",
         "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
         "TORCH_NCCL_ASYNC_ERROR_HANDLING")

# each rank's environment, and its place on its host as a shared-memory split of its own says
ENVIRONMENT = f"""
import os
from mpi4py import MPI
_local = comm.Split_type(MPI.COMM_TYPE_SHARED)
_leaders = comm.allgather(_local.bcast(rank, root=0))
split = {{"local_rank": _local.rank, "local_size": _local.size, "groups": len(set(_leaders)),
          "group_rank": sorted(set(_leaders)).index(_leaders[rank])}}
_local.Free()
env = {{name: os.environ.get(name) for name in {NAMES!r}}}
"""

# on rank 0, before any group: the world listens on MASTER_PORT (a connection is taken), and a plain bind is
# refused, so no other socket of this host takes it in the meantime
PORT_FREE = """
import socket
def _port_state():
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    try:
        socket.create_connection((address, port), timeout=10).close()
        listening = True
    except ConnectionRefusedError:  # nobody listens
        listening = False
    with socket.socket() as other:
        try:
            other.bind(("", port))
            held = False
        except OSError:
            held = True
    return listening, held
port_state = _port_state() if rank == 0 else None
"""

ENV_ALL_REDUCE = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
dist.destroy_process_group()
(t.item(), dist.is_initialized())
"""

NO_GROUP = "import torch.distributed as dist\nif dist.is_initialized():\n    dist.destroy_process_group()"


def environments(ip, mpi):
    """``({rank: env}, {rank: split})`` of the running world."""
    mpi(ENVIRONMENT, line="--gather env split --no-inspect")
    return dict(ip.user_ns["env"]), dict(ip.user_ns["split"])


def check_consistent(env, split, size, *, address="127.0.0.1"):
    """Every variable on every rank, each saying what MPI says; the ones of the world the same everywhere."""
    assert sorted(env) == list(range(size))
    for rank, mine in env.items():
        missing = [name for name in NAMES if not mine[name]]
        assert not missing, f"rank {rank} lacks {missing}"
        assert mine["RANK"] == mine["ROLE_RANK"] == str(rank)
        assert mine["WORLD_SIZE"] == mine["ROLE_WORLD_SIZE"] == str(size)
        assert mine["LOCAL_RANK"] == str(split[rank]["local_rank"])
        assert mine["LOCAL_WORLD_SIZE"] == str(split[rank]["local_size"])
        assert mine["GROUP_RANK"] == str(split[rank]["group_rank"])
        assert mine["GROUP_WORLD_SIZE"] == str(split[rank]["groups"])
        assert mine["ROLE_NAME"] == "default"
        assert mine["TORCHELASTIC_RESTART_COUNT"] == mine["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert mine["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # rank 0 hosts the store, no agent does
    for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        assert len({mine[name] for mine in env.values()}) == 1, f"{name} differs across ranks"
    assert env[0]["MASTER_ADDR"] == address
    assert 0 < int(env[0]["MASTER_PORT"]) < 65536


def test_every_rank_has_torchruns_environment_agreeing_with_mpi(world_of, ip, mpi):
    world_of(3)
    env, split = environments(ip, mpi)
    check_consistent(env, split, 3)
    assert {s["groups"] for s in split.values()} == {1}  # one host: the check above saw a real split


# 2 ranks on each of two hosts: the environment gathered, then env:// across the link
ACROSS_HOSTS = [["line", "start -n 4"], ["cell", "--gather env split --no-inspect", ENVIRONMENT],
                ["eval", "(dict(env), dict(split))"], ["cell", "--timeout 120", ENV_ALL_REDUCE]]


def check_across_hosts(result, hosts):
    """The groups are the hosts (rank 0's, h1, first), MASTER_ADDR is h1's address, and env:// summed to 10."""
    import ast

    steps = result["steps"]
    assert [step["raised"] for step in steps] == [None] * 4, steps
    env, split = ast.literal_eval(steps[2]["value"])
    check_consistent(env, split, 4, address=hosts.addresses[1])
    assert [int(env[r]["GROUP_RANK"]) for r in range(4)] == [0, 0, 1, 1]
    assert {env[r]["LOCAL_WORLD_SIZE"] for r in range(4)} == {"2"}
    assert {ast.literal_eval(value) for value in steps[3]["value"].values()} == {(10.0, False)}


@pytest.mark.slow
def test_env_init_process_group_all_reduces_in_a_new_world_and_again_after_a_restart(world_of, ip, mpi):
    """In a world no group has used yet MASTER_PORT is held by a socket listening for the store;
    ``dist.init_process_group("gloo")`` with no arguments meets there, sums, is destroyed, and meets there again (a
    re-run cell); a restart is a new world with its own run id and the same holds."""
    world_of(3)
    ip.run_line_magic("mpi", "restart")
    run_ids = []
    for _ in range(2):
        env, split = environments(ip, mpi)
        check_consistent(env, split, 3)
        run_ids.append(env[0]["TORCHELASTIC_RUN_ID"])
        mpi(PORT_FREE, line="--gather port_state --no-inspect")
        assert ip.user_ns["port_state"][0] == (True, True)  # the world listens there, and holds it
        for _ in range(2):
            assert mpi(ENV_ALL_REDUCE, line="--timeout 120") == {r: (6.0, False) for r in range(3)}
        ip.run_line_magic("mpi", "restart")
    assert run_ids[0] != run_ids[1]


@pytest.mark.slow
def test_a_program_that_binds_master_port_as_zmq_does_is_refused_and_env_init_still_meets_there(world_of, ip, mpi):
    """Programs that choose a port by binding port 0 and closing it, then bind it again later with ``SO_REUSEADDR``
    (zmq's listeners: ipyparallel's controller, a Jupyter kernel) could take a port that was bound but not
    listening, and rank 0's store then failed with EADDRINUSE. The world listens on MASTER_PORT from its start,
    so such a bind is refused and ``env://`` meets there."""
    world_of(3)
    ip.run_line_magic("mpi", "restart")  # a world whose store no group has made yet
    env, _ = environments(ip, mpi)
    port = int(env[0]["MASTER_PORT"])
    context = zmq.Context()
    intruder = context.socket(zmq.ROUTER)
    try:
        try:
            intruder.bind(f"tcp://127.0.0.1:{port}")
            refused = None
        except zmq.ZMQError as exc:
            refused = exc.errno
        assert refused == errno.EADDRINUSE, "another program could listen on the world's MASTER_PORT"
        assert mpi(ENV_ALL_REDUCE, line="--timeout 120") == {r: (6.0, False) for r in range(3)}
    finally:
        intruder.close(0)
        context.term()


# a store the user makes on MASTER_PORT themselves, rank 0 serving it, then a group on it
OWN_STORE = """
import datetime, os, torch, torch.distributed as dist
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size, rank == 0,
                      datetime.timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
dist.destroy_process_group()
(t.item(), type(store).__name__, isinstance(store, torch._C._distributed_c10d.TCPStore))
"""


@pytest.mark.slow
def test_a_store_the_user_makes_on_master_port_is_served_there(world_of, ip, mpi):
    """The world listens on MASTER_PORT: the store a user's code makes there as the server
    (``dist.TCPStore(MASTER_ADDR, MASTER_PORT, size, rank == 0)``) is given that socket, so the code runs as under
    plain mpiexec with a MASTER_PORT of its own."""
    world_of(2)
    ip.run_line_magic("mpi", "restart")  # a world whose port no store has taken yet
    assert mpi(OWN_STORE, line="--timeout 120") == {r: (3.0, "TCPStore", True) for r in range(2)}


def test_init_process_group_meets_where_the_environment_says_and_agrees_with_it(world_of, ip, mpi):
    world_of(3)
    mpi(NO_GROUP)
    env, _ = environments(ip, mpi)
    info = mpi("import mpinb.torch as mt\nmt.init_process_group()", line="--timeout 120")
    for rank in range(3):
        assert info[rank]["rank"] == int(env[rank]["RANK"]) and info[rank]["size"] == int(env[rank]["WORLD_SIZE"])
        assert info[rank]["local_rank"] == int(env[rank]["LOCAL_RANK"])
    # the group's store listens on MASTER_PORT: the helper met at the environment's address
    listening = "socket.create_connection((os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])), 10).close()"
    mpi(f"import socket\n{listening}")
    summed = mpi("import torch\nt = torch.tensor([rank + 1.0])\ndist.all_reduce(t)\nt.item()")
    assert summed == {r: 6.0 for r in range(3)}
    mpi("mt.destroy_process_group()")
    assert mpi(ENV_ALL_REDUCE, line="--timeout 120") == {r: (6.0, False) for r in range(3)}  # env:// after it


@pytest.mark.slow
def test_a_users_own_master_port_is_kept_and_the_worlds_facts_are_not(ip, magics, world_of, mpi, monkeypatch):
    """MASTER_ADDR and MASTER_PORT the ranks inherit (set in the notebook's environment before the start) are kept;
    RANK and the rest describe the world whatever was there."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("RANK", "7")
    monkeypatch.setenv("LOCAL_RANK", "7")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    world_of(2)
    try:
        ip.run_line_magic("mpi", "restart")  # a world started with this environment
        env, split = environments(ip, mpi)
        check_consistent(env, split, 2)
        assert {mine["MASTER_PORT"] for mine in env.values()} == {str(port)}
        assert mpi(ENV_ALL_REDUCE, line="--timeout 120") == {0: (3.0, False), 1: (3.0, False)}
    finally:
        ip.run_line_magic("mpi", "stop")  # no later test inherits this world


PLAIN = """
import json, os, sys
import torch, torch.distributed as dist
import mpinb.torch as mt
from mpi4py import MPI
comm = MPI.COMM_WORLD
out = {"before": "MASTER_ADDR" in os.environ}
out["set"] = mt.torchrun_environment()
dist.init_process_group("gloo")
t = torch.tensor([comm.rank + 1.0])
dist.all_reduce(t)
out["env"] = t.item()
dist.destroy_process_group()
out["helper"] = mt.init_process_group()
dist.all_reduce(t)
out["helper_sum"] = t.item()
with open(os.path.join(sys.argv[1], f"out-{comm.rank}.json"), "w") as file:
    json.dump(out, file)
"""


def test_a_script_under_plain_mpiexec_sets_the_same_environment_with_torchrun_environment(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PLAIN))
    done = subprocess.run([default_mpiexec(), "-n", "2", sys.executable, str(script), str(tmp_path)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    out = {rank: json.loads((tmp_path / f"out-{rank}.json").read_text()) for rank in range(2)}
    for rank, mine in out.items():
        assert mine["before"] is False  # plain mpiexec: nothing set until asked
        assert mine["set"]["RANK"] == str(rank) and mine["set"]["WORLD_SIZE"] == "2"
        assert mine["set"]["MASTER_ADDR"] == "127.0.0.1"
        assert mine["env"] == 3.0 and mine["helper_sum"] == 6.0
        assert mine["helper"]["rank"] == rank and mine["helper"]["size"] == 2
    assert out[0]["set"]["MASTER_PORT"] == out[1]["set"]["MASTER_PORT"]


@pytest.mark.hosts
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_across_hosts_master_addr_is_rank_0s_address_and_env_init_sums():
    """Two ranks on each of two hosts (network namespaces with sshd, tests/hosts.py), the notebook on a third: the
    groups are the hosts, MASTER_ADDR is rank 0's host's address, and env:// meets there across the link."""
    from hosts import Hosts
    from multihost_runs import drive

    with Hosts(3) as hosts:
        result = drive(hosts, ACROSS_HOSTS)
    check_across_hosts(result, hosts)


@pytest.mark.slurm
@pytest.mark.hosts
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_world_started_through_slurm_on_two_nodes_has_the_environment_and_env_init_sums():
    """The same through ``%mpi start --launcher slurm`` on two Slurm nodes (tests/slurm_cluster.py)."""
    from hosts import Hosts
    from slurm_cluster import SlurmNodes
    from slurm_node_runs import drive

    with Hosts(3) as hosts, SlurmNodes(hosts, controller=0, nodes=(1, 2)) as slurm:
        result = drive((hosts, slurm), ACROSS_HOSTS)
    check_across_hosts(result, hosts)
