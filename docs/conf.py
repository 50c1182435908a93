"""Sphinx with MyST-NB: the reference pages in this folder and the tutorials in ../notebooks, executed as the site
is built (a failing cell fails the build), with the images and tables mpinb leaves in each cell's output."""

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "_ext"))

# The tutorials live in notebooks/ (where `make lab` opens them); the site builds from a copy, made fresh each time.
TUTORIALS = HERE / "tutorials"
shutil.rmtree(TUTORIALS, ignore_errors=True)
TUTORIALS.mkdir()
for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
    # a tutorial links a reference page as ../docs/page.md (JupyterLab opens it from notebooks/); here: ../page.md
    text = notebook.read_text().replace("](../docs/", "](../")
    (TUTORIALS / notebook.name).write_text(text)
# the tutorials' drawings live beside them (notebooks/images: JupyterLab serves nothing above the folder it opens)
shutil.copytree(ROOT / "notebooks" / "images", TUTORIALS / "images")

project = "mpinb"
author = "the mpinb developers"
copyright = "2026, the mpinb developers"
extensions = ["myst_nb", "mpinb_reference"]  # mpinb_reference: the API reference, from the code (docs/_ext)
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

nb_execution_mode = "cache"  # executed in the build; an unchanged notebook is not run again in the next one
nb_execution_cache_path = str(HERE / "_build" / ".jupyter_cache")
nb_execution_timeout = 300
nb_execution_raise_on_error = True
nb_execution_show_tb = True

# Offline, like the machines it is read on: no script from a CDN. Widgets are not embedded (that needs require.js
# and the widget manager from unpkg/jsdelivr); every mpinb view also leaves a static rendering (HTML, PNG) in the
# cell's output, which is what the page shows.
nb_ipywidgets_js = {}
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None),
                              ("html", "application/vnd.jupyter.widget-state+json", None)]

html_theme = "sphinx_book_theme"
html_title = "mpinb"
html_theme_options = {"show_toc_level": 2}
html_context = {"default_mode": "auto"}  # light or dark as the reader's system is (none set logs a console error)
html_last_updated_fmt = None

# The API reference (reference/): autodoc, autosummary and napoleon, which reads both the numpy sections
# (Parameters, Returns) and the Google ones (Args:, Raises:) the docstrings use. Names keep their module's
# path (mpinb.torch.init_process_group), signatures show no type hints the code does not have.
autodoc_member_order = "bysource"
autodoc_typehints = "none"
autosummary_generate = False  # the summary tables link to entries on the same page; no stub pages to keep
napoleon_use_rtype = False

# linkcheck: the links inside the site (pages, anchors); the web is not reachable from every build machine
linkcheck_ignore = [r"https?://.*"]
linkcheck_anchors = True
