"""The MPI panel in Notebook 7 (the ``notebook`` package's /notebooks/ page, served by the same Jupyter server as
JupyterLab), in Chromium: the panel is offered under View > Right Sidebar, and while a 2-rank cell runs, with rank 1
slow, each rank's row says where it is and rank 1 is named as holding rank 0 up, in the light theme and in the dark
one chosen from the Settings menu, with every text readable; a reload shows the running world again at once; Stop
from the panel stops the cell. Screenshots of the page go to test-artifacts/ (mpi-panel-notebook7.png,
mpi-panel-notebook7-dark.png)."""

import re

import lab_pages
import pytest
from conftest import leftover_ranks, new_world_tag
from panel_colours import low_contrast

pytest.importorskip("playwright.sync_api", reason="playwright is installed by make test")
pytest.importorskip("notebook", minversion="7", reason="Notebook 7 is in the dev extra")

pytestmark = [pytest.mark.browser, pytest.mark.server, pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(300)]

CELLS = ["%load_ext mpinb\n%mpi start -n 2",
         "%%mpi\nimport time\n\nfor step in range(100_000):\n    if rank == 1:\n        time.sleep(0.5)\n"
         "    total = comm.allreduce(step)\n",
         "print('after')"]

# Notebook 7.6.5's own page logs this on load, with every federated extension disabled (mpinb-panel among them):
# JupyterLab's shortcuts plugin, bundled in Notebook's notebook_core, reads `plugins[id].schema` of the settings
# registry for an id the registry does not hold. Accepted only when each script in its stack is Notebook's own (the
# panel's are /lab/extensions/mpinb-panel/).
NOTEBOOK_SHORTCUTS = "Cannot read properties of undefined (reading 'schema')"

# the rows as the panel shows them, once the predicate *body* (of `rows`: {rank, state, text, holding} in rank order,
# so that rows[1] is rank 1's) holds; Playwright polls it in the page
ROWS = """body => {
  const rows = [...document.querySelectorAll('#mpinb-panel .mpinb-Panel-row')].map(r => {
    const holding = r.querySelector('.mpinb-Panel-holding');
    return {rank: Number(r.dataset.rank), state: r.dataset.state,
            text: r.querySelector('.mpinb-Panel-state').textContent,
            holding: holding.hidden ? null : holding.textContent};
  }).sort((a, b) => a.rank - b.rank);
  return new Function('rows', body)(rows) ? rows : null;
}"""


def rows_when(page, condition, timeout=60_000):
    """``{rank: row}`` once *condition* (a JavaScript expression of ``rows``) is true of the panel's rows."""
    handle = page.wait_for_function(ROWS, arg=f"return {condition};", timeout=timeout, polling=100)
    return {row["rank"]: row for row in handle.json_value()}


STRAGGLER = "rows.length === 2 && rows[1].holding !== null && rows[0].state === 'collective' && " \
    "rows[1].state === 'running'"


def open_from_view_menu(page):
    """The panel, opened as a reader opens it: View > Right Sidebar lists it by its caption."""
    page.get_by_role("menuitem", name="View").click()
    page.locator(".lm-Menu").get_by_text("Right Sidebar", exact=True).click()
    page.locator(".lm-Menu").get_by_text("Show MPI ranks (mpinb)", exact=True).click()
    panel = page.locator("#mpinb-panel")
    panel.wait_for(state="visible", timeout=30_000)
    return panel


def notebook7_error(error):
    """Whether *error* (a page's uncaught exception) is :data:`NOTEBOOK_SHORTCUTS`, raised in Notebook's bundle."""
    sources = re.findall(r"https?://\S+?\.js", error.stack or "")  # the scripts its frames are in
    return error.message == NOTEBOOK_SHORTCUTS and bool(sources) and \
        all("/static/notebook/" in source for source in sources)


def test_the_panel_shows_each_rank_live_in_notebook_7(tmp_path, monkeypatch):
    root = lab_pages.notebook_of(tmp_path, "panel.ipynb", CELLS)
    monkeypatch.setenv("MPINB_PANEL_DIR", str(tmp_path / "panel"))  # the kernel's and the server's, this test's own
    tag = new_world_tag()
    errors = []
    with lab_pages.lab(root, tmp_path, monkeypatch) as (server, browser):
        page = browser.new_page(viewport={"width": 1400, "height": 800})
        try:
            page.on("console", lambda message: message.type == "error" and errors.append(message.text))
            page.on("pageerror", lambda error: notebook7_error(error) or errors.append(error.stack or str(error)))
            page.goto(f"{server.url}/notebooks/panel.ipynb?token={server.token}")
            notebook = page.locator(".jp-Notebook")
            notebook.wait_for(timeout=60_000)
            page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=60_000)
            cells = notebook.locator(".jp-Cell")

            panel = open_from_view_menu(page)
            panel.get_by_text("No kernel has an MPI world").wait_for(timeout=30_000)

            lab_pages.run(cells.nth(0), page, wait=True)
            rows_when(page, "rows.length === 2 && rows.every(r => r.state === 'idle')")
            title = panel.locator(".mpinb-Panel-title").inner_text()
            assert title.startswith("panel.ipynb: ") and "2 ranks" in title, title

            lab_pages.run(cells.nth(1), page, wait=False)
            # rank 1 is in time.sleep (line 6) for nearly all of each step, and in the allreduce for an instant: the
            # rows are read at such a moment, not at whichever update came first
            rows = rows_when(page, STRAGGLER)
            assert rows[1]["state"] == "running" and rows[1]["text"] == "running In[2] at line 6", rows
            assert re.match(r"in allreduce #\d+ on COMM_WORLD since \d+\.\d s \(In\[2\] at line 7\)",
                            rows[0]["text"]), rows
            assert re.search(r"holding up ranks? 0: they wait in allreduce #\d+ on COMM_WORLD", rows[1]["holding"]), \
                rows
            assert rows[0]["holding"] is None, rows
            usage = panel.locator(".mpinb-Panel-row[data-rank='0'] .mpinb-Panel-usage").inner_text()
            assert re.fullmatch(r"CPU \d+% · [\d.]+ (MiB|GiB)", usage), usage
            assert "running In[2]" in panel.locator(".mpinb-Panel-title").inner_text()
            page.screenshot(path=str(lab_pages.ARTIFACTS / "mpi-panel-notebook7.png"))
            assert low_contrast(panel) == []

            # the dark theme, as a reader picks it in Notebook 7: Settings > Theme
            page.get_by_role("menuitem", name="Settings").click()
            page.locator(".lm-Menu").get_by_text("Theme", exact=True).click()
            page.locator(".lm-Menu").get_by_text("JupyterLab Dark", exact=True).click()
            page.locator("body[data-jp-theme-light='false'][data-jp-theme-name='JupyterLab Dark']").wait_for(
                state="attached", timeout=30_000)
            rows_when(page, STRAGGLER)
            page.screenshot(path=str(lab_pages.ARTIFACTS / "mpi-panel-notebook7-dark.png"))
            assert low_contrast(panel) == []

            # a reload shows the running world at once: the state is the server's, not the page's
            page.reload()
            page.locator(".jp-Notebook").wait_for(timeout=60_000)
            panel = page.locator("#mpinb-panel")
            if not panel.is_visible():
                panel = open_from_view_menu(page)
            rows = rows_when(page, STRAGGLER, timeout=30_000)
            assert rows[1]["text"] == "running In[2] at line 6", rows
            assert "running In[2]" in panel.locator(".mpinb-Panel-title").inner_text()
            cells = page.locator(".jp-Notebook .jp-Cell")

            panel.locator("button[data-action='stop']").click()
            rows_when(page, "rows.length === 2 && rows.every(r => r.state === 'idle')", timeout=90_000)
            lab_pages.run(cells.nth(2), page, wait=True)  # the kernel is free again
            cells.nth(2).locator(".jp-OutputArea").get_by_text("after").wait_for(timeout=30_000)
        finally:
            page.close()
    assert errors == [], errors
    assert not leftover_ranks(tag)
