"""Stops at every moment of a cell, through a real kernel (jupyter_client, as JupyterLab drives it): during the
ranks' work, once the magic has returned (post-run callbacks, the views being sealed, ipykernel building and
sending the reply), right after a world started, and in a plain cell. Whatever the moment, every execute request
gets its reply, no frame of mpinb, ipyparallel or matplotlib shows, and the next cell runs; in the user's code a
Stop still raises KeyboardInterrupt. The same in a shell without a kernel (terminal IPython)."""

import re
import signal
import threading
import time

import pytest
from conftest import leftover_ranks, new_world_tag

from kernel_session import ANSI, jupyter_client_kernel
from mpinb.notebook import stops


REPLY_WITHIN = 60  # seconds: a reply later than this is a hang (a front end then waits for ever)
MATPLOTLIB_FRAME = re.compile(r"site-packages/matplotlib/")

# the last words of a %%mpi cell: rank 0 prints them once every rank is done, so the magic returns right after
LAST_WORDS = "comm.Barrier()\nif rank == 0:\n    print('last words', flush=True)"
LAST = "[rank 0] last words"


def through_a_kernel(test):
    """A test through a real kernel and its world: the markers such tests carry."""
    return pytest.mark.mpi(pytest.mark.slow(pytest.mark.notebook(test)))


def clean(shown):
    """*shown*, checked: no frame of mpinb, ipyparallel or matplotlib, no callback that failed."""
    assert not shown.internal_frames(), shown.text
    assert not MATPLOTLIB_FRAME.search(shown.text), shown.text
    assert "Error in callback" not in shown.text, shown.text
    return shown


def usable(k):
    """The kernel runs the next cell, on every rank of a 2-rank world."""
    shown = clean(k.run("%%mpi\n(size, rank)", timeout=REPLY_WITHIN))
    assert shown.status == "ok" and "[rank 0] (2, 0)" in shown.text and "[rank 1] (2, 1)" in shown.text, shown.text


@pytest.fixture(scope="module")
def session():
    tag = new_world_tag()
    with jupyter_client_kernel() as k:
        assert k.run("%load_ext mpinb\n%mpi start -n 2").status == "ok"
        yield k
        k.run("%mpi stop", timeout=REPLY_WITHIN)
    assert not leftover_ranks(tag)


@through_a_kernel
@pytest.mark.parametrize("gap", [0.2, 0.4, 0.8, 1.6])
def test_two_stops_during_a_loop_of_broadcasts_each_get_a_reply(session, gap):
    """The first Stop interrupts the ranks; the second lands while the cell still waits for them, or once the cell
    has shown its interrupt, depending on *gap*: either way the request is answered."""
    shown = clean(session.run("%%mpi\nimport numpy as np\nbuf = np.zeros(1000)\nprint('looping', flush=True)\n"
                              "for i in range(10**8):\n    comm.Bcast(buf, root=0)",
                              stops=(0.3, 0.3 + gap), after="[rank 1] looping", timeout=REPLY_WITHIN))
    assert shown.status == "error" and shown.ename == "Interrupted", shown.text
    usable(session)
    # the root's eager broadcasts left in flight by the interrupt can reach a later collective of the other rank
    # ("Message truncated"): a fresh world for the tests after this one
    assert session.run("%mpi restart --fresh", timeout=REPLY_WITHIN).status == "ok"


# moments after the magic returned, each made to last 2 s: IPython's post-run callbacks (a callback of the user's),
# and ipykernel flushing the output and sending the reply (its own setting)
AFTER_THE_MAGIC = {
    "a slow post-run callback": ("import time\ndef slow_after(result):\n    time.sleep(2)\n"
                                 "get_ipython().events.register('post_run_cell', slow_after)",
                                 "get_ipython().events.unregister('post_run_cell', slow_after)"),
    "the kernel sending the reply": ("get_ipython().kernel._execute_sleep = 2.0",
                                     "get_ipython().kernel._execute_sleep = 0.0005"),
}


@through_a_kernel
@pytest.mark.parametrize("moment", list(AFTER_THE_MAGIC))
def test_a_stop_once_the_magic_returned_is_let_go_and_the_reply_comes(session, moment):
    """A Stop once the magic has returned: nothing to stop, the cell keeps its result, and the reply still comes."""
    setup, undo = AFTER_THE_MAGIC[moment]
    assert session.run(setup).status == "ok"
    try:
        shown = clean(session.run("%%mpi\n" + LAST_WORDS, stops=(0.5,), after=LAST, timeout=REPLY_WITHIN))
        assert shown.status == "ok" and "KeyboardInterrupt" not in shown.text, shown.text
    finally:
        session.run(undo, timeout=REPLY_WITHIN)
    usable(session)


@through_a_kernel
@pytest.mark.parametrize("delays", [(0.05,), (0.05, 0.15, 0.3), (0.2, 0.6)])
def test_stops_while_views_are_sealed_are_let_go(session, delays):
    """The cell's charts are replaced by their static renderings (matplotlib) after it: a callback of the user's,
    put before mpinb's, says when that begins, and the Stops land in it."""
    assert session.run("def sealing(result):\n    print('sealing now', flush=True)\n"
                       "get_ipython().events.callbacks['post_run_cell'].insert(0, sealing)").status == "ok"
    try:
        shown = clean(session.run(
            "%%mpi\nimport mpinb\nfor step in range(200):\n"
            "    mpinb.report(step=step, loss=1.0 / (step + 1), accuracy=step / 200, lr=0.1, grad=rank + step)\n"
            + LAST_WORDS, stops=delays, after="sealing now", timeout=REPLY_WITHIN))
        assert shown.status == "ok" and "KeyboardInterrupt" not in shown.text, shown.text
    finally:
        session.run("get_ipython().events.unregister('post_run_cell', sealing)", timeout=REPLY_WITHIN)
    usable(session)


@through_a_kernel
@pytest.mark.parametrize("delays", [(0.0,), (0.05,), (0.0, 0.1, 0.3)])
def test_a_stop_right_after_a_world_started_is_let_go(session, delays):
    """Stops from the moment "started in ..." shows: the start is over, they land in what follows it."""
    assert session.run("%mpi stop", timeout=REPLY_WITHIN).status == "ok"
    shown = clean(session.run("%mpi start -n 2", stops=delays, after="started in", timeout=REPLY_WITHIN))
    assert shown.status == "ok" and "KeyboardInterrupt" not in shown.text, shown.text
    usable(session)


@through_a_kernel
@pytest.mark.parametrize("presses", [(0.1, 0.5), (0.9, 1.3)])
def test_stops_during_a_restart_each_get_a_reply(session, presses):
    shown = clean(session.run("%mpi restart", stops=presses, timeout=REPLY_WITHIN))
    assert shown.status == "ok" or shown.ename == "StartInterrupted", shown.text
    shown = clean(session.run("%%mpi\nsize", timeout=REPLY_WITHIN))  # starts the world again if it had to
    assert shown.status == "ok" and "[rank 1] 2" in shown.text, shown.text
    usable(session)


@through_a_kernel
def test_a_stop_in_a_plain_cell_still_raises_keyboard_interrupt(session):
    shown = clean(session.run("import time\nprint('sleeping', flush=True)\ntime.sleep(30)\nprint('woke')",
                              stops=(0.3,), after="sleeping", timeout=REPLY_WITHIN))
    assert shown.status == "error" and shown.ename == "KeyboardInterrupt", shown.text
    assert "woke" not in shown.text.splitlines(), shown.text
    assert "time.sleep(30)" in shown.text  # where in the user's cell
    # the user's code after one of mpinb's line magics too
    shown = clean(session.run("%mpi status\nimport time\nprint('sleeping', flush=True)\ntime.sleep(30)",
                              stops=(0.3,), after="sleeping", timeout=REPLY_WITHIN))
    assert shown.status == "error" and shown.ename == "KeyboardInterrupt", shown.text
    usable(session)


# ---------------------------------------------------------------------- a shell without a kernel (terminal IPython)

def stop_soon(delay=0.3):
    """The Stop button (Ctrl-C) *delay* seconds from now: a SIGINT to this process's main thread."""
    threading.Timer(delay, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)).start()


def until_stop_counted(timeout=60):
    """Busy until mpinb's handler has counted a Stop pressed from now on (a Stop it raised goes through)."""
    pressed, deadline = stops.presses(), time.monotonic() + timeout
    while stops.presses() == pressed:
        assert time.monotonic() < deadline, "no Stop was counted"


def test_a_stop_in_a_cell_of_a_plain_shell_raises_as_pythons_own_and_the_handler_is_put_back(ip, capsys):
    before = signal.getsignal(signal.SIGINT)
    ip.user_ns["stop_soon"] = stop_soon
    result = ip.run_cell("import time\nstop_soon()\ntime.sleep(30)\nprint('woke')")
    shown = ANSI.sub("", capsys.readouterr().out)
    assert isinstance(result.error_in_exec, KeyboardInterrupt) and "time.sleep(30)" in shown, shown
    assert "stops.py" not in shown and "mpinb" not in shown and "woke" not in shown.splitlines(), shown
    assert signal.getsignal(signal.SIGINT) is before  # between cells, what it was


def test_a_stop_in_a_post_run_callback_of_a_plain_shell_is_let_go(ip, capsys):
    done = []

    def late(result):  # before mpinb's own post-run callbacks, as a slow one of the user's may be
        stop_soon(0.05)
        until_stop_counted()
        done.append("end")

    ip.events.callbacks["post_run_cell"].insert(0, late)
    try:
        result = ip.run_cell("x = 1")
    finally:
        ip.events.unregister("post_run_cell", late)
    shown = capsys.readouterr().out
    assert result.success and done == ["end"] and "KeyboardInterrupt" not in shown, shown
    assert "Error in callback" not in shown, shown


def test_a_stop_in_mpinbs_own_code_outside_its_safe_points_is_let_go(ip, magics, capsys, monkeypatch):
    """A Stop that lands in mpinb's code where it does not defer Stops (here %mpi status, made slow) has no safe
    point to act at: it is let go, and the command ends as usual."""
    def slow_status():
        stop_soon(0.05)
        until_stop_counted()  # the Stop lands here, with mpinb's %mpi status on the stack
        print("status shown")

    monkeypatch.setattr(magics.commands, "show_status", slow_status)
    result = ip.run_cell("%mpi status")
    shown = capsys.readouterr().out
    assert result.success and "status shown" in shown and "KeyboardInterrupt" not in shown, shown
