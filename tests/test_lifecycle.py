"""Start, stop, restart, status and preflight of real MPI worlds; nothing may be left running."""

import contextlib
import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import assert_all_gone, world_processes
from IPython.core.error import UsageError
from waiting import wait_for

from mpinb.errors import MPIError, NoMPI, RankError
from mpinb.notebook.world import status
from mpinb.notebook.world.cluster import World
from mpinb.notebook.world.ipp import process as ipp_process
from mpinb.notebook.world.mpis import library_version
from mpinb.widgets.status import status_widget

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]


def test_one_process_per_rank_and_stop_leaves_nothing(ip, magics, world_of, capsys):
    world = world_of(2)
    processes = world_processes(world)
    names = sorted(p.name() for p in processes)
    assert names.count("mpiexec") == 1 and names.count("hydra_pmi_proxy") == 1
    engines = [p for p in processes if p.cmdline()[1:3] == ["-m", "ipyparallel.engine"] and p.name() != "mpiexec"]
    assert sorted(p.pid for p in engines) == sorted(world.identities[r]["pid"] for r in world.ranks)
    ip.run_line_magic("mpi", "stop")
    assert "stopped" in capsys.readouterr().out
    assert_all_gone(processes)
    assert magics.world is None
    ip.run_line_magic("mpi", "stop")
    assert "no MPI world is running" in capsys.readouterr().out


def test_stop_ends_what_the_ranks_started_also_a_process_detached_from_their_session(ip, magics, world_of, mpi):
    """A helper a rank starts in a session of its own (a data server, a prefetcher) outlived the world: no signal
    to the ranks' process group reaches it. Every process of a world carries the world's mark in its
    environment, and stop ends what carries it, as it ends the controller's schedulers that ipyparallel forks
    while it starts."""
    world_of(2)
    started = mpi("import subprocess\nhelper = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
                  "helper.pid")
    helpers = [psutil.Process(pid) for pid in started.values()]
    controller = psutil.Process(ipp_process(magics.world.cluster.controller).pid)
    schedulers = controller.children(recursive=True)
    assert schedulers  # forked by the controller: found by their mark, listed or not
    ip.run_line_magic("mpi", "stop")
    try:
        assert_all_gone(helpers + schedulers)
    finally:
        for helper in helpers:  # this test's own, by pid, should the assertion fail
            with contextlib.suppress(psutil.NoSuchProcess):
                helper.kill()


def test_restart_gives_new_processes_and_keeps_names_unless_fresh(ip, magics, world_of, mpi):
    world = world_of(2)
    mpi("kept = 1")
    before = world_processes(world)
    old_pids = {world.identities[r]["pid"] for r in world.ranks}
    ip.run_line_magic("mpi", "restart")
    assert_all_gone(before)
    assert magics.world.size == 2
    assert not old_pids & {magics.world.identities[r]["pid"] for r in magics.world.ranks}
    assert mpi("kept") == {0: 1, 1: 1}
    ip.run_line_magic("mpi", "restart --fresh")
    assert mpi("'kept' in dir()") == {0: False, 1: False}
    ip.run_line_magic("mpi", "restart -n 3")
    assert mpi("size") == {0: 3, 1: 3, 2: 3}


def controller_setting(world, name):
    controller = next(p for p in world_processes(world) if "mpinb.notebook.world.controller" in " ".join(p.cmdline()))
    return int(next(arg for arg in controller.cmdline() if arg.startswith(f"--{name}=")).split("=")[1])


def test_small_worlds_beat_fast_to_register_sooner_and_every_world_waits_as_long_for_a_silent_rank(world_of, mpi):
    """A rank's registration completes on the hub's next heartbeat: small worlds beat every 100 ms, large ones
    less often (the controller's load grows with ranks / period); a rank is given up after 3.5 s of silence
    whatever the period, so a short period is no quicker to declare a rank on a busy host dead."""
    for size, period in ((2, 100), (20, 160)):
        world = world_of(size)
        assert controller_setting(world, "HeartMonitor.period") == period
        misses = controller_setting(world, "HeartMonitor.max_heartmonitor_misses")
        assert 3500 <= misses * period < 3500 + period
        assert mpi("rank")[size - 1] == size - 1


def test_cell_magic_starts_a_world_on_first_use(ip, magics, mpi, capsys):
    if magics.world is not None:
        ip.run_line_magic("mpi", "stop")
    assert mpi("size", line="-n 3") == {0: 3, 1: 3, 2: 3}
    assert "MPI world of 3 ranks started" in capsys.readouterr().out


def test_default_ranks_is_configurable(ip, magics, mpi):
    ip.run_line_magic("mpi", "stop")
    ip.run_line_magic("config", "MPIMagics.default_ranks = 1")
    try:
        assert mpi("size") == {0: 1}
    finally:
        ip.run_line_magic("config", "MPIMagics.default_ranks = 2")


def test_status_as_text_in_a_terminal(ip, world_of, capsys):
    world = world_of(2)
    ip.run_line_magic("mpi", "status")
    out = capsys.readouterr().out
    assert "MPI world of 2 ranks (MPICH" in out
    lines = out[out.index("MPI world of 2 ranks (MPICH"):].strip().splitlines()
    assert lines[0].endswith("; idle")  # the world's lifecycle state
    assert lines[1] == f"{socket.gethostname()}: ranks 0-1"  # which ranks run on which host
    assert lines[2].split() == ["rank", "host", "pid", "threads", "state"]
    for rank, line in zip(world.ranks, lines[3:]):
        assert line.split() == [str(rank), world.identities[rank]["host"], str(world.identities[rank]["pid"]),
                                str(world.identities[rank]["threads"]), "idle"]


def test_status_widget_shows_every_rank(world_of):
    world = world_of(2)
    rows = status.rank_states(world)
    widget = status_widget(rows, status.describe(world))
    header, grid = widget.children
    values = [getattr(cell, "value", "") for cell in grid.children]
    assert len(values) == 5 * (len(rows) + 1)  # rank, host, pid, threads, state
    assert str(world.identities[1]["pid"]) in values
    assert "MPI world of 2 ranks" in header.value


def test_missing_mpiexec_is_a_usage_error_saying_what_to_do(ip, magics, tmp_path):
    ip.run_line_magic("mpi", "stop")
    with pytest.raises(UsageError, match=r"(?s)mpiexec not found.*pip install mpinb\[mpich\]"):
        ip.run_line_magic("mpi", f"start -n 2 --mpiexec {tmp_path / 'no-such-mpiexec'}")
    assert magics.world is None


def test_python_without_mpi4py_is_refused_saying_why(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    with pytest.raises(NoMPI, match="mpi4py cannot load an MPI library"):
        library_version(str(tmp_path / "bare" / "bin" / "python"))


def test_mpiexec_of_another_mpi_is_detected(ip, magics, tmp_path):
    """An mpiexec that starts N unconnected processes (what a foreign MPI's mpiexec does) is refused."""
    launcher = tmp_path / "foreign-mpiexec"
    launcher.write_text(textwrap.dedent("""\
        #!/usr/bin/env bash
        n=$2; shift 2
        for i in $(seq "$n"); do "$@" & done
        wait
    """))
    launcher.chmod(0o755)
    ip.run_line_magic("mpi", "stop")
    with pytest.raises(MPIError, match="does not belong to the MPI library"):
        ip.run_line_magic("mpi", f"start -n 2 --mpiexec {launcher}")
    assert magics.world is None
    leftovers = [p for p in psutil.Process().children(recursive=True) if "ipyparallel" in " ".join(p.cmdline())]
    assert_all_gone(leftovers)
    # the same refusal, on a World this test holds: its ranks' MPI segments (and only theirs) are gone
    world = World(2, mpiexec=str(launcher), progress=False)
    with pytest.raises(MPIError, match="does not belong to the MPI library"):
        world.start()
    mine = [path for path in world.footprint.shared_files_seen if os.path.basename(path).startswith("mpich_shm_")]
    assert mine and not [path for path in mine if os.path.exists(path)]


def test_a_start_interrupted_while_the_controller_starts_leaves_nothing_and_says_nothing_later(caplog):
    """Interrupted while ipyparallel's client waited for the controller's connection files, the start left that
    wait's coroutine pending, and asyncio later said 'Task was destroyed but it is pending!' with ipyparallel's
    internals, in whatever cell ran when it was collected."""
    class Line:  # the start's progress line: on "launching", the controller has only just been started
        def update(self, text, done=None, total=None, *, force=False):
            if text.startswith("launching"):
                threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()  # the Stop button

        def close(self):
            pass

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    world = World(2, progress=Line)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        with pytest.raises(KeyboardInterrupt):
            world.start()
        gc.collect()
    assert not [record for record in caplog.records if "destroyed" in record.getMessage()], caplog.text
    assert not world.running
    started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert_all_gone(started)


def test_ranks_on_this_host_read_a_whole_copy_of_the_controllers_engine_file(world_of):
    """The controller writes its connection file in place; ranks that start while it does read it as soon as it
    exists, and one that found it empty exited (JSONDecodeError, 'only 0 of 4 ranks registered'). They wait for a
    copy the notebook makes once the file is whole, and which appears at once (os.replace)."""
    from mpinb.notebook.world import ipp

    world = world_of(2)
    copy = os.path.join(world.status_dir, "engine.json")
    with open(copy) as mine, open(ipp.engine_connection_file(world.cluster)) as controllers:
        assert json.load(mine) == json.load(controllers)
    engines = [p for p in world_processes(world) if "ipyparallel.engine" in p.cmdline()]
    assert engines and all(f"--IPEngine.url_file={copy}" in p.cmdline() for p in engines)


def test_a_dead_rank_leaves_no_process_and_no_shared_memory(ip, magics, world_of, mpi):
    world = world_of(2)
    shared = set(world.footprint.shared_files)
    assert any(os.path.basename(path).startswith("mpich_shm_") for path in shared)  # MPI's own segment
    processes = world_processes(world)
    with pytest.raises(RankError, match="died"):
        mpi("import os\nif rank == 1:\n    os._exit(1)\nimport time\ntime.sleep(30)")
    ip.run_line_magic("mpi", "stop")
    assert_all_gone(processes)
    assert not [path for path in shared if os.path.exists(path)]


def test_kernel_exit_leaves_no_process(tmp_path):
    script = textwrap.dedent("""\
        import json, psutil
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "mpinb")
        ip.run_cell_magic("mpi", "-n 2", "x = rank")
        pids = [p.pid for p in psutil.Process().children(recursive=True)]
        print("PIDS", json.dumps(pids), flush=True)
        # exit without %mpi stop: the world must go with the process
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stderr
    pids = json.loads(done.stdout.split("PIDS", 1)[1].splitlines()[0])
    assert len(pids) >= 5  # controller, mpiexec, hydra_pmi_proxy, two engines
    survivors = []
    for pid in pids:
        try:
            survivors.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    assert_all_gone(survivors)


@pytest.mark.notebook
@pytest.mark.parametrize("end", ["shutdown", "restart", "kill", "kill after a rank died"])
def test_kernel_shutdown_restart_or_kill_leaves_no_orphans(end):
    """A real kernel through jupyter_client: whatever ends it, every process its world started is gone, and the
    folder its ranks kept their variables in (also when the world had died first, its variables kept for a
    restart that never came)."""
    from jupyter_client.manager import KernelManager

    outputs = []
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        reply = client.execute_interactive(
            "%load_ext mpinb\n%mpi start -n 2\nimport json\n"
            "world = get_ipython().magics_manager.registry['MPIMagics'].world\n"
            "print('PIDS', json.dumps([p.pid for p in world.processes]))\nprint('KEPT', world.kept_state.root)\n"
            # a helper each rank detaches from its session, which no signal to the ranks' group reaches
            "helpers = get_ipython().run_cell_magic('mpi', '--no-stream', \"import subprocess\\n\"\n"
            "    \"subprocess.Popen(['sleep', '600'], start_new_session=True).pid\")\n"
            "print('HELPERS', json.dumps(list(helpers.values())))",
            timeout=120, output_hook=lambda msg: outputs.append(msg))
        assert reply["content"]["status"] == "ok"
    finally:
        client.stop_channels()
    text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
    pids = json.loads(text.split("PIDS", 1)[1].splitlines()[0])
    kept = Path(text.split("KEPT ", 1)[1].splitlines()[0])  # where the ranks keep their variables
    helpers = [psutil.Process(pid) for pid in json.loads(text.split("HELPERS", 1)[1].splitlines()[0])]
    names = {psutil.Process(pid).name() for pid in pids}
    assert {"mpiexec", "hydra_pmi_proxy"} <= names and len(pids) >= 6 and kept.is_dir()
    processes = [psutil.Process(pid) for pid in pids]
    if end == "kill after a rank died":
        client = manager.client()
        client.start_channels()
        try:
            reply = client.execute_interactive("%%mpi\nimport os\nif rank == 1:\n    os.kill(os.getpid(), 9)\n"
                                               "comm.Barrier()", timeout=120)
            assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "RankError"
            assert kept.is_dir()  # there after the death, for a restart (until the kernel's end is seen)
        finally:
            client.stop_channels()
    if end == "shutdown":
        manager.shutdown_kernel(now=False)
    elif end == "restart":
        manager.restart_kernel(now=False)
        manager.shutdown_kernel(now=False)
    else:
        manager.shutdown_kernel(now=True)  # SIGKILL: no atexit runs in the kernel
    try:
        assert_all_gone(processes + helpers, timeout=20)
    finally:
        for helper in helpers:  # this test's own, by pid, should the assertion fail
            with contextlib.suppress(psutil.NoSuchProcess):
                helper.kill()
    # the ranks' kept variables are the kernel's to restore: gone with it, with its watcher (it polls once a second)
    wait_for(lambda: not kept.exists(), "the killed kernel's kept variables to be removed", 20, 0.2)

