"""Every tutorial run cell by cell in JupyterLab in Chromium, as a reader would.

``make test`` runs two of them here, the first and the newest (every tutorial runs under nbclient there too, in
tests/test_notebooks.py); ``make soak`` runs all of them (``MPINB_EVERY_TUTORIAL=1``): about 45 s each on 2 cores.

The tutorials share one JupyterLab server and one Chromium (a module of their own: a test elsewhere that opens
Playwright while this module's is open would be refused, one sync API per thread), each tutorial in a page of
its own.
"""

import contextlib
import os
import shutil

import nbformat
import pytest
from conftest import leftover_ranks, new_world_tag
from lab_pages import ARTIFACTS, lab, notebook_page, run
from tutorial_notebooks import NOTEBOOKS
from waiting import wait_for

pytest.importorskip("playwright.sync_api", reason="playwright is installed by make test")

pytestmark = [pytest.mark.browser, pytest.mark.server, pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def tutorials_lab(tmp_path_factory):
    """One JupyterLab and one Chromium for every tutorial's run, serving a copy of notebooks/ as ``make lab`` does:
    ``(server, browser, record)``. The server's kernels note their worlds in *record*, made before the server
    started (a kernel takes the server's environment)."""
    folder = tmp_path_factory.mktemp("tutorials")
    root = folder / "notebooks"
    shutil.copytree(NOTEBOOKS, root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    record = new_world_tag()
    with pytest.MonkeyPatch.context() as monkeypatch, lab(root, folder, monkeypatch) as (server, browser):
        yield server, browser, record


def shut_down(server, name):
    """End the kernel of notebook *name*'s session, as closing it with its kernel does (and with it its world)."""
    for session in server.request("GET", "/api/sessions"):
        if session["path"] == name:
            server.request("DELETE", f"/api/sessions/{session['id']}")


IN_MAKE_TEST = ("00_quickstart.ipynb", "08_bring_your_own_script.ipynb")


@pytest.mark.parametrize("name", sorted(path.name for path in NOTEBOOKS.glob("*.ipynb")))
def test_each_tutorial_runs_in_jupyterlab_without_a_console_error(name, tutorials_lab):
    """Every tutorial, run cell by cell in JupyterLab as a reader would: the browser logs no error, no output
    reads "Error displaying widget", and each view it draws is kept as a screenshot in test-artifacts/. The
    tutorials share one server and browser, each in a page of its own; its kernel is ended after it, and with
    it every rank it started."""
    if name not in IN_MAKE_TEST and not os.environ.get("MPINB_EVERY_TUTORIAL"):
        pytest.skip("in the browser under make soak (MPINB_EVERY_TUTORIAL=1); under nbclient in test_notebooks.py")
    server, browser, tag = tutorials_lab
    count = len(nbformat.read(NOTEBOOKS / name, as_version=4).cells)
    stem = name.removesuffix(".ipynb")
    with contextlib.ExitStack() as stack:
        stack.callback(shut_down, server, name)
        page, cells = stack.enter_context(notebook_page(server, browser, name, screenshot=f"tutorial-{stem}.png",
                                                        viewport={"width": 1300, "height": 1400}))
        wait_for(lambda: cells.count() >= count, "every cell on the page", 30, 0.2)
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
        for index in range(count):
            run(cells.nth(index), page, wait=True)
        views = 0
        for index in range(count):
            output = cells.nth(index).locator(".jp-OutputArea-output:has(img), .jp-OutputArea-output:has(table)")
            for item in range(output.count()):
                views += 1
                output.nth(item).screenshot(path=str(ARTIFACTS / f"tutorial-{stem}-view-{views}.png"))
        body = page.locator("body").inner_text()
    assert "Error displaying widget" not in body
    assert page.console_errors == [], page.console_errors
    assert not leftover_ranks(tag)
