"""JupyterLab's MPI panel in Chromium, in the Light and Dark themes: while a training cell runs with one slow rank,
each rank's row says where it is, the slow rank is named as holding the others up (in words), the loss sparklines
move, a rank's stacks come back, a reload shows the same world at once, and Stop from the panel stops the cell.
Screenshots of the panel go to test-artifacts/ (mpi-panel-light.png, mpi-panel-dark.png)."""

import re

import lab_pages
import pytest
from conftest import leftover_ranks, new_world_tag
from lab_pages import use_theme
from panel_colours import low_contrast
from waiting import wait_for

pytest.importorskip("playwright.sync_api", reason="playwright is installed by make test")

pytestmark = [pytest.mark.browser, pytest.mark.server, pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(300)]

SLOW = 1  # the rank that sleeps before each allreduce: the others wait for it
CELLS = ["%load_ext mpinb",
         "%mpi start -n 3",
         "%%mpi\nimport time\nimport mpinb\n\nfor step in range(100_000):\n    if rank == 1:\n"
         "        time.sleep(0.8)  # the straggler\n    loss = comm.allreduce(1.0 / (step + 1))\n"
         "    mpinb.report(step=step, loss=loss + 0.1 * rank)\n",
         "print('after')"]


def open_panel(page):
    page.evaluate("window.jupyterapp.shell.activateById('mpinb-panel')")
    panel = page.locator("#mpinb-panel")
    panel.wait_for(state="visible", timeout=30_000)
    return panel


def row(panel, rank):
    return panel.locator(f".mpinb-Panel-row[data-rank='{rank}']")


def rows_state(panel):
    """``{rank: (state, text, holding or None)}`` as the panel shows them now."""
    return {int(entry["rank"]): (entry["state"], entry["text"], entry["holding"]) for entry in panel.evaluate(
        """panel => [...panel.querySelectorAll('.mpinb-Panel-row')].map(r => ({rank: r.dataset.rank,
             state: r.dataset.state, text: r.querySelector('.mpinb-Panel-state').textContent,
             holding: r.querySelector('.mpinb-Panel-holding').hidden ? null
                      : r.querySelector('.mpinb-Panel-holding').textContent}))""")}


def straggler_marked(panel):
    """The rows while the slow rank holds up the others, once they say so."""
    rows = rows_state(panel)
    if len(rows) != 3:
        return None
    others = [rank for rank in rows if rank != SLOW]
    holding = rows[SLOW][2]
    # the slow rank computes for nearly all of each step and is in the allreduce for an instant: rows read then
    if holding and rows[SLOW][0] == "running" and all(rows[rank][0] == "collective" for rank in others) and \
            all(rows[rank][2] is None for rank in others):
        return rows
    return None


def spark(panel, rank):
    return row(panel, rank).locator("polyline").get_attribute("points") or ""


def test_the_panel_shows_each_rank_live_names_the_straggler_and_stops_the_cell(tmp_path, monkeypatch):
    root = lab_pages.notebook_of(tmp_path, "panel.ipynb", CELLS)
    monkeypatch.setenv("MPINB_PANEL_DIR", str(tmp_path / "panel"))  # the kernel's and the server's, this test's own
    tag = new_world_tag()
    shots = lab_pages.ARTIFACTS
    with lab_pages.lab(root, tmp_path, monkeypatch, server_args=["--LabApp.expose_app_in_browser=True"]) as (
            server, browser):
        with lab_pages.notebook_page(server, browser, "panel.ipynb", viewport={"width": 1500, "height": 1000},
                                        screenshot="mpi-panel-page.png") as (page, cells):
            page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
            panel = open_panel(page)
            panel.get_by_text("No kernel has an MPI world").wait_for(timeout=30_000)
            lab_pages.run(cells.nth(0), page, wait=True)
            lab_pages.run(cells.nth(1), page, wait=True)
            wait_for(lambda: [state for state, _, _ in rows_state(panel).values()] == ["idle"] * 3,
                     "three idle rows once the world started", 60)
            heading = panel.locator(".mpinb-Panel-title").inner_text()
            assert "3 ranks" in heading and "MPICH" in heading, heading
            assert "via " in panel.locator(".mpinb-Panel-details").inner_text()

            lab_pages.run(cells.nth(2), page, wait=False)
            rows = wait_for(lambda: straggler_marked(panel), "the slow rank marked as holding up the others", 60)
            assert re.search(r"holding up ranks 0, 2: they wait in allreduce #\d+ on COMM_WORLD", rows[SLOW][2]), rows
            assert rows[SLOW][1] == "running In[3] at line 7", rows
            for rank in (0, 2):
                assert re.match(r"in allreduce #\d+ on COMM_WORLD since \d+\.\d s \(In\[3\] at line 8\)",
                                rows[rank][1]), rows
            usage = row(panel, 0).locator(".mpinb-Panel-usage").inner_text()
            assert re.fullmatch(r"CPU \d+% · [\d.]+ (MiB|GiB)", usage), usage
            first = wait_for(lambda: spark(panel, 0), "a sparkline of rank 0's loss", 60)
            wait_for(lambda: spark(panel, 0) != first, "the sparkline moving as the loss is reported", 60)
            assert row(panel, 0).locator(".mpinb-Panel-loss").inner_text().startswith("loss ")

            wait_for(lambda: straggler_marked(panel), "the straggler marked again", 60)
            panel.screenshot(path=str(shots / "mpi-panel-light.png"))
            assert low_contrast(panel) == []

            # a rank's stacks, as %mpi stacks 1 says them, while the cell runs
            row(panel, SLOW).locator("button[data-action='stacks']").click()
            message = panel.locator(".mpinb-Panel-message")
            wait_for(lambda: "rank 1" in message.inner_text() and "reading" not in message.inner_text(),
                     "rank 1's stacks in the panel", timeout=90)
            assert "sleep" in message.inner_text(), message.inner_text()

            # restart is refused while the cell runs, and says why
            panel.locator("button[data-action='restart']").click()
            wait_for(lambda: "Restart refused: a cell is running" in message.inner_text(), "restart refused", 60)

            use_theme(page, "JupyterLab Dark")
            wait_for(lambda: straggler_marked(panel), "the straggler marked in the dark theme", 60)
            panel.screenshot(path=str(shots / "mpi-panel-dark.png"))
            assert low_contrast(panel) == []

            # a reload shows the same world at once: the state is the server's, not the page's
            page.reload()
            page.locator(".jp-Notebook >> visible=true").wait_for(timeout=60_000)
            panel = open_panel(page)
            wait_for(lambda: straggler_marked(panel), "the running world after a reload", timeout=30)
            assert "running In[3]" in panel.locator(".mpinb-Panel-title").inner_text()

            panel.locator("button[data-action='stop']").click()
            wait_for(lambda: [state for state, _, _ in rows_state(panel).values()] == ["idle"] * 3,
                     "every rank idle after Stop from the panel", timeout=90)
            # the kernel is free again: the next cell runs (the stopped cell's output was the page's before the reload)
            cells = page.locator(".jp-Notebook >> visible=true").locator(".jp-Cell")
            lab_pages.run(cells.nth(3), page, wait=True)
            cells.nth(3).locator(".jp-OutputArea").get_by_text("after").wait_for(timeout=30_000)

            message = panel.locator(".mpinb-Panel-message")
            panel.locator("button[data-action='stop']").click()
            wait_for(lambda: "nothing to stop" in message.inner_text(), "Stop refused when no cell runs", 60)
            panel.locator("button[data-action='clear']").click()
            wait_for(lambda: "%mpi inject clear\n" in message.inner_text() and "running" not in message.inner_text(),
                     "%mpi inject clear run from the panel", 60)
            # the rank JupyterLab's debugger panel shows, chosen from its row (as %mpi debug --rank 1)
            row(panel, SLOW).locator("button[data-action='debug']").click()
            wait_for(lambda: "%mpi debug --rank 1\n" in message.inner_text() and "running" not in message.inner_text(),
                     "%mpi debug --rank 1 run from the panel", 60)
            assert "JupyterLab's debugger panel shows rank 1 when it stops at a breakpoint" in message.inner_text()
            errors = list(page.console_errors)
    assert errors == [], errors
    assert not leftover_ranks(tag)
