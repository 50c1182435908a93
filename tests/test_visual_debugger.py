"""JupyterLab's debugger panel on the ranks, through a real kernel and its Debug Adapter Protocol, the requests
sent as JupyterLab sends them (``tests/dap_client.py``): breakpoints clicked in a ``%%mpi`` cell, the stopped
rank's frames and variables, stepping, exception filters, a post-mortem, Stop and ``--timeout`` while a rank is
stopped, switching the panel off; ordinary cells keep the kernel's own debugger, and pdb on a rank still works.

One kernel and one world of 2 ranks for the module; the debugger is switched on before mpinb is loaded and the
world started, as a user who clicks the bug icon first does."""

import re

import pytest
from conftest import leftover_ranks, new_world_tag

from dap_client import DebugClient
from kernel_session import kernel

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.notebook]

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
RANK_THREAD = 1 << 40  # the first rank's thread id (mpinb/wire/debug_ids.py); the kernel's own are small


@pytest.fixture(scope="module")
def dap():
    tag = new_world_tag()
    with kernel() as session:
        client = DebugClient(session.client)
        client.session = session
        client.start()  # before mpinb is loaded and the world started
        msg_id = client.execute("%load_ext mpinb\n%mpi start -n 2")
        assert client.wait(msg_id, 180), "the world did not start with the debugger on"
        assert "MPI world of 2 ranks started" in client.output(msg_id), client.output(msg_id)
        yield client
        client.wait(client.execute("%mpi stop"), 60)
        client.close()
    assert not leftover_ranks(tag)


def text(dap, msg_id):
    return ANSI.sub("", dap.output(msg_id))


def stop(dap, timeout=60):
    """The next ``stopped`` event's body, with the stopped thread's frames as ``stack``."""
    event = dap.event("stopped", timeout)
    assert event is not None, "no rank stopped"
    body = event["body"]
    frames = dap.request("stackTrace", threadId=body["threadId"])
    assert frames["success"], (frames.get("message"), body)
    body["stack"] = frames["body"]["stackFrames"]
    return body


def variables(dap, frame):
    """``{name: value}`` of every scope of *frame* (a frame of ``stackTrace``), innermost scope first."""
    seen = {}
    for scope in dap.request("scopes", frameId=frame["id"])["body"]["scopes"]:
        for variable in dap.request("variables", variablesReference=scope["variablesReference"])["body"]["variables"]:
            seen.setdefault(variable["name"], variable["value"])
    return seen


def run_to_end(dap, msg_id, command="continue"):
    """Resume as JupyterLab's Continue button does: the thread it saw stop is forgotten first, so it names the
    kernel's thread 1."""
    assert dap.request(command, threadId=1)["success"]
    assert dap.wait(msg_id, 120), "the cell did not end after Continue"
    return text(dap, msg_id)


def test_breakpoints_in_a_mpi_cell_stop_the_ranks_and_the_panel_steps_through_rank_0(dap):
    code = ("%%mpi\nx = rank * 10\ndef scaled(v):\n    w = v * 2\n    return w\ny = scaled(x) + 1\n"
            "print('y is', y)")
    path, reply = dap.breakpoints(code, [3, 6])
    assert [point["verified"] for point in reply["body"]["breakpoints"]] == [True, True]
    msg_id = dap.execute(code)

    first = stop(dap)
    assert first["threadId"] == RANK_THREAD and first["reason"] == "breakpoint"
    assert [(f["name"], f["line"], f["source"]["path"]) for f in first["stack"]] == [("cell (rank 0)", 3, path)]
    assert variables(dap, first["stack"][0])["x"] == "0"
    assert "In" not in variables(dap, first["stack"][0])  # IPython's own names are not the user's

    assert dap.request("next", threadId=first["threadId"])["success"]
    assert [f["line"] for f in stop(dap)["stack"]] == [6]
    assert dap.request("stepIn", threadId=first["threadId"])["success"]
    inside = stop(dap)
    assert [(f["name"], f["line"]) for f in inside["stack"]] == [("scaled (rank 0)", 4), ("cell (rank 0)", 6)]
    assert variables(dap, inside["stack"][0])["v"] == "0"
    assert dap.request("next", threadId=first["threadId"])["success"]
    assert variables(dap, stop(dap)["stack"][0])["w"] == "0"
    assert dap.request("stepOut", threadId=first["threadId"])["success"]
    assert [(f["name"], f["line"]) for f in stop(dap)["stack"]] == [("cell (rank 0)", 7)]

    out = run_to_end(dap, msg_id)
    assert "[rank 0] y is 1" in out and "[rank 1] y is 21" in out, out
    dap.breakpoints(code, [])


def test_the_panel_shows_the_rank_chosen_and_the_others_wait_until_it_goes_on(dap):
    chose = dap.execute("%mpi debug --rank 1")
    assert dap.wait(chose, 60) and "shows rank 1" in text(dap, chose), text(dap, chose)
    code = "%%mpi\nx = rank * 10\ncomm.Barrier()\ny = x + 1\nprint('after', y)"
    dap.breakpoints(code, [4])
    msg_id = dap.execute(code)
    stopped = stop(dap)
    assert stopped["threadId"] == RANK_THREAD + (1 << 20) and "rank 1" in stopped["description"]
    assert stopped["stack"][0]["name"] == "cell (rank 1)"
    assert variables(dap, stopped["stack"][0])["x"] == "10"
    answer = dap.request("evaluate", expression="x + rank", frameId=stopped["stack"][0]["id"], context="repl")
    assert answer["success"] and answer["body"]["result"] == "11", answer
    shown = dap.request("richInspectVariables", variableName="x", frameId=stopped["stack"][0]["id"])
    assert shown["success"] and shown["body"]["data"]["text/plain"] == "10", shown  # looked up, not run
    assert "after" not in text(dap, msg_id)  # rank 0 waits at the same line
    out = run_to_end(dap, msg_id)
    assert "[rank 0] after 1" in out and "[rank 1] after 11" in out, out
    dap.wait(dap.execute("%mpi debug --rank 0"))
    dap.breakpoints(code, [])


def test_a_breakpoint_the_chosen_rank_never_reaches_shows_the_rank_that_did(dap):
    code = "%%mpi\nif rank == 1:\n    z = 'one'\ncomm.Barrier()\nprint('done')"
    dap.breakpoints(code, [3])
    msg_id = dap.execute(code)
    stopped = stop(dap)  # rank 0 waits in the barrier meanwhile, and the cell is not stopped for it
    assert "rank 1" in stopped["description"] and "rank 0 did not stop" in stopped["description"], stopped
    assert dap.event("stopped", timeout=3) is None  # held a while: nothing else stops, nothing gives up
    out = run_to_end(dap, msg_id)
    assert out.count("done") == 2 and "Error" not in out, out
    dap.breakpoints(code, [])


def test_exception_filters_stop_the_rank_where_it_raised_and_never_the_kernel(dap):
    assert dap.request("setExceptionBreakpoints", filters=["raised", "uncaught"])["success"]
    code = ("%%mpi\ndef f(v):\n    if rank == 1:\n        raise ValueError(f'bad {v}')\n    return v\n"
            "try:\n    f(0)\nexcept ValueError:\n    pass\ny = f(5)")
    path = dap.request("dumpCell", code=code)["body"]["sourcePath"]
    msg_id = dap.execute(code)
    stops = []
    for _ in range(3):  # raised and caught; raised; the cell failed with it
        stopped = stop(dap)
        stops.append((stopped["threadId"], stopped["description"],
                      [(f["name"], f["line"], f["source"]["path"] == path) for f in stopped["stack"]]))
        if len(stops) == 3:
            assert variables(dap, stopped["stack"][0]).get("v") == "5", (stops, variables(dap, stopped["stack"][0]))
        assert dap.request("continue", threadId=stopped["threadId"])["success"]
    assert dap.wait(msg_id, 120)
    ranks = RANK_THREAD + (1 << 20)
    assert stops == [(ranks, "rank 1: ValueError: bad 0 (rank 0 did not stop)",
                      [("f (rank 1)", 4, True), ("cell (rank 1)", 7, True)]),
                     (ranks, "rank 1: ValueError: bad 5 (rank 0 did not stop)",
                      [("f (rank 1)", 4, True), ("cell (rank 1)", 10, True)]),
                     (ranks, "rank 1: ValueError: bad 5 (rank 0 did not stop)",
                      [("f (rank 1)", 4, True), ("cell (rank 1)", 10, True)])], stops
    assert dap.event("stopped", timeout=2) is None  # the kernel itself stopped nowhere (mpinb's code, the cell)
    out = text(dap, msg_id)
    assert "ValueError: bad 5" in out and "mpinb/" not in out, out
    assert dap.request("setExceptionBreakpoints", filters=[])["success"]


def test_a_failed_rank_post_mortem_in_the_panel(dap):
    failed = dap.execute("%%mpi\ndef g(q):\n    return 1 / q\ng(rank - 1)")
    assert dap.wait(failed, 120) and "ZeroDivisionError" in text(dap, failed)
    msg_id = dap.execute("%mpi debug 1 --panel")
    stopped = stop(dap)
    assert stopped["reason"] == "exception" and "ZeroDivisionError" in stopped["description"]
    assert [f["name"] for f in stopped["stack"]] == ["g (rank 1)", "cell (rank 1)"]
    assert variables(dap, stopped["stack"][0])["q"] == "0"
    run_to_end(dap, msg_id)


def test_stop_and_timeout_while_a_rank_is_stopped(dap):
    code = "%%mpi --timeout 2\nimport time\nstep = 1\nprint('step', step)"
    dap.breakpoints(code, [3])
    msg_id = dap.execute(code)
    stop(dap)
    assert dap.event("stopped", timeout=4) is None  # longer than --timeout: time in the debugger is the user's
    out = run_to_end(dap, msg_id)
    assert out.count("step 1") == 2 and "timeout" not in out.lower(), out

    msg_id = dap.execute(code)
    stop(dap)
    dap.session.stop_button()
    assert dap.wait(msg_id, 120), "Stop did not end a cell whose rank was stopped in the debugger"
    assert "KeyboardInterrupt" in text(dap, msg_id) or "Interrupt" in text(dap, msg_id), text(dap, msg_id)
    dap.breakpoints(code, [])
    after = dap.execute("%%mpi\nprint('alive', rank)")
    assert dap.wait(after, 120)
    assert "[rank 0] alive 0" in text(dap, after) and "[rank 1] alive 1" in text(dap, after), text(dap, after)


def test_ordinary_cells_keep_the_kernels_own_debugger(dap):
    code = "a = 1\nb = a + 1\nprint('b is', b)"
    path, _ = dap.breakpoints(code, [2])
    msg_id = dap.execute(code)
    stopped = stop(dap)
    assert stopped["threadId"] < RANK_THREAD
    assert (stopped["stack"][0]["source"]["path"], stopped["stack"][0]["line"]) == (path, 2)
    assert dap.request("continue", threadId=stopped["threadId"])["success"]
    assert dap.wait(msg_id, 60) and "b is 2" in text(dap, msg_id)
    dap.breakpoints(code, [])


def test_pdb_on_a_rank_works_beside_the_panel(dap):
    msg_id = dap.execute("%%mpi\nsecret = rank + 40\nif rank == 1:\n    breakpoint()\nsecret",
                         answers=["p secret", "c"])
    assert dap.wait(msg_id, 120)
    assert any("(rank 1) (Pdb)" in prompt for prompt in dap.prompts), dap.prompts
    assert "41" in text(dap, msg_id), text(dap, msg_id)


def test_switching_the_panel_off_lets_every_rank_go_on(dap):
    code = "%%mpi\nfor i in range(3):\n    seen = i\nprint('loop done', seen)"
    dap.breakpoints(code, [3])
    msg_id = dap.execute(code)
    stop(dap)
    assert dap.request("disconnect", restart=False, terminateDebuggee=False)["success"]
    assert dap.wait(msg_id, 120), "a rank stayed stopped after the debugger was switched off"
    assert text(dap, msg_id).count("loop done 2") == 2, text(dap, msg_id)


def test_mpinbs_own_threads_in_the_kernel_never_stop_its_debugger():
    """mpinb's warm-up thread imports matplotlib, and numpy raises and handles exceptions as it loads: with the
    panel's exception filters on, the kernel's debugpy stopped the whole kernel there (seen in a full run)."""
    with kernel() as session:
        client = DebugClient(session.client)
        try:
            client.start()
            assert client.request("setExceptionBreakpoints", filters=["raised", "uncaught"])["success"]
            msg_id = client.execute("import mpinb.widgets.views as views\nviews.warm_up()\n"
                                    "import time\nwhile not __import__('sys').modules.get('matplotlib.figure'):\n"
                                    "    time.sleep(0.05)\nprint('loaded')")
            assert client.event("stopped", timeout=10) is None
            assert client.wait(msg_id, 60) and "loaded" in text(client, msg_id)
        finally:
            client.close()
