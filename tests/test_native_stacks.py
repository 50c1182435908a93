"""Native stacks on real worlds (py-spy): ``%mpi stacks`` names the MPI call or the C call a rank is in, at its cell
line; without py-spy it says how to get it and shows the Python frames; a rank that does not answer Stop is
reported with where it is in C."""

import _thread
import json
import re
import sys
import threading
from pathlib import Path

import pytest
from waiting import wait_for

from mpinb.notebook.diagnosis.native import py_spy
from mpinb.wire.ranks import parse_ranks

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]

# rank 0 waits in a barrier until rank 1, which waits for the test's file in Python, joins it
BARRIER = """\
import os, time
while rank == 1 and not os.path.exists({release!r}):
    time.sleep(0.05)
comm.Barrier()
"""

# rank 1 waits on a locked mutex in C, holding the GIL (ctypes.PyDLL), for 20 s: no interrupt or signal ends it
LOCK = """\
import ctypes, time
class timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]
libc, mutex = ctypes.PyDLL(None), ctypes.create_string_buffer(64)
libc.pthread_mutex_lock(mutex)
if rank == 1:
    libc.pthread_mutex_timedlock(mutex, ctypes.byref(timespec(int(time.time()) + 20, 0)))
comm.Barrier()
"""



@pytest.fixture
def needs_py_spy():
    """py-spy, which ``make test`` installs (the dev extra): missing, the tests that read native frames fail."""
    assert py_spy.py_spy() is not None, "py-spy is not installed: pip install -e '.[dev]' (make test does)"


def stacks_until(ip, capsys, line, seen, *, then=None, timeout=60):
    """``%mpi <line>`` asked from a thread while the test's cell runs, until its output shows *seen* (or *timeout*
    s pass); *then* is called after, either way. Returns a list that holds the last output once the thread ends."""
    shown = []

    def asked():
        ip.run_line_magic("mpi", line)
        shown[:] = [capsys.readouterr().out]
        return seen in shown[0]

    def ask():
        try:
            wait_for(asked, f"%mpi {line} to show {seen!r}", timeout, 0.2, required=False)
        finally:
            if then is not None:
                then()

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    return shown, thread


@pytest.mark.usefixtures("needs_py_spy")
def test_a_rank_in_a_barrier_shows_mpi_in_its_native_frames_and_its_cell_line(ip, world_of, mpi, capsys, tmp_path):
    world_of(2)
    release = tmp_path / "release"
    capsys.readouterr()
    shown, thread = stacks_until(ip, capsys, "stacks", "rank 0 is in MPI_", then=release.touch)
    mpi(BARRIER.format(release=str(release)), line="--timeout 120")
    thread.join(timeout=60)
    out = shown[0]
    assert re.search(r"^rank 0 is in MPI_Barrier \(libmpi[\w.]*\), called at cell line 5$", out, re.M), out
    frames = out.split("rank 0 is in", 1)[1]
    # Python and native frames merged, from the cell inwards: the cell's line, mpi4py's Barrier, then MPI's
    assert re.search(r'line 5.*\n  Barrier \(MPI\.[\w.-]+\.so\)\n  PMPI_Barrier \(libmpi[\w.]*\)\n', frames), out
    assert "rank 1 is" in out  # and the other rank, on a line of its own
    ip.run_line_magic("mpi", "stacks")  # between cells
    assert capsys.readouterr().out == "ranks 0-1 are waiting for the next cell\n"


@pytest.mark.usefixtures("needs_py_spy")
def test_stacks_of_some_ranks_only(ip, world_of, mpi, capsys, tmp_path):
    world_of(3)
    release = tmp_path / "release"
    capsys.readouterr()
    shown, thread = stacks_until(ip, capsys, "stacks 0,2", "ranks 0, 2 are in MPI_", then=release.touch)
    mpi(BARRIER.format(release=str(release)), line="--timeout 120")
    thread.join(timeout=60)
    # identical stacks merged under one label; rank 1 not asked for
    assert re.search(r"^ranks 0, 2 are in MPI_Barrier \(libmpi[\w.]*\), called at cell line 5$", shown[0], re.M), \
        shown[0]
    assert "rank 1" not in shown[0]


def test_stacks_with_no_py_spy_say_how_to_install_it_and_show_the_python_frames(ip, world_of, mpi, capsys, tmp_path,
                                                                                monkeypatch):
    world_of(2)
    monkeypatch.setenv(py_spy.PY_SPY, str(tmp_path / "no-py-spy-here"))
    release = tmp_path / "release"
    capsys.readouterr()
    shown, thread = stacks_until(ip, capsys, "stacks", "rank 0 is at cell line 5", then=release.touch)
    mpi(BARRIER.format(release=str(release)), line="--timeout 120")
    thread.join(timeout=60)
    out = shown[0]
    first, *rest = out.splitlines()
    assert first.startswith("[mpinb] no native frames") and "pip install py-spy" in first, out
    assert str(tmp_path / "no-py-spy-here") in first, out
    assert re.search(r"^rank 0 is at cell line 5\n  Cell In\[\d+\], line 5$", out, re.M), out  # faulthandler's
    assert "libmpi" not in out


@pytest.mark.usefixtures("needs_py_spy")
def test_a_rank_in_c_holding_the_gil_is_named_and_its_stop_report_says_where_in_c(ip, magics, world_of, mpi, capsys,
                                                                                 monkeypatch):
    world_of(2)
    monkeypatch.setattr(magics, "interrupt_grace", 1.0)
    capsys.readouterr()
    # %mpi stacks reads rank 1 while it holds the GIL (its own threads cannot answer), then Stop is pressed
    shown, thread = stacks_until(ip, capsys, "stacks 1", "called from ctypes", then=_thread.interrupt_main)
    with pytest.raises(KeyboardInterrupt) as raised:
        mpi(LOCK, line="--timeout 120")
    thread.join(timeout=60)
    assert re.search(r"^rank 1 is in libc \(libc\.so\.6\), called from ctypes at cell line 8$", shown[0], re.M), \
        shown[0]
    assert "  ffi_call (libffi" in shown[0], shown[0]
    error = raised.value
    text = str(error)
    # neither answered the interrupt; each one's report says where it is in C, its innermost native frames below
    assert re.search(r"rank 1: KeyboardInterrupt: interrupted, blocked in libc\.pthread_mutex_timedlock\(.*\) at cell "
                     r"line 8; did not answer the interrupt within 1 s \(stuck in C or MPI\); natively in libc "
                     r"\(libc\.so\.6\), called from ctypes", text), text
    assert re.search(r"rank 0: KeyboardInterrupt: .*; natively in MPI_Barrier \(libmpi[\w.]*\)", text), text
    shown = "\n".join(error._render_traceback_())
    assert "Where it was in native code (its innermost frames, most recent call last):" in shown, shown
    assert "  PMPI_Barrier (libmpi" in shown and "  ffi_call (libffi" in shown, shown
    assert mpi("rank") == {0: 0, 1: 1}  # the world mpinb started again in their place


# the real py-spy, but its first read of each process fails as its unwinding now and then does (libunwind losing a
# register of a thread caught between two states): what a full run of the suite met on rank 0 of a world
FAILS_ONCE = """#!/bin/sh
pid=$(echo "$@" | sed 's/.*--pid //')
if [ ! -e "{marks}/$pid" ]; then
    touch "{marks}/$pid"
    printf 'Error: Failed to get stack traces\n\nCaused by:\n    0: UNW_EBADREG: bad register number\n' >&2
    exit 1
fi
echo "$pid" >> "{marks}/read"
exec {py_spy} "$@"
"""


@pytest.mark.usefixtures("needs_py_spy")
def test_a_py_spy_whose_unwinding_fails_once_is_run_again_and_the_error_says_where_in_c(ip, magics, world_of, mpi,
                                                                                       monkeypatch, tmp_path):
    world = world_of(2)
    marks = tmp_path / "marks"
    marks.mkdir()
    wrapper = tmp_path / "py-spy"
    wrapper.write_text(FAILS_ONCE.format(marks=marks, py_spy=py_spy.py_spy()))
    wrapper.chmod(0o755)
    pids = {world.identities[rank]["pid"] for rank in (0, 1)}
    monkeypatch.setenv(py_spy.PY_SPY, str(wrapper))
    monkeypatch.setattr(magics, "interrupt_grace", 1.0)
    with pytest.raises(Exception) as raised:
        mpi(LOCK, line="--timeout 3")
    text = str(raised.value)
    assert re.search(r"rank 0: Timeout: .*; natively in MPI_Barrier \(libmpi[\w.]*\)", text), text
    assert re.search(r"rank 1: Timeout: .*; natively in libc \(libc\.so\.6\), called from ctypes", text), text
    assert {int(pid) for pid in (marks / "read").read_text().split()} == pids  # each read once more, and then read


@pytest.mark.usefixtures("needs_py_spy")
def test_a_rank_reading_itself_runs_py_spy_again_when_its_unwinding_fails_once(monkeypatch, tmp_path):
    """What a rank on another host does when asked for its native stack (``native_stack.own``), on this process."""
    import os

    from mpinb.rank.debug import native_stack

    marks = tmp_path / "marks"
    marks.mkdir()
    wrapper = tmp_path / "py-spy"
    wrapper.write_text(FAILS_ONCE.format(marks=marks, py_spy=py_spy.py_spy()))
    wrapper.chmod(0o755)
    monkeypatch.setenv(py_spy.PY_SPY, str(wrapper))
    frames, note = native_stack.own()
    assert note == "" and any(function == "test_a_rank_reading_itself_runs_py_spy_again_when_its_unwinding_fails_once"
                              for function, _, _, _ in frames), (note, frames)
    assert (marks / "read").read_text().split() == [str(os.getpid())]


def test_the_tables_name_a_ddp_backward_waiting_for_gloo_and_a_gloo_allreduce():
    """What py-spy read of a rank whose DDP backward waits for a peer (the frames of a real dump, innermost
    first), and of one inside gloo's allreduce: the one-line summaries the tables make of them."""
    from mpinb.notebook.diagnosis.native import NativeStack
    from mpinb.notebook.diagnosis.native.places import summary

    graph = "/env/lib/python3.11/site-packages/torch/autograd/graph.py"
    ddp = [("0x7f660f0a3f16", "/usr/lib/libc.so.6", 0, "libc.so.6"), ("pthread_cond_wait", "", 0, "libc.so.6"),
           ("std::condition_variable::wait", "", 0, "libstdc++.so.6.0.30"),
           ("c10d::Reducer::finalize_backward", "", 0, "libtorch_cpu.so"),
           ("torch::autograd::Engine::execute", "", 0, "libtorch_cpu.so"),
           ("THPEngine_run_backward", "", 0, "libtorch_python.so"), ("_engine_run_backward", graph, 979, None)]
    assert summary(NativeStack(0, ddp), who="rank 0") == \
        "rank 0 is waiting on a lock in pthread_cond_wait (libc.so.6), called from DDP's backward"
    gloo = [("0x7f1", "", 0, "libc.so.6"), ("gloo::transport::tcp::UnboundBuffer::waitRecv", "", 0, "libtorch_cpu.so"),
            ("void gloo::allreduce(gloo::AllreduceOptions&)", "", 0, "libtorch_cpu.so"),
            ("c10d::ProcessGroupGloo::AsyncAllreduceWork::run", "", 0, "libtorch_cpu.so"),
            ("c10d::Reducer::finalize_backward", "", 0, "libtorch_cpu.so"), ("_engine_run_backward", graph, 979, None)]
    assert summary(NativeStack(1, gloo), who="rank 1") == \
        "rank 1 is in gloo's allreduce (libtorch_cpu.so), called from DDP's backward"


def test_the_ranks_name_this_kernel_their_tracer_so_py_spy_may_read_them_under_yama(world_of):
    """Under Yama's ptrace_scope 1 only a process's ancestors may ptrace it, and py-spy (the kernel's child) is not
    the ranks' ancestor: each rank's launcher names the kernel, from ``$MPINB_TRACER``, which must say this kernel
    (host and pid) for the check before py-spy runs to let it."""
    from mpinb.wire.rank_files import TRACER_ENV, tracer

    world = world_of(2)
    for rank in world.ranks:
        pid = world.identities[rank]["pid"]
        with open(f"/proc/{pid}/environ", "rb") as environ:
            variables = dict(item.split(b"=", 1) for item in environ.read().split(b"\0") if b"=" in item)
        assert variables[TRACER_ENV.encode()].decode() == tracer()
        assert py_spy.refusal(pid) == ""


@pytest.mark.hosts
@pytest.mark.slow
@pytest.mark.usefixtures("needs_py_spy")
def test_ranks_on_other_hosts_that_do_not_answer_read_their_own_native_stacks():
    """The notebook on one host, its ranks on two others (tests/hosts.py), where it cannot ptrace them: each rank
    that did not answer runs py-spy on itself from its roll-call thread, which runs while the rank waits in MPI;
    the rank holding its GIL in C cannot, and its error says where it is in Python only."""
    from hosts import Hosts, setup_across

    with Hosts(3) as hosts:
        # each rank on h1 and h2 runs py-spy on itself: on a busy machine that takes seconds, so the notebook
        # gives them the whole of py-spy's own time limit (10 s), not the 5 s it waits by default
        steps = [["line", "start -n 4"], ["eval", "setattr(get_ipython().magics_manager.registry['MPIMagics'], "
                                                  "'interrupt_grace', 1.0) or setattr(__import__("
                                                  "'mpinb.notebook.diagnosis.native.py_spy', fromlist=['ASK_WAIT']), "
                                                  "'ASK_WAIT', 10.0)"], ["cell", "--timeout 3", LOCK]]
        config = {"setup": setup_across(hosts, (1, 2), 2), "steps": steps}
        driver = Path(__file__).with_name("multihost_driver.py")
        done = hosts.output(0, [sys.executable, str(driver), json.dumps(config)], timeout=200)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, f"the notebook's side printed no result:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        start, _, stuck = json.loads(lines[-1].removeprefix("RESULT "))["steps"]
    assert start["raised"] is None, start
    text = stuck["raised"][1]
    lines = {}  # rank -> the line of its error (identical errors share one)
    for line in text.splitlines():
        label = re.match(r"ranks? ([\d, -]+): ", line)
        for rank in parse_ranks(label.group(1), 4) if label else ():
            lines[rank] = line
    for rank in (0, 2, 3):  # in a Barrier: each read itself, on its host
        assert re.search(r"blocked in comm\.Barrier\(\) at cell line 9; did not answer the interrupt within 1 s \(stuck "
                         r"in C or MPI\); natively in \w", lines[rank]), text
    assert re.search(r"natively in MPI_Barrier \(libmpi[\w.]*\)$", text, re.M), text
    assert "did not answer the interrupt" in lines[1] and "natively" not in lines[1], text
