"""JupyterLab in Chromium: the tutorial's training cell draws a live loss curve for every rank.

This is what fails most often for widget users: a front-end extension missing or of another version than the
kernel's widgets shows "Error displaying widget" instead of a chart. A real JupyterLab server serves the
notebook, Debian's Chromium (driven by Playwright) runs its cells, and the test reads the rendered SVG.
"""

import json
import re

import nbformat
import pytest
from conftest import leftover_ranks, new_world_tag
from lab_pages import ARTIFACTS, notebook_in_lab, notebook_of, ran, run
from tutorial_notebooks import NOTEBOOKS
from waiting import wait_for

pytest.importorskip("playwright.sync_api", reason="playwright is installed by make test")

pytestmark = [pytest.mark.browser, pytest.mark.server, pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(300)]

NOTEBOOK = "03_data_parallel_training.ipynb"


def rank_curves(output):
    """Per rendered bqplot line of the cell's output: how many points its SVG path draws."""
    paths = output.locator(".bqplot path.line").evaluate_all(
        "paths => paths.filter(p => !p.closest('.g_legend')).map(p => p.getAttribute('d') || '')")
    return [len(re.findall(r"[ML]", d)) for d in paths]


def test_live_loss_chart_renders_a_curve_per_rank_in_jupyterlab(tmp_path, monkeypatch):
    """The live chart's widgets render in JupyterLab (kept live after the cell with ``keep_widgets``: this tutorial
    trains in about a second): a curve per rank with every one of its steps."""
    root = tmp_path / "notebooks"
    root.mkdir()
    notebook = nbformat.read(NOTEBOOKS / NOTEBOOK, as_version=4)
    load = next(cell for cell in notebook.cells if cell.cell_type == "code" and cell.source == "%load_ext mpinb")
    load.source += "\n%config MPIMagics.keep_widgets = True"
    nbformat.write(notebook, root / NOTEBOOK)
    sources = [cell.source for cell in notebook.cells]
    training = next(i for i, cell in enumerate(notebook.cells)
                    if cell.cell_type == "code" and "mt.allreduce_gradients(model)" in cell.source)
    tag = new_world_tag()
    with notebook_in_lab(root, NOTEBOOK, tmp_path, monkeypatch, viewport={"width": 1400, "height": 1000},
                         screenshot="jupyterlab-live-loss-per-rank.png") as (page, cells):
        # cells are attached in batches after the notebook shows
        wait_for(lambda: cells.count() >= len(sources), "every cell on the page", 30, 0.2)
        assert cells.count() == len(sources), "every cell should be on the page (windowingMode none)"
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
        for index in range(training + 1):  # run every cell up to the training cell, in order, as a reader would
            run(cells.nth(index), page, wait=index < training)
        output = cells.nth(training).locator(".jp-OutputArea")
        output.get_by_text("[rank 1] test accuracy").wait_for(timeout=120_000)
        curves = wait_for(lambda: sorted(rank_curves(output)) == [256, 256] and rank_curves(output),
                          lambda: f"a curve of 256 points per rank (drawn: {rank_curves(output)})", 30, 0.25)
        output.scroll_into_view_if_needed()
        legend = output.locator(".bqplot .g_legend .legendtext").evaluate_all(
            "texts => texts.map(t => t.textContent)")
        body = page.locator("body").inner_text()
    assert "Error displaying widget" not in body
    assert "Model not found" not in body
    assert sorted(curves) == [256, 256], curves  # one curve per rank, every one of its 256 steps drawn
    assert {"rank 0", "rank 1"} <= set(legend)
    assert page.console_errors == [], page.console_errors
    assert not leftover_ranks(tag)  # the server shut its kernel down, and the kernel its world


EDGES = ["%load_ext mpinb\n%mpi start -n 2",
         "%%mpi --timeout 3\nif rank == 0:\n    comm.recv(source=1)\nelse:\n    comm.recv(source=0)",
         "%%mpi\nif rank == 1:\n    raise ValueError('bad batch on rank 1')\ncomm.Barrier()",
         "%%mpi\nif rank == 1:\n    comm.Abort(3)\ncomm.Barrier()",
         "%mpi restart\n%mpi stop"]


def test_faults_render_in_jupyterlab_with_who_failed_and_where(tmp_path, monkeypatch):
    """A deadlock, a failing rank and MPI_Abort, run in JupyterLab as a user would: each cell shows where every
    rank was and who failed, and none of mpinb's frames."""
    root = notebook_of(tmp_path, "edges.ipynb", EDGES)
    tag = new_world_tag()
    with notebook_in_lab(root, "edges.ipynb", tmp_path, monkeypatch, viewport={"width": 1300, "height": 2000},
                         screenshot="jupyterlab-faults.png") as (page, cells):
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
        for index in range(len(EDGES)):
            run(cells.nth(index), page, wait=True)
        shown = [cells.nth(index).locator(".jp-OutputArea").inner_text() for index in range(len(EDGES))]
        # an error's long lines break between words (the MPI panel's stylesheet; JupyterLab's own breaks anywhere)
        breaks = [cells.nth(index).locator(".jp-OutputArea-output pre").evaluate_all(
            "pres => pres.map(p => getComputedStyle(p).wordBreak)") for index in (1, 2, 3)]
    assert all(breaks) and not any("break-all" in each for each in breaks), breaks
    assert "[mpinb]   rank 0: blocked in comm.recv(source=1) at cell line 3" in shown[1]
    assert "rank 1: ValueError: bad batch on rank 1" in shown[2] and "rank 0 finished" not in shown[2]
    assert "rank 1 called MPI_Abort(MPI_COMM_WORLD, 3), so mpiexec ended every rank of the job (error code 3)" \
        in shown[3], shown[3]
    assert not any(re.search(r"mpinb/(magics|execute|cluster|channel)\.py|site-packages/(zmq|ipyparallel)", text)
                   for text in shown)
    assert not leftover_ranks(tag)


TRACED = ["%load_ext mpinb\n%config MPIMagics.keep_widgets = True\n%mpi start -n 4",
          "%%mpi --trace\nimport time, numpy as np, mpinb\ng = np.zeros(10000)\nfor step in range(30):\n"
          "    time.sleep(0.005 + (0.03 if rank == 2 else 0))\n    comm.Allreduce(np.ones(10000), g)\n"
          "    mpinb.report(step=step, loss=1.0 / (step + 1))",
          "%%mpi\nimport numpy as np\nif rank == 1:\n    comm.Allreduce(np.zeros(4, 'f'), np.zeros(4, 'f'))\n"
          "else:\n    comm.Bcast(np.zeros(4), root=0)",
          "%mpi stop"]


def test_the_timeline_and_a_mismatch_render_in_jupyterlab(tmp_path, monkeypatch):
    """A straggler traced in JupyterLab: one timeline lane of Allreduce bars per rank, the summary naming rank 2,
    the live table flagging it; then a mismatched collective named in the cell's error. The widgets are kept
    live after the cell (``keep_widgets``), as a user zooming into the timeline would want."""
    root = notebook_of(tmp_path, "traced.ipynb", TRACED)
    tag = new_world_tag()
    with notebook_in_lab(root, "traced.ipynb", tmp_path, monkeypatch, viewport={"width": 1300, "height": 2400},
                         screenshot="jupyterlab-timeline.png") as (page, cells):
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
        for index in range(3):
            run(cells.nth(index), page, wait=True)
        traced = cells.nth(1).locator(".jp-OutputArea")
        traced.get_by_text("rank 2 arrived last at").wait_for(timeout=30_000)
        lanes = traced.locator(".bqplot path.line").evaluate_all(
            "paths => paths.filter(p => !p.closest('.g_legend')).map(p => p.getAttribute('d') || '')")
        shown = [traced.inner_text(), cells.nth(2).locator(".jp-OutputArea").inner_text()]
        run(cells.nth(3), page, wait=True)
    bars = max(len(re.findall(r"M", d)) for d in lanes)
    assert bars >= 4 * 30, lanes  # the Allreduce bars of four ranks, one subpath each
    assert "straggler: the other ranks wait" in shown[0] and "per step for it" in shown[0]
    assert "collective #" in shown[1] and "rank 1 in Allreduce(4 x float32) at cell line 4" in shown[1], shown[1]
    assert "Error displaying widget" not in "".join(shown)
    assert not leftover_ranks(tag)


DEBUGGED = ["%load_ext mpinb\n%mpi start -n 2",
            "%%mpi\nimport numpy as np\nw = np.full(3, float(rank))\ndef f(y):\n    z = y * 7\n    if rank == 1:\n"
            "        raise ValueError('bad batch')\nf(rank + 3)",
            "%mpi debug 1",
            "%mpi who",
            "%mpi stop"]


# JupyterLab 4 answers an input() prompt in a box of its own; on Enter it sends the line, adds prompt and line to
# the cell's outputs (a "stdin" stream: the echo), marks the box hiding and removes it 0.5 s later. Which box is the
# prompt to answer is told by that mark, never by its place among the cell's boxes (their number changes meanwhile).
PENDING = ".jp-OutputArea-stdin-item:not(.jp-OutputArea-stdin-hiding)"
ECHOES = """(area, echo) => [...area.querySelectorAll('.jp-OutputArea-child:not(.jp-OutputArea-stdin-item)')]
    .map(child => child.innerText.replace(/\\s+/g, ' ')).join(' ').split(echo).length - 1"""


def answer(output, prompt, line, *, timeout=60):
    """Type *line* at the next input() prompt that *output* (a cell's output area) shows, one reading *prompt*, as a
    user does; return once the answer is echoed in the outputs (JupyterLab sent it to the kernel). An Enter the box
    did not take is pressed again on the same box (a box that took one ignores any more)."""
    pending = output.locator(PENDING)  # strict: one prompt at a time
    pending.locator("input.jp-Stdin-input").wait_for(timeout=timeout * 1000)
    shown = pending.locator(".jp-Stdin-prompt").inner_text()
    assert prompt in shown, f"the prompt reads {shown!r}, not {prompt!r}"
    echo = " ".join(f"{shown} {line}".split())
    before = output.evaluate(ECHOES, echo)
    box = pending.locator("input.jp-Stdin-input").element_handle()  # this box, not whichever is pending later
    box.fill(line)

    def echoed():  # Enter, then up to 5 s for the echo
        box.press("Enter")
        return wait_for(lambda: output.evaluate(ECHOES, echo) > before, "the echo", 5, 0.1, required=False)

    wait_for(echoed, f"{echo!r} to show in the cell's outputs", timeout, interval=0)


def test_post_mortem_and_who_in_jupyterlab(tmp_path, monkeypatch):
    """%mpi debug 1 after a failure on rank 1: pdb's prompt in the cell's input box, answered as a user types it
    (each answer reaches rank 1: it prints ``z`` and ``w``, and ``q`` lets the cell end); then %mpi who's table
    flags the name that differs between ranks."""
    root = notebook_of(tmp_path, "debugged.ipynb", DEBUGGED)
    tag = new_world_tag()
    with notebook_in_lab(root, "debugged.ipynb", tmp_path, monkeypatch, viewport={"width": 1300, "height": 1800},
                         screenshot="jupyterlab-debug-and-who.png") as (page, cells):
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
        run(cells.nth(0), page, wait=True)
        run(cells.nth(1), page, wait=True)
        run(cells.nth(2), page, wait=False)
        debugged = cells.nth(2).locator(".jp-OutputArea")
        for line in ["p z", "p w", "q"]:
            answer(debugged, "(rank 1) (Pdb)", line)
        ran(cells.nth(2))
        run(cells.nth(3), page, wait=True)
        cells.nth(3).locator(".jp-OutputArea table").wait_for(timeout=30_000)
        shown = [cells.nth(index).locator(".jp-OutputArea").inner_text() for index in (2, 3)]
        run(cells.nth(4), page, wait=True)
    assert "[rank 1] 28" in shown[0] and "[rank 1] array([1., 1., 1.])" in shown[0], shown[0]
    assert "differs on rank" in shown[1] and "w" in shown[1], shown[1]
    assert not leftover_ranks(tag)


SAVED = ["%load_ext mpinb\n%mpi start -n 2",
         "%%mpi\nimport time, mpinb\nfor step in range(60):\n    nan = rank == 1 and step >= 40\n"
         "    mpinb.report(step=step, loss=float('nan') if nan else 1.0 / (step + 1))\n    time.sleep(0.01)",
         "%%mpi --gather x\nimport numpy as np\nx = np.linspace(-1, 1, 1000) * (rank + 1)",
         "%%mpi\nimport torch\ntorch.manual_seed(rank)\nmodel = torch.nn.Linear(4, 3)\n"
         "model(torch.randn(8, 4)).sum().backward()",
         "%mpi grads model",
         "%%mpi --trace\nfor i in range(20):\n    comm.allreduce(i)",
         "%mpi status",
         "%mpi who",
         "%mpi stop"]


# Per cell: how many outputs it draws, -1 while an image of them is still loading.
DRAWN = """cells => cells.map(cell => [...cell.querySelectorAll('.jp-OutputArea img')].every(i => i.complete)
    ? cell.querySelectorAll('.jp-OutputArea-output').length : -1)"""


def test_a_saved_notebook_shows_every_result_after_a_reload_with_a_fresh_kernel(tmp_path, monkeypatch):
    """Run every view in JupyterLab, save with the default settings (no widget state), restart the kernel and
    reload the page: every chart is an image, every table is there, and nothing reads "Error displaying widget"."""
    root = notebook_of(tmp_path, "saved.ipynb", SAVED)
    tag = new_world_tag()
    with notebook_in_lab(root, "saved.ipynb", tmp_path, monkeypatch, viewport={"width": 1300, "height": 2400},
                         screenshot="jupyterlab-saved-and-reopened.png") as (page, cells):
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
        for index in range(len(SAVED)):
            run(cells.nth(index), page, wait=True)
        live_errors = list(page.console_errors)
        page.keyboard.press("Control+s")
        wait_for(lambda: "image/png" in (root / "saved.ipynb").read_text(),
                 "the notebook saved with its charts' images", 30, 0.2)
        cells.nth(0).locator(".jp-InputPrompt").first.click()
        page.keyboard.press("Escape")
        page.keyboard.press("0")
        page.keyboard.press("0")  # Kernel > Restart: a fresh kernel, which knows no widget
        page.locator(".jp-Dialog .jp-mod-accept").click(timeout=30_000)
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
        page.reload()
        page.locator(".jp-Notebook >> visible=true").wait_for(timeout=60_000)
        page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=60_000)
        reopened = page.locator(".jp-Notebook >> visible=true").locator(".jp-Cell")
        saved = nbformat.read(root / "saved.ipynb", as_version=4)
        # every output of the saved file drawn again, its images loaded (an output that asked for a widget would be
        # a widget view in the saved file, which is checked below)
        outputs = [len(cell.outputs) for cell in saved.cells]
        wait_for(lambda: reopened.evaluate_all(DRAWN) == outputs,
                 lambda: f"the saved outputs {outputs} drawn again (drawn: {reopened.evaluate_all(DRAWN)})", 30, 0.2)
        images = [reopened.nth(i).locator(".jp-OutputArea img").count() for i in range(len(SAVED))]
        tables = [reopened.nth(i).locator(".jp-OutputArea table").count() for i in range(len(SAVED))]
        body = page.locator("body").inner_text()
    assert "Error displaying widget" not in body and "model not found" not in body
    assert images[1] == 1 and images[2] == 1 and images[4] == 2 and images[5] == 1, images  # charts, histograms,
    assert tables[1] >= 1 and tables[6] == 1 and tables[7] >= 1, tables  # heatmap and histograms, timeline
    assert "NaN" in reopened_text(saved, 1)  # the live table's flag for rank 1
    assert not any("application/vnd.jupyter.widget-view+json" in output.get("data", {})
                   for cell in saved.cells for output in cell.outputs)
    assert live_errors == [] and page.console_errors == [], page.console_errors
    assert not leftover_ranks(tag)


def reopened_text(notebook, index):
    return "".join(output.get("data", {}).get("text/plain", "") + output.get("text", "")
                   for output in notebook.cells[index].outputs)


STOPPED = ["%load_ext mpinb\n%mpi start -n 2",
           "%%mpi\nkept = rank",
           # rank 1 cannot answer an interrupt (SIGINT blocked, as in a C library that masks it)
           "%%mpi\nimport signal, time\nif rank == 1:\n    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])\n"
           "    print('deaf to Stop', flush=True)\n    time.sleep(30)\ncomm.Barrier()",
           "%%mpi\n(size, 'kept' in globals())",
           "%mpi stop"]


def test_three_stops_from_the_toolbar_end_the_world_in_one_line_in_the_dark_theme(tmp_path, monkeypatch):
    """JupyterLab's own Stop button, pressed three times while a rank cannot answer: the cell says in one line that
    the world was ended, with no frame of mpinb's; the next cell starts as many ranks again, with every rank's
    variables. In the dark theme."""
    root = notebook_of(tmp_path, "stopped.ipynb", STOPPED)
    theme = tmp_path / "settings" / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings"
    theme.parent.mkdir(parents=True)
    theme.write_text(json.dumps({"theme": "JupyterLab Dark"}))
    tag = new_world_tag()
    with notebook_in_lab(root, "stopped.ipynb", tmp_path, monkeypatch, viewport={"width": 1300, "height": 1400},
                         screenshot="jupyterlab-three-stops-dark.png") as (page, cells):
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
        run(cells.nth(0), page, wait=True)
        run(cells.nth(1), page, wait=True)
        run(cells.nth(2), page, wait=False)
        stopped = cells.nth(2).locator(".jp-OutputArea")
        stop = page.locator(".jp-NotebookPanel-toolbar [data-command='notebook:interrupt-kernel']").first
        stopped.get_by_text("deaf to Stop").first.wait_for(timeout=60_000)  # rank 1 sleeps with SIGINT blocked
        stop.click()  # the first Stop: mpinb says where each rank is and interrupts them; rank 1 does not answer
        stopped.get_by_text("[mpinb] interrupted; stopping").first.wait_for(timeout=30_000)
        stop.click()  # the second: mpinb says what it still waits for
        stopped.get_by_text("press Stop (Ctrl-C) again to end the world now").first.wait_for(timeout=30_000)
        stop.click()  # the third ends the world
        ran(cells.nth(2))
        shown = stopped.inner_text()
        run(cells.nth(3), page, wait=True)
        after = cells.nth(3).locator(".jp-OutputArea").inner_text()
        dark = page.evaluate("getComputedStyle(document.body).getPropertyValue('--jp-layout-color0').trim()")
        run(cells.nth(4), page, wait=True)
    assert "Stop pressed 3 times: the world of 2 ranks was ended" in shown, shown
    assert "mpinb/" not in shown and "site-packages" not in shown, shown
    assert "[rank 0] (2, True)" in after and "[rank 1] (2, True)" in after, after  # started again, restored
    assert "restored every rank's variables as of In[" in after, after
    assert dark and dark.lower() not in ("white", "#fff", "#ffffff"), dark  # the dark theme was on
    assert not leftover_ranks(tag)


PANEL = ["%load_ext mpinb\n%mpi start -n 2",
         "%%mpi\nimport numpy as np\nweights = np.arange(6.0) * (rank + 1)\nloss = float(weights.sum())\n"
         "print('loss', loss)",
         "%mpi stop"]


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_debugger_panel_stops_rank_0_at_a_breakpoint_clicked_in_a_mpi_cell(theme, tmp_path, monkeypatch):
    """JupyterLab's own debugger: switched on from the notebook's toolbar, a breakpoint clicked in the gutter of a
    %%mpi cell's line 4; running the cell stops rank 0 there: the panel's call stack names rank 0 and the cell's
    line, its variables are rank 0's, the editor highlights the line; Continue lets the cell end on both ranks."""
    root = notebook_of(tmp_path, "panel.ipynb", PANEL)
    if theme == "dark":
        setting = tmp_path / "settings" / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings"
        setting.parent.mkdir(parents=True)
        setting.write_text(json.dumps({"theme": "JupyterLab Dark"}))
    tag = new_world_tag()
    with notebook_in_lab(root, "panel.ipynb", tmp_path, monkeypatch, viewport={"width": 1500, "height": 1000},
                         screenshot=f"jupyterlab-debugger-panel-{theme}.png") as (page, cells):
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
        run(cells.nth(0), page, wait=True)
        page.locator(".jp-DebuggerBugButton").first.click()  # the toolbar's bug icon: the debugger on
        gutter = cells.nth(1).locator(".cm-breakpoint-gutter .cm-gutterElement")
        gutter.nth(1).wait_for(timeout=30_000)
        gutter.nth(gutter.count() - 2).click()  # line 4 of 5 (the gutter's first element only sizes it)
        page.locator(".jp-DebuggerBreakpoint").first.wait_for(timeout=30_000)
        run(cells.nth(1), page, wait=False)
        frame = page.locator(".jp-DebuggerCallstackFrame").first
        frame.wait_for(timeout=60_000)
        page.locator(".jp-DebuggerVariables-body").get_by_text("weights").first.wait_for(timeout=30_000)
        stack = frame.inner_text()
        variables = page.locator(".jp-DebuggerVariables-body").first.inner_text()
        highlighted = cells.nth(1).locator(".jp-DebuggerEditor-highlight").all_inner_texts()
        page.screenshot(path=str(ARTIFACTS / f"jupyterlab-debugger-panel-stopped-{theme}.png"))
        page.locator("[data-command='debugger:continue']").first.click()
        ran(cells.nth(1))
        shown = cells.nth(1).locator(".jp-OutputArea").inner_text()
        run(cells.nth(2), page, wait=True)
        errors = page.console_errors
    assert "cell (rank 0)" in stack and ":4" in stack, stack
    assert re.search(r"rank\s*:?\s*0", variables) and "weights" in variables, variables
    assert highlighted == ["loss = float(weights.sum())"], highlighted
    assert "[rank 0] loss 15.0" in shown and "[rank 1] loss 30.0" in shown, shown
    assert not errors, errors
    assert not leftover_ranks(tag)
