"""JupyterLab's debugger panel on the ranks, through a real kernel and its Debug Adapter Protocol, the requests
sent as JupyterLab sends them (``tests/dap_client.py``): breakpoints clicked in a ``%%mpi`` cell, the stopped
rank's frames and variables, stepping, exception filters, a post-mortem, Stop and ``--timeout`` while a rank is
stopped, switching the panel off; ordinary cells keep the kernel's own debugger, and pdb on a rank still works.

One kernel and one world of 2 ranks for the module; the debugger is switched on before mpinb is loaded and the
world started, as a user who clicks the bug icon first does."""

import re
import time

import pytest
from conftest import leftover_ranks, new_world_tag

from dap_client import DebugClient, Panel
from kernel_session import INTERNAL_FRAME, jupyter_client_kernel

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.notebook]

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
RANK_THREAD = 1 << 40  # the first rank's thread id (mpinb/wire/debug_ids.py); the kernel's own are small


@pytest.fixture(scope="module")
def dap():
    tag = new_world_tag()
    with jupyter_client_kernel() as session:
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


LOOP = ("%%mpi\ndef f(x):\n    y = x * 2\n    return y - x\ntotal = 0\nfor i in range(5):\n    total += f(i)\n"
        "print('total', total)")
# what the panel is asked, from the breakpoint at line 5, and where rank 0 then is (the function, the editor's line)
STEPS = ["stepIn", "next", "stepIn", "next", "stepOut", "next", "stepIn", "stepOut", "stepIn", "next", "next",
         "stepIn", "stepIn", "stepIn", "stepIn", "stepIn", "next", "next", "next", "stepIn"]
PLACES = [("cell", 5), ("cell", 6), ("cell", 7), ("f", 3), ("f", 4), ("cell", 6), ("cell", 7), ("f", 3),
          ("cell", 6), ("cell", 7), ("cell", 6), ("cell", 7), ("f", 3), ("f", 4), ("cell", 6), ("cell", 7),
          ("f", 3), ("f", 4), ("cell", 6), ("cell", 8)]  # the last step runs the cell to its end


def test_every_stop_shows_the_frame_and_variables_the_rank_is_stopped_in_now(dap):
    """Seen in JupyterLab: after Step In, Next, Step Out, Next the Variables pane showed the last stop's values
    and the editor its line. The panel keeps the frame it shows while the new stop lists a frame of the same id
    (``Panel``), so every stop's ids must be new, and an id of an earlier stop must never reach an old frame."""
    dap.breakpoints(LOOP, [5])
    msg_id = dap.execute(LOOP)
    panel, earlier = Panel(dap), None
    for number, ((function, line), step) in enumerate(zip(PLACES, STEPS)):
        stopped = panel.stop()
        assert stopped is not None, f"no stop {number}"
        top = panel.frames[0]
        assert (top["name"], top["line"]) == (f"{function} (rank 0)", line), (number, panel.frames)
        assert panel.frame == top, (number, "the panel shows", panel.frame, "not", top)
        ids = {frame["id"] for frame in panel.frames}
        shown = {variable["name"]: variable["value"] for variable in panel.scopes["Locals"]}
        names = ["x", "y"] if function == "f" else ["i", "total"]
        for name in names:
            if name in shown:
                answer = dap.request("evaluate", expression=name, frameId=top["id"], context="watch")
                assert answer["success"] and answer["body"]["result"] == shown[name], (number, name, answer, shown)
        if function == "cell" and "i" in shown:
            pair = dap.request("evaluate", expression="(i, total)", frameId=top["id"], context="repl")
            assert pair["body"]["result"] == f"({shown['i']}, {shown['total']})", (number, pair, shown)
        if earlier is not None:
            old_frame, old_scope = earlier
            assert not ids & {old_frame}, (number, "an id of the last stop came again", ids, old_frame)
            for command, key, value in (("scopes", "frameId", old_frame),
                                        ("variables", "variablesReference", old_scope),
                                        ("evaluate", "frameId", old_frame)):
                answer = dap.request(command, **{key: value}, expression="total")
                assert not answer["success"] or not any(answer["body"].values()), (number, command, answer)
        scope = dap.request("scopes", frameId=top["id"])["body"]["scopes"][0]["variablesReference"]
        earlier = top["id"], scope
        assert dap.request(step, threadId=stopped["threadId"])["success"]
    assert dap.wait(msg_id, 120), "the cell did not end after the last step"
    assert "[rank 0] total 10" in text(dap, msg_id), text(dap, msg_id)
    dap.breakpoints(LOOP, [])


PREDEFINED = {"MPI", "comm", "rank", "size", "mpi_rank", "mpi_size"}


def test_the_users_names_come_first_and_mpinbs_predefined_ones_are_grouped(dap):
    code = "%%mpi\nalpha = rank + 1\ndef inner(v):\n    w = v\n    return w\nomega = inner(alpha)"
    dap.breakpoints(code, [5])
    msg_id = dap.execute(code)
    stopped = stop(dap)
    inner, cell = stopped["stack"]
    scopes = {s["name"]: s["variablesReference"] for s in dap.request("scopes", frameId=inner["id"])["body"]["scopes"]}
    listed = {name: dap.request("variables", variablesReference=reference)["body"]["variables"]
              for name, reference in scopes.items()}
    assert [v["name"] for v in listed["Locals"]] == ["v", "w"], listed["Locals"]
    globals_ = listed["Globals"]
    assert not PREDEFINED & {v["name"] for v in globals_}, globals_
    group = globals_[-1]
    assert group["name"] == "mpinb (predefined)" and group["variablesReference"], globals_
    assert group["value"].startswith("rank 0 of 2: ") and group["type"] == "rank 0 of 2", group
    assert {"alpha", "inner"} <= {v["name"] for v in globals_[:-1]}, globals_
    children = dap.request("variables", variablesReference=group["variablesReference"])["body"]["variables"]
    assert {"MPI", "comm", "rank", "size"} <= {v["name"] for v in children} <= PREDEFINED, children
    assert {v["name"]: v["value"] for v in children}["rank"] == "0"
    in_cell = dap.request("scopes", frameId=cell["id"])["body"]["scopes"]
    assert [s["name"] for s in in_cell] == ["Locals"], in_cell
    names = [v["name"] for v in dap.request("variables", variablesReference=in_cell[0]["variablesReference"])
             ["body"]["variables"]]
    assert names[-1] == "mpinb (predefined)" and not PREDEFINED & set(names), names
    run_to_end(dap, msg_id)
    dap.breakpoints(code, [])


def test_set_variable_changes_the_value_on_the_stopped_rank(dap):
    code = ("%%mpi\nnumber = 1\nbox = {'a': 1}\ndef twice(n):\n    m = n\n    return m * 2\n"
            "print('result', number, box['a'], twice(number))")
    dap.breakpoints(code, [4, 6])
    msg_id = dap.execute(code)
    stopped = stop(dap)
    cell = stopped["stack"][0]
    names = dap.request("scopes", frameId=cell["id"])["body"]["scopes"][0]["variablesReference"]
    changed = dap.request("setVariable", variablesReference=names, name="number", value="40 + 2")
    assert changed["success"] and changed["body"]["value"] == "42", changed
    box = next(v for v in dap.request("variables", variablesReference=names)["body"]["variables"] if v["name"] == "box")
    assert dap.request("setVariable", variablesReference=box["variablesReference"], name="'a'",
                       value="number + 1")["body"]["value"] == "43"
    assert dap.request("continue", threadId=stopped["threadId"])["success"]
    inside = stop(dap)["stack"][0]
    assert inside["name"] == "twice (rank 0)"
    local = dap.request("scopes", frameId=inside["id"])["body"]["scopes"][0]["variablesReference"]
    assert dap.request("setVariable", variablesReference=local, name="m", value="m + 100")["body"]["value"] == "142"
    shown = {v["name"]: v["value"] for v in dap.request("variables", variablesReference=local)["body"]["variables"]}
    assert shown == {"n": "42", "m": "142"}, shown  # the frame's own variable changed, not a copy of it
    bad = dap.request("setVariable", variablesReference=local, name="m", value="undefined_name")
    assert not bad["success"] and "NameError" in bad["message"], bad
    out = run_to_end(dap, msg_id)
    assert "[rank 0] result 42 43 284" in out and "[rank 1] result 1 1 2" in out, out
    dap.breakpoints(code, [])


def test_conditional_and_hit_count_breakpoints_stop_only_where_they_hold(dap):
    code = "%%mpi\nfor i in range(10):\n    square = i * i\nprint('squares done')"
    path = dap.request("dumpCell", code=code)["body"]["sourcePath"]
    for point, expected in (({"condition": "i % 4 == 3"}, ["3", "7"]),
                            ({"hitCondition": "3"}, ["2"]),
                            ({"hitCondition": ">= 9"}, ["8", "9"]),
                            ({"hitCondition": "%4"}, ["3", "7"]),
                            ({"condition": "i % 2 == 1", "hitCondition": "2"}, ["3"])):
        reply = dap.request("setBreakpoints", source={"path": path}, breakpoints=[{"line": 3, **point}])
        assert reply["body"]["breakpoints"][0]["verified"], reply
        msg_id = dap.execute(code)
        seen, deadline = [], time.monotonic() + 120
        while not dap.idle[msg_id].is_set() and time.monotonic() < deadline:
            stopped = dap.event("stopped", timeout=0.5)
            if stopped is None:
                continue
            frame = dap.request("stackTrace", threadId=stopped["body"]["threadId"])["body"]["stackFrames"][0]
            if stopped["body"]["threadId"] == RANK_THREAD:  # (rank 1, stopped too, is shown once rank 0 ended)
                seen.append(dap.request("evaluate", expression="i", frameId=frame["id"])["body"]["result"])
            assert dap.request("continue", threadId=stopped["body"]["threadId"])["success"]
            if len(seen) > len(expected):
                break
        assert dap.wait(msg_id, 120) and text(dap, msg_id).count("squares done") == 2, text(dap, msg_id)
        assert seen == expected, (point, seen)
    dap.breakpoints(code, [])
    once = "%%mpi\nvalue = 1\nprint('once')"
    path = dap.request("dumpCell", code=once)["body"]["sourcePath"]
    dap.request("setBreakpoints", source={"path": path}, breakpoints=[{"line": 3, "condition": "value +"}])
    msg_id = dap.execute(once)
    stopped = stop(dap)  # a condition that cannot be evaluated stops, and says why, as debugpy does
    assert "condition" in stopped["description"] and "SyntaxError" in stopped["description"], stopped
    assert "once" in run_to_end(dap, msg_id)
    dap.breakpoints(once, [])


def test_stop_while_a_rank_is_paused_in_the_panel_says_where_it_was_paused(dap):
    code = "%%mpi\nimport time\nstep = 1\ndef wait_here():\n    return step\nwait_here()"
    dap.breakpoints(code, [5])
    msg_id = dap.execute(code)
    stop(dap)
    dap.session.stop_button()
    assert dap.wait(msg_id, 120), "Stop did not end a cell whose rank was paused in the debugger"
    out = text(dap, msg_id)
    # both ranks wait at the breakpoint (rank 1 for rank 0, which the panel shows)
    assert "[mpinb]   ranks 0-1: paused in the debugger at cell line 5" in out, out
    assert "ranks 0-1: KeyboardInterrupt: interrupted while paused in the debugger at cell line 5" in out, out
    assert "bdb.py" not in out and "dispatch_line" not in out, out
    assert not [line for line in out.splitlines() if INTERNAL_FRAME.search(line)], out
    dap.breakpoints(code, [])
    after = dap.execute("%%mpi\nprint('alive', rank)")
    assert dap.wait(after, 120) and "[rank 1] alive 1" in text(dap, after), text(dap, after)


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
    with jupyter_client_kernel() as session:
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
