"""A world across hosts: the notebook on one host, its ranks on two others reached over ssh, as on a cluster.

The hosts are network namespaces with their own hostnames, addresses and sshd (tests/hosts.py). The notebook's
side runs on the first host (tests/multihost_driver.py: an IPython shell with mpinb loaded, driven by JSON);
``mpiexec`` reaches the others through its ssh launcher, and the controller listens on the first host's address
(``--ip``), so every message between notebook and ranks crosses the hosts' links.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from hosts import Hosts
from multihost_runs import DRIVER, drive, notebook
from waiting import wait_for

pytestmark = [pytest.mark.hosts, pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(300)]

OPENMPI = "/usr/bin/mpiexec.openmpi"  # Debian's openmpi-bin (make mpis)


@pytest.fixture(scope="module")
def hosts():
    with Hosts(3) as built:
        yield built


def test_cells_run_across_hosts_labelled_by_rank_with_gather_metrics_and_status(hosts):
    result = drive(hosts, [
        ["line", "start -n 4"],
        ["cell", "", "import os, socket\nprint(socket.gethostname())\n"
                     "os.system(f'echo a subprocess on {socket.gethostname()}')"],
        ["cell", "", "if rank == 3:\n    raise ValueError(f'bad batch on {socket.gethostname()}')\ncomm.Barrier()"],
        ["cell", "--gather x", "import numpy as np\nx = np.arange(1 << 20, dtype=np.float64) * (rank + 1)"],
        ["eval", "[bool((x[r] == __import__('numpy').arange(1 << 20) * (r + 1)).all()) for r in sorted(x)]"],
        ["eval", "get_ipython().magics_manager.registry['MPIMagics'].cells.transport(None)"],
        ["eval", "setattr(get_ipython().magics_manager.registry['MPIMagics'], 'gather_transport', 'mpi')"],
        ["cell", "--gather y", "y = x * 2"],
        ["eval", "[bool((y[r] == __import__('numpy').arange(1 << 20) * (r + 1) * 2).all()) for r in sorted(y)]"],
        ["cell", "", "import mpinb\nfor step in range(20):\n    mpinb.report(step=step, loss=1.0 / (step + 1))"],
        ["line", "status"],
    ])
    start, hello, failing, gather, exact, transport, _, gather_mpi, exact_mpi, report, status = result["steps"]
    assert start["raised"] is None, start
    h1, h2 = hosts.names[1], hosts.names[2]
    assert sorted(hello["stdout"].splitlines()) == sorted(  # what a subprocess writes reaches the notebook too
        [f"[rank {r}] {h}" for r, h in enumerate([h1, h1, h2, h2])] +
        [f"[rank {r}] a subprocess on {h}" for r, h in enumerate([h1, h1, h2, h2])]), hello["stdout"]
    assert failing["raised"][0] == "RankError" and f"rank 3: ValueError: bad batch on {h2}" in failing["raised"][1]
    assert gather["raised"] is None and exact["value"] == "[True, True, True, True]", (gather, exact)
    assert transport["value"] == "'frames'"  # no rank shares the notebook's host: each rank sends its own
    assert gather_mpi["raised"] is None and exact_mpi["value"] == "[True, True, True, True]", (gather_mpi, exact_mpi)
    assert report["raised"] is None and result["history"] == 4 * 20  # every rank's every report arrived
    assert f"{h1}: ranks 0-1; {h2}: ranks 2-3" in status["stdout"], status["stdout"]
    assert result["hosts"] == {h1: [0, 1], h2: [2, 3]}


def test_a_rank_killed_on_another_host_fails_the_cell_naming_it_and_its_host(hosts):
    result = drive(hosts, [
        ["line", "start -n 4"],
        ["cell", "--timeout 120", "import os, time\nif rank == 3:\n    time.sleep(1)\n    os.kill(os.getpid(), 9)\n"
                                  "time.sleep(100)"],
    ])
    start, killed = result["steps"]
    assert start["raised"] is None, start
    name, text = killed["raised"]
    assert name == "RankError", killed
    first = text.splitlines()[1]  # the rank whose end ended the others comes first
    assert first.startswith(f"rank 3: RankLost: rank 3 died: its process on {hosts.names[2]} ended"), text
    assert "Timeout" not in text  # noticed as it happened, not at the cell's time limit


def test_a_restart_after_a_rank_died_on_another_host_puts_every_ranks_variables_back(hosts):
    result = drive(hosts, [
        ["line", "start -n 4"],
        ["cell", "", "import socket, numpy as np\nkept = np.arange(3.0) + rank\nwhere = socket.gethostname()"],
        ["cell", "", "import os\nif rank == 3:\n    os.kill(os.getpid(), 9)\ncomm.Barrier()"],
        ["line", "restart"],
        ["cell", "", "print(kept.tolist(), where == socket.gethostname())"],
    ], snapshot_lag=0.0)  # each cell waits for the snapshot of the one before: the kill loses nothing
    start, made, killed, restart, check = result["steps"]
    assert start["raised"] is None and made["raised"] is None, (start, made)
    assert killed["raised"][0] == "RankError", killed
    assert restart["raised"] is None and "restored every rank's variables" in restart["stdout"], restart
    assert sorted(check["stdout"].splitlines()) == [f"[rank {r}] [{r}.0, {r + 1}.0, {r + 2}.0] True"
                                                    for r in range(4)], check["stdout"]


def test_open_mpi_runs_across_hosts_and_names_how_a_remote_rank_died(hosts):
    """Open MPI passes to other hosts only the variables named with -x: the engines' connection to the
    controller ($IPP_CONNECTION_INFO) among them (without it no rank registered). Its launcher names the rank
    that ended the job, and how."""
    if not Path(OPENMPI).exists():
        if os.environ.get("MPINB_TEST_ALL_MPIS"):
            pytest.fail(f"{OPENMPI} is missing: make mpis installs it (Debian's openmpi-bin)")
        pytest.skip(f"{OPENMPI} is missing: make mpis installs it")
    result = drive(hosts, [
        ["line", "start -n 4"],
        ["cell", "", "import socket\nprint(socket.gethostname())"],
        ["cell", "--gather x", "import numpy as np\nx = np.arange(1 << 18, dtype=np.float64) * (rank + 1)"],
        ["eval", "[bool((x[r] == __import__('numpy').arange(1 << 18) * (r + 1)).all()) for r in sorted(x)]"],
        ["line", "status"],
        ["cell", "--timeout 120", "import os, time\nif rank == 3:\n    time.sleep(1)\n    os.kill(os.getpid(), 9)\n"
                                  "time.sleep(100)"],
    ], default_mpi="openmpi", mpiexec=OPENMPI)
    start, hello, gather, exact, status, killed = result["steps"]
    assert start["raised"] is None and "Open MPI" in start["stdout"], start
    h1, h2 = hosts.names[1], hosts.names[2]
    assert sorted(hello["stdout"].splitlines()) == [f"[rank 0] {h1}", f"[rank 1] {h1}", f"[rank 2] {h2}",
                                                     f"[rank 3] {h2}"]
    assert gather["raised"] is None and exact["value"] == "[True, True, True, True]", (gather, exact)
    assert f"{h1}: ranks 0-1; {h2}: ranks 2-3" in status["stdout"], status["stdout"]
    name, text = killed["raised"]
    assert name == "RankError" and "Timeout" not in text, killed
    assert text.splitlines()[1] == (f"rank 3: RankLost: rank 3 died: its process on {h2} was ended by signal 9 "
                                    "(SIGKILL) (mpiexec reported it)"), text


def test_a_timeout_interrupts_the_ranks_on_other_hosts_and_keeps_the_world(hosts):
    result = drive(hosts, [
        ["line", "start -n 4"],
        ["cell", "", "kept = rank * 10"],
        ["cell", "--timeout 3", "import time\ntime.sleep(100)"],
        ["cell", "", "kept"],
    ])
    start, _, stopped, after = result["steps"]
    assert start["raised"] is None, start
    name, text = stopped["raised"]
    assert name == "RankError", text
    # their stacks come through the cell channel (the ranks' stack files are on their hosts)
    assert "ranks 0-3: Timeout: still running after 3 s, blocked in time.sleep(100) at cell line 3" in text, text
    assert after["raised"] is None and after["value"] == {"0": "0", "1": "10", "2": "20", "3": "30"}, after


def test_a_host_cut_off_mid_cell_is_named_with_its_ranks_and_the_notebook_goes_on(hosts):
    """Host 2's link is pulled while the cell runs: its ranks stop answering heartbeats, the cell fails naming
    them and the host, and the notebook still answers (%mpi status)."""
    pull = f"__import__('subprocess').run(['ip', '-n', {hosts.switch!r}, 'link', 'set', 'p2', 'down']).returncode"
    try:
        result = drive(hosts, [
            ["line", "start -n 4"],
            ["eval", pull],
            ["cell", "--timeout 60", "import time\ncomm.Barrier()\ntime.sleep(100)"],
            ["line", "status"],
        ], leftovers=False)
    finally:
        hosts.link_up(2)
    # the cut-off ranks could not be told to stop: they end on their own (their ssh session is gone, and
    # ipyparallel's engines give up after 50 missed heartbeat checks)
    wait_for(lambda: not hosts.pids_on(2), "the cut-off host's processes ending", 150)
    start, pulled, cut, status = result["steps"]
    assert start["raised"] is None and pulled["value"] == "0", (start, pulled)
    name, text = cut["raised"]
    assert name == "RankError" and "Timeout" not in text, text
    assert "stopped answering ipyparallel's heartbeats" in text and hosts.names[2] in text, text
    assert "dead" in status["stdout"] and status["raised"] is None, status


def test_the_stop_button_interrupts_ranks_on_other_hosts_in_python_and_in_mpi_and_keeps_the_world(hosts):
    """The kernel's Stop button is a SIGINT to the notebook's process: sent while ranks on two other hosts run
    Python, then while rank 0 (host 1) waits in MPI for rank 2 (host 2), which waits for it. Each time every
    rank is interrupted, said where it was, and the world with its variables stays."""
    marks = [hosts.dir / f"stop-{n}" for n in range(2)]
    python = f"import time\nif rank == 3:\n    open({str(marks[0])!r}, 'w').close()\nwhile True:\n    time.sleep(0.05)"
    mpi = (f"if rank == 0:\n    comm.recv(source=2)\nelif rank == 2:\n    open({str(marks[1])!r}, 'w').close()\n"
           "    comm.recv(source=0)\nelse:\n    comm.Barrier()")
    steps = [["line", "start -n 4"], ["cell", "", "kept = rank * 10"], ["cell", "", python], ["cell", "", mpi],
             ["cell", "", "comm.allreduce(kept)"]]
    process = hosts.run(0, notebook(hosts, steps), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for mark in marks:
            wait_for(mark.exists, f"the cell that makes {mark.name} running", 120)
            time.sleep(0.5)  # let the cell go on into the loop or the wait
            process.send_signal(signal.SIGINT)  # what the Stop button sends the kernel
        stdout, stderr = process.communicate(timeout=240)
    finally:
        process.kill()
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, stdout[-3000:] + stderr[-3000:]
    start, _, in_python, in_mpi, after = json.loads(lines[-1].removeprefix("RESULT "))["steps"]
    assert start["raised"] is None, start
    name, text = in_python["raised"]
    assert name == "Interrupted" and "time.sleep(0.05) at cell line 6" in text, in_python  # a KeyboardInterrupt
    assert "ranks 0-3: KeyboardInterrupt: interrupted" in text, text
    name, text = in_mpi["raised"]
    assert name == "Interrupted", in_mpi
    assert "blocked in comm.recv(source=2) at cell line 3" in text and "comm.recv(source=0)" in text, text
    assert after["raised"] is None and after["value"] == {str(r): "60" for r in range(4)}, after
    assert hosts.left_behind() == {}


def test_a_killed_notebook_leaves_no_process_on_any_host(hosts):
    """The notebook's process is killed (SIGKILL) while its ranks on two other hosts run a cell: its world's
    watcher ends mpiexec, and with it every rank on every host."""
    running = hosts.dir / "cell-running"
    steps = [["line", "start -n 4"],
             ["cell", "", f"import time\nif rank == 3:\n    open({str(running)!r}, 'w').close()\ntime.sleep(100)"]]
    process = hosts.run(0, notebook(hosts, steps), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(running.exists, "the cell running on every rank", 90)
    finally:
        process.kill()
        process.wait(timeout=30)
    wait_for(lambda: not any(hosts.pids_on(i) for i in range(hosts.n)), "no process left on any host", 60)


def test_a_host_that_refuses_ssh_at_start_is_a_clear_error(hosts):
    hosts.link_down(2)
    try:
        result = drive(hosts, [["line", "start -n 4"]], timeout=120)
    finally:
        hosts.link_up(2)
    (start,) = result["steps"]
    assert start["raised"] is not None, start
    name, text = start["raised"]
    assert name == "MPIError" and "mpiexec exited while the world was starting" in text, text
    assert f"ssh: connect to host {hosts.names[2]} port 22" in text, text
    assert "Traceback" not in text


def test_a_notebook_killed_while_its_world_starts_leaves_no_process_on_any_host(hosts):
    process = hosts.run(0, notebook(hosts, [["line", "start -n 4"]]), stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
    try:  # the ranks' engines run on both hosts, before they all registered
        wait_for(lambda: all(engines_on(hosts, i) == 2 for i in (1, 2)), "ranks starting on hosts 1 and 2", 60)
    finally:
        process.kill()
        process.wait(timeout=30)
    wait_for(lambda: not any(hosts.pids_on(i) for i in range(hosts.n)), "no process left on any host", 60)


def engines_on(hosts, i):
    """How many ipyparallel engines run on host *i*."""
    count = 0
    for pid in hosts.pids_on(i):
        try:
            count += "ipyparallel.engine" in psutil.Process(pid).cmdline()  # the nanny's is ...engine.nanny
        except psutil.NoSuchProcess:
            pass
    return count


# on rank 3: its large reply's sealed chunks are made as usual, and the rank is killed once the 8th of them (of 32)
# is on its way, half a second later (the marker that announces the reply, and some chunks, have reached the
# notebook); the rest never comes
KILL_MID_SEND = """
import os, time, numpy as np
big = np.ones(1 << 24 if rank == 3 else 1, dtype=np.float32)
if rank == 3:
    import mpinb.wire.bulk as bulk
    seal = bulk.Sealer.seal
    def seal_then_die(self, frames):
        for index, chunk in enumerate(seal(self, frames)):
            if index == 8:
                time.sleep(0.5)
                os.kill(os.getpid(), 9)
            yield chunk
    bulk.Sealer.seal = seal_then_die
"""


def test_a_rank_that_dies_in_the_middle_of_a_large_reply_fails_the_cell_without_waiting_for_the_rest(hosts):
    """The notebook reads a large reply's sealed chunks as they come, between its other checks: the death is
    named as any other, not after the bulk socket's silence gives the reply up (no reply counted lost)."""
    result = drive(hosts, [
        ["line", "start -n 4"],
        ["cell", "--gather big --no-inspect", KILL_MID_SEND],
        ["eval", f"dict({WORLD}.channel.verifier.rejected)"],
    ])
    start, killed, rejected = result["steps"]
    assert start["raised"] is None, start
    assert killed["raised"] and killed["raised"][0] == "RankError", killed
    assert killed["raised"][1].splitlines()[1].startswith("rank 3: RankLost: rank 3 died"), killed["raised"][1]
    assert rejected["value"] == "{}", rejected  # nothing given up as lost, nothing refused


WORLD = "get_ipython().magics_manager.registry['MPIMagics'].world"
SOURCE = "secret_recipe = 'mpinb-source-7f3a9c'\nprint('mpinb-output-' + str(41 * 3))"


def test_what_crosses_the_hosts_links_holds_neither_key_nor_source_and_a_replay_is_refused(hosts):
    """An eavesdropper on the notebook host's link, from before the world starts to its end, sees neither the
    channel's key nor a cell's source nor its output; replaying the ranks' captured stream to the notebook on a
    new connection is refused at the CurveZMQ handshake and shows nothing. A plain-text message sent across the
    same link during the capture is found in it: the capture sees what is in clear."""
    pcap = hosts.dir / "eth0.pcap"
    plain = f"__import__('socket').socket(2, 2).sendto(b'mpinb-plain-text-control', ({hosts.addresses[1]!r}, 9))"
    result = drive(hosts, [
        ["eval", "__import__('capture').start('eth0')"],
        ["line", "start -n 4"],
        ["eval", f"({WORLD}.channel.encrypt, bool({WORLD}.client.curve_serverkey))"],
        ["cell", "", SOURCE],
        ["cell", "--gather x", "import numpy as np\nx = np.full(1000, rank, dtype=np.int64)"],
        # 4 MB a rank: large enough to travel sealed with AES-GCM on the bulk socket rather than through CurveZMQ
        ["cell", "--gather big", "big = np.frombuffer(b'mpinb-gathered-5e1d' * (1 << 18), dtype=np.uint8).copy()"],
        ["eval", f"(sorted((rank, bytes(value[:19]), value.nbytes) for rank, value in big.items()), "
                 f"bool({WORLD}.channel.opener.last))"],
        ["eval", plain],
        ["eval", f"__import__('capture').stop({str(pcap)!r}, until=b'mpinb-plain-text-control')"],
        ["eval", f"({WORLD}.channel.key.hex(), {WORLD}.channel.salt.hex())"],
        ["eval", f"__import__('capture').watch({WORLD}.channel.events)"],
        ["eval", f"__import__('capture').replay({str(pcap)!r}, {hosts.addresses[0]!r}, "
                 f"int({WORLD}.channel.events_url.rsplit(':', 1)[1]))"],
        ["eval", "__import__('capture').refused()"],
        ["cell", "", "print('after')"],
        ["eval", f"dict({WORLD}.channel.verifier.rejected)"],
    ])
    steps = result["steps"]
    assert all(step["raised"] is None for step in steps), [step["raised"] for step in steps]
    assert steps[6]["value"] == repr(([(r, b"mpinb-gathered-5e1d", 19 << 18) for r in range(4)], True)), steps[5:7]
    del steps[5:7]  # the large gather: the steps after it are numbered as before
    encrypted, output, key = steps[2]["value"], steps[3]["stdout"], eval(steps[7]["value"])[0]
    assert encrypted == "(True, True)"  # the cell channel and ipyparallel's own messages
    assert "[rank 3] mpinb-output-123" in output
    wire = __import__("capture").payload(pcap)
    assert b"mpinb-plain-text-control" in wire  # the capture reads what is in clear
    assert len(wire) > 100_000  # it saw the world start, two cells and a gather
    for secret in (bytes.fromhex(key), key.encode(), b"mpinb-source-7f3a9c", b"secret_recipe",
                   b"mpinb-output-123", b"mpinb-output-", b"mpinb-gathered-5e1d"):
        assert secret not in wire, secret
    replayed, refused, after, rejected = (step["value"] for step in steps[9:])
    assert int(replayed) > 1000 and refused.startswith("'HANDSHAKE_FAILED"), (replayed, refused)
    assert sorted(steps[11]["stdout"].splitlines()) == [f"[rank {r}] after" for r in range(4)]  # nothing more
    assert rejected == "{}"  # nothing got past the handshake to be even looked at


def test_on_loopback_a_replayed_stream_gets_through_to_the_channel_and_each_message_is_dropped(hosts):
    """On one host the channel listens on loopback, unencrypted: there the signatures and message numbers are
    what stand between a local eavesdropper and the notebook. Replaying the ranks' captured output stream on a
    new connection delivers its messages (output, metrics, the reply): every one is dropped as a replay, and
    none is shown or recorded."""
    pcap = hosts.dir / "lo.pcap"
    steps = [
        ["eval", "__import__('capture').start('lo')"],
        ["line", "start -n 2"],
        ["eval", f"{WORLD}.channel.encrypt"],
        ["cell", "", SOURCE + "\nimport mpinb\nfor step in range(5):\n    mpinb.report(step=step, loss=1.0)"],
        # a frame after every one of the cell's: once the capture saw it, it saw them all (without it, stop
        # waited its 30 s for a frame that never came)
        ["eval", "__import__('socket').socket(2, 2).sendto(b'mpinb-plain-text-control', ('127.0.0.1', 9))"],
        ["eval", f"__import__('capture').stop({str(pcap)!r}, until=b'mpinb-plain-text-control')"],
        ["eval", f"__import__('capture').replay({str(pcap)!r}, '127.0.0.1', "
                 f"int({WORLD}.channel.events_url.rsplit(':', 1)[1]))"],
        ["eval", f"__import__('capture').dropped({WORLD}.channel)"],
        ["cell", "", "print('after')"],
        ["eval", "len(get_ipython().magics_manager.registry['MPIMagics'].history)"],
    ]
    done = hosts.output(0, [sys.executable, str(DRIVER), json.dumps({"setup": {}, "steps": steps})], timeout=240)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    steps = json.loads(lines[-1].removeprefix("RESULT "))["steps"]
    assert all(step["raised"] is None for step in steps), [step["raised"] for step in steps]
    assert steps[2]["value"] == "False" and "[rank 1] mpinb-output-123" in steps[3]["stdout"]
    wire = __import__("capture").payload(pcap)
    assert b"mpinb-plain-text-control" in wire  # the capture went on until it saw the marker
    assert b"mpinb-output-123" in wire  # in clear on loopback: signed, not hidden
    dropped = eval(steps[7]["value"])
    assert dropped.get("replayed", 0) >= 1 and set(dropped) == {"replayed"}, dropped
    assert sorted(steps[8]["stdout"].splitlines()) == ["[rank 0] after", "[rank 1] after"]
    assert steps[9]["value"] == "10"  # each rank's 5 reports, once: the replayed ones were not taken
    assert hosts.pids_on(0) == []
