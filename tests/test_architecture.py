"""docs/architecture.md names the modules where each behaviour lives: every one it names must exist and import,
and every module of the package must be named there, so the page and the code cannot drift apart."""

import ast
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


def imports(path):
    """``(module, name)`` for each ``from module import name`` of *path*, the module made absolute."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found += [(module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
    return found


def test_no_private_name_is_imported_from_another_module():
    """A feature of several modules is a package whose modules share public names: ``_name`` stays in its module."""
    private = [f"{path.relative_to(ROOT)}: {name} from {module}" for path in (ROOT / "mpinb").rglob("*.py")
               for module, name in imports(path) if name and name.startswith("_") and not name.startswith("__")]
    assert not private, private


LAYERS = {"wire": 0, "rank": 1, "widgets": 2, "notebook": 3}  # each imports only its own layer and those below


def test_no_import_runs_back_up_a_layer():
    """``wire/`` (and ``errors.py`` above it) at the bottom, then ``rank/``, ``widgets/``, ``notebook/``: views are
    handed what they draw and never import the notebook side; the ranks import nothing of the notebook."""
    upward = []
    for path in (ROOT / "mpinb").rglob("*.py"):
        parts = path.relative_to(ROOT / "mpinb").parts
        if parts[0] not in LAYERS:
            continue
        for module, _ in imports(path):
            target = module.split(".")
            if target[0] == "mpinb" and len(target) > 1 and LAYERS.get(target[1], -1) > LAYERS[parts[0]]:
                upward.append(f"{path.relative_to(ROOT)} imports {module}")
            if parts[0] == "wire" and module == "mpinb.errors":
                upward.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not upward, upward


def test_only_world_assigns_its_attributes():
    """``World`` owns its state: code outside its class calls its methods, never sets what it holds."""
    outside = []
    for path in (ROOT / "mpinb" / "notebook").rglob("*.py"):
        if path.name == "cluster.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                for each in ast.walk(target):
                    if isinstance(each, ast.Attribute) and ast.unparse(each.value).split(".")[-1] == "world":
                        outside.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(target)}")
    assert not outside, outside


MODULE_LINES, FUNCTION_LINES, CLASS_METHODS = 400, 60, 25  # a room's size: read in one sitting


def sources():
    return [(path.relative_to(ROOT), path.read_text()) for path in sorted((ROOT / "mpinb").rglob("*.py"))]


def test_no_module_function_or_class_outgrows_a_room():
    """No module over 400 lines, no function over 60 (its nested functions counted in it), no class over 25
    methods: past these sizes code is split by what it does."""
    large = []
    for path, text in sources():
        if len(text.splitlines()) > MODULE_LINES:
            large.append(f"{path}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno - node.lineno + 1 > FUNCTION_LINES:
                large.append(f"{path}:{node.lineno}: {node.name}, {node.end_lineno - node.lineno + 1} lines")
            if isinstance(node, ast.ClassDef):
                methods = [each for each in node.body if isinstance(each, (ast.FunctionDef, ast.AsyncFunctionDef))]
                if len(methods) > CLASS_METHODS:
                    large.append(f"{path}:{node.lineno}: class {node.name}, {len(methods)} methods")
    assert not large, large


def test_no_code_asks_which_launcher_outside_the_launchers():
    """What differs between launchers is a method of each (``notebook/world/launchers/``): nowhere else compares
    a launcher's name, so a new launcher is one class and its entry point."""
    from mpinb.notebook.world.launchers.registry import OWN
    names = set(OWN) | {"local", "mpiexec"}
    asking = []
    for path, text in sources():
        if path.parts[:4] == ("mpinb", "notebook", "world", "launchers"):
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            constants = {side.value for side in sides if isinstance(side, ast.Constant)} | \
                {each.value for side in sides if isinstance(side, (ast.Tuple, ast.List, ast.Set))
                 for each in side.elts if isinstance(each, ast.Constant)}
            if constants & names and "launcher" in ast.unparse(node).lower():
                asking.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert not asking, asking
