"""JupyterLab in Chromium for the browser tests: a JupyterLab server of the test's own (user settings of its own,
nothing read from the home directory), a notebook open in a page that records the page's console errors, its cells
run as a reader runs them (Shift+Enter), JupyterLab's theme switched, and screenshots kept in test-artifacts/.
Playwright is imported only when a browser starts: the tests that need one skip without it."""

import contextlib
import json
import os
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from lab_server import JupyterServer
from waiting import wait_for

ARTIFACTS = Path(os.environ.get("MPINB_ARTIFACTS", Path(__file__).parent.parent / "test-artifacts"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


# bqplot drawing a figure before JupyterLab gave its box a size (the plot area is then 0 minus the margins); it
# draws again once the box is laid out. Seen in one of a dozen runs; every other console error fails a test.
BQPLOT_UNSIZED = re.compile(r'Error: <rect> attribute (width|height): A negative value is not valid\. \("-\d+"\)$')


def chromium():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Chromium is missing: make test installs Debian's chromium package (apt-get install chromium)")
    return path



def run(cell, page, *, wait):
    """Select *cell* and press Shift+Enter; for a code cell, with *wait*, until it has run (its prompt shows a
    number). A request sent while the kernel's connection is still settling can be dropped, so once more if not."""
    code = "jp-CodeCell" in (cell.get_attribute("class") or "")
    for attempt in range(2):
        cell.locator(".jp-InputPrompt, .jp-Cell-inputWrapper").first.click()
        page.keyboard.press("Escape")  # command mode: Shift+Enter runs the selected cell
        page.keyboard.press("Shift+Enter")
        if not code or not wait:
            return
        if ran(cell, timeout=60, fail=False):
            return
    raise AssertionError(f"the cell did not run: {cell.inner_text()[:200]!r}")


def ran(cell, *, timeout=60, fail=True):
    """Wait until *cell* has run (its prompt shows a number); with *fail*, an error if it has not by *timeout*."""
    prompt = cell.locator(".jp-InputPrompt").first
    return wait_for(lambda: re.fullmatch(r"\[\d+\]:", prompt.inner_text().strip()),
                    lambda: f"the cell to run: {cell.inner_text()[:200]!r}", timeout, 0.2, required=fail) is not None


def lab_settings(directory):
    """User settings of the test's own: every cell rendered (JupyterLab 4 otherwise leaves cells out of view out of
    the page), no news or update checks over the network, nothing read from or written to the home directory."""
    for plugin, settings in [("notebook-extension/tracker", {"windowingMode": "none"}),
                             ("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False})]:
        path = directory / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
    return directory


def notebook_of(tmp_path, name, sources):
    """A folder holding notebook *name* whose code cells are *sources*, for :func:`notebook_in_lab`."""
    root = tmp_path / "notebooks"
    root.mkdir()
    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                 "language": "python"}})
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nbformat.write(notebook, root / name)
    return root


@contextlib.contextmanager
def lab(root, settings, monkeypatch, *, server_args=()):
    """JupyterLab on loopback serving *root* (*server_args* added to its command line), with user settings of its
    own in *settings*, and Chromium: yields ``(server, browser)``."""
    monkeypatch.setenv("JUPYTERLAB_SETTINGS_DIR", str(lab_settings(settings / "settings")))
    monkeypatch.setenv("JUPYTERLAB_WORKSPACES_DIR", str(settings / "workspaces"))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    server = JupyterServer(root)
    server.args += server_args
    from playwright.sync_api import sync_playwright

    with server, sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            yield server, browser
        finally:
            browser.close()


@contextlib.contextmanager
def notebook_page(server, browser, name, *, viewport, screenshot=None):
    """Notebook *name* open in a page of its own and its kernel idle: yields ``(page, cells)``; the page is saved to
    *screenshot* in test-artifacts/ (if named) in any case, then closed."""
    page = browser.new_page(viewport=viewport)
    try:
        page.console_errors = []  # what the page logged as errors, and its uncaught exceptions
        page.on("console", lambda message: message.type == "error" and not BQPLOT_UNSIZED.match(message.text)
                and page.console_errors.append(message.text))
        page.on("pageerror", lambda error: page.console_errors.append(str(error)))
        page.goto(f"{server.url}/lab/tree/{name}?reset&token={server.token}")
        page.locator(".jp-Notebook >> visible=true").wait_for(timeout=60_000)
        page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=60_000)
        yield page, page.locator(".jp-Notebook >> visible=true").locator(".jp-Cell")
    finally:  # also when something failed: the page shows why
        if screenshot:
            page.screenshot(path=str(ARTIFACTS / screenshot), full_page=True)
        page.close()


@contextlib.contextmanager
def notebook_in_lab(root, name, tmp_path, monkeypatch, *, viewport, screenshot):
    """JupyterLab of the test's own with notebook *name* of *root* open in Chromium (:func:`notebook_page`)."""
    with lab(root, tmp_path, monkeypatch) as (server, browser):
        with notebook_page(server, browser, name, viewport=viewport, screenshot=screenshot) as opened:
            yield opened


def use_theme(page, theme):
    """Switch JupyterLab to *theme* and wait until its variables apply."""
    page.evaluate("theme => window.jupyterapp.commands.execute('apputils:change-theme', {theme})", theme)
    light = "true" if theme == "JupyterLab Light" else "false"
    page.locator(f"body[data-jp-theme-light='{light}'][data-jp-theme-name='{theme}']").wait_for(
        state="attached", timeout=30_000)
    want = "rgb(255, 255, 255)" if light == "true" else "rgb(17, 17, 17)"
    wait_for(lambda: page.evaluate("getComputedStyle(document.querySelector('.jp-Notebook')).backgroundColor") == want,
             f"the notebook's background in {theme}", 30, 0.2)
