"""docs/architecture.md names the modules where each behaviour lives: every one it names must exist and import,
and every module of the package must be named there, so the page and the code cannot drift apart."""

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
PAGE = (ROOT / "docs" / "architecture.md").read_text()


def named_modules():
    """``mpinb.folder.module`` for each `file.py` the page names in a folder's row or after `folder/`."""
    names = set()
    for row in re.findall(r"^\| `mpinb/([\w/]+)/` \|.*$", PAGE, re.M):
        line = next(line for line in PAGE.splitlines() if line.startswith(f"| `mpinb/{row}/`"))
        names |= {f"mpinb.{row.replace('/', '.')}.{stem}" for stem in re.findall(r"`(\w+)\.py`", line)}
    for path in re.findall(r"\b((?:notebook|rank|wire|widgets)/(?:\w+/)*\w+)\.py\b", PAGE):
        names.add("mpinb." + path.replace("/", "."))
    for stem in re.findall(r"`mpinb/(\w+)\.py`", PAGE):
        names.add(f"mpinb.{stem}" if stem != "__init__" else "mpinb")
    return names


def test_every_module_the_architecture_page_names_imports():
    names = named_modules()
    assert len(names) > 40
    for name in sorted(names):
        importlib.import_module(name)


def test_every_module_of_the_package_is_on_the_architecture_page():
    names = named_modules() | {"mpinb"}
    files = {".".join(path.relative_to(ROOT).with_suffix("").parts) for path in (ROOT / "mpinb").rglob("*.py")}
    files = {name.removesuffix(".__init__") for name in files}
    folders = {".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "mpinb").rglob("__init__.py")}
    missing = sorted(files - names - folders)
    assert not missing, f"docs/architecture.md does not say where these live: {missing}"
