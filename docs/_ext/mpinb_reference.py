"""The reference pages' parts that come from the code, so they cannot drift from it. Directives for reST pages
(docs/reference/*.rst: autodoc's output and the docstrings are reST, which a MyST page would read as Markdown):

- ``.. mpinb-magics::``: ``%%mpi``, ``%mpi`` and each of its subcommands, read from the argparse parsers the
  magics parse with (``mpinb/notebook/arguments.py``): usage, what each does, each option and its default.
- ``.. mpinb-settings::``: every ``%config MPIMagics.<setting>``, read from ``MPIMagics.class_traits(config=True)``:
  type, default and ``help=``.
- ``.. mpinb-module:: NAME``: a module's public API, every name of its ``__all__``, in autosummary's table and
  autodoc's entries (napoleon reads their numpy and Google sections).

Roles for any page: ``{magic}`%mpi start``` and ``{setting}`default_ranks``` (MyST) link to those entries; one
that names nothing is a warning.

What users would read without a text fails the build (a warning, and ``sphinx -W`` fails on it), named: a public
name autodoc documents with no docstring, a setting with an empty ``help=``, a magic or option without help.
"""

import argparse
import importlib
import inspect
import re

from docutils import nodes
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

logger = logging.getLogger(__name__)

WIDTH = 72  # usage lines wrap here, to fit the page's column


# ----------------------------------------------------------------------------------------- text and tables


CODE = re.compile(
    r"``?(?P<quoted>[^`]+)``?"  # Markdown's and reST's backticks
    r"|(?P<code>\[['\"][^\]]*\]"  # a Python list: ['--gres=gpu:1']
    r"|%%?mpi(?: (?:start|stop|restart|status|output|metrics|grads|view|trace|who|debug|inject))?(?![\w-])"
    r"|(?<![\w-])--?[A-Za-z][\w-]*(?:=[^\s,;)]+)?"  # an option: -n, --timeout, --scheduler-arg=--gres=gpu:1
    r"|\b[\w.]+\(\)"  # a call: mpinb.report()
    r"|\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b"  # an environment variable: OMP_NUM_THREADS
    r"|MPIMagics\.\w+)"  # a setting
)


def inline(text):
    """*text* as inline nodes, with what users type as code: `quoted` parts (the help strings are written for a
    terminal, with Markdown's backticks), options, magics, calls, environment variables. (Code is also what keeps
    ``--mpi`` from being typeset with a dash.)"""
    out, at = [], 0
    for match in CODE.finditer(text):
        if match.start() > at:
            out.append(nodes.Text(text[at:match.start()]))
        code = match.group("quoted") or match.group("code")
        out.append(link(code))
        at = match.end()
    if at < len(text):
        out.append(nodes.Text(text[at:]))
    return out


def link(code):
    """*code* as code, linked to its entry when it is a magic (``%mpi start``) or a setting (``MPIMagics.ip``)."""
    if code.startswith("MPIMagics."):
        reftype, target = "setting", code.split(".", 1)[1]
    elif code == "%%mpi" or code.startswith("%mpi "):
        reftype, target = "magic", code
    else:
        return nodes.literal(code, code)
    return addnodes.pending_xref("", nodes.literal(code, code), refdomain="std", reftype=reftype, reftarget=target,
                                 refexplicit=True, refwarn=True)


def paragraph(text):
    return nodes.paragraph("", "", *inline(text))


def table(header, rows, widths):
    """A table node: *rows* of cells, each a node, a list of nodes or a string."""
    group = nodes.tgroup(cols=len(header))
    for width in widths:
        group += nodes.colspec(colwidth=width)
    group += nodes.thead("", _row(header))
    group += nodes.tbody("", *[_row(cells) for cells in rows])
    return nodes.table("", group, classes=["mpinb-reference"])


def _row(cells):
    row = nodes.row()
    for cell in cells:
        if isinstance(cell, str):
            cell = paragraph(cell)
        row += nodes.entry("", *(cell if isinstance(cell, list) else [cell]))
    return row


def section(directive, title, anchor, objtype):
    """A section titled *title* (as code) that ``{objtype}`title``` links to."""
    node = nodes.section(ids=[anchor])
    node += nodes.title("", "", nodes.literal(title, title))
    directive.env.get_domain("std").note_object(objtype, title, anchor, location=node)
    return node


def missing(what, location):
    logger.warning(f"{what}: users read this in the reference, so it needs one", type="mpinb", subtype="missing",
                   location=location)


# ----------------------------------------------------------------------------------------- the magics


def _formatter(prog):
    return argparse.HelpFormatter(prog=prog, width=WIDTH)


def usage(prog, parser):
    """``%mpi start [-n N] [--mpi MPI] ...`` as argparse writes it, without ``usage:``."""
    formatter = _formatter(prog)
    return formatter._format_usage(None, parser._actions, parser._mutually_exclusive_groups, "").strip()


def options(directive, prog, parser):
    """The table of *parser*'s arguments: how to write each, what it does and its default; ``None`` if none."""
    formatter = _formatter(prog)
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        written = formatter._format_action_invocation(action)
        if not action.option_strings:
            written = formatter._format_args(action, formatter._get_default_metavar_for_positional(action))
        if not action.help:
            missing(f"{prog} {written} has no help", directive.get_location())
        text = formatter._expand_help(action) if action.help else ""
        default = action.default
        if default not in (None, False, True, argparse.SUPPRESS) and action.nargs != 0 and f"default {default}" \
                not in text and f"default: {default}" not in text:
            text += f" (default {default})"
        rows.append([nodes.paragraph("", "", nodes.literal(written, written)), paragraph(text)])
    return table(["option", ""], rows, [30, 70]) if rows else None


def literal_block(text):
    return nodes.literal_block(text, text, language="text")


def docstring_parts(function):
    """*function*'s docstring without what ``magic_arguments`` added (the usage before it, the options after it),
    and its ``Examples`` section's text (or ``None``)."""
    text = inspect.getdoc(function) or ""
    if text.startswith("::"):
        text = text.split("\n\n", 2)[2]  # "::", the usage
    text = text.split("\noptions:\n")[0]
    head, _, examples = text.partition("\nExamples\n--------\n")
    examples = examples.strip()
    if examples.startswith("::"):
        examples = inspect.cleandoc(examples[2:])
    return head.strip(), examples or None


class MagicsDirective(SphinxDirective):
    """``%%mpi`` and every ``%mpi`` subcommand, from the parsers the magics use."""

    def run(self):
        from mpinb.notebook import arguments
        from mpinb.notebook import usage as magic_usage
        from mpinb.notebook.magics import MPIMagics

        self.env.note_dependency(arguments.__file__)  # an incremental build reads this page again when they change
        self.env.note_dependency(magic_usage.__file__)
        self.env.note_dependency(inspect.getfile(MPIMagics))
        out = []

        cell = section(self, "%%mpi", "cell-magic", "magic")
        head, examples = docstring_parts(MPIMagics.mpi_cell)
        cell += self.parse_rst(head)
        cell += literal_block(usage("%%mpi", MPIMagics.mpi_cell.parser))
        cell += options(self, "%%mpi", MPIMagics.mpi_cell.parser)
        if examples:
            cell += literal_block(examples)
        out.append(cell)

        line = arguments.line_parser()
        commands = line._subparsers._group_actions[0]
        helps = {action.dest: action.help for action in commands._choices_actions}
        whole = section(self, "%mpi", "line-magic", "magic")
        whole += paragraph(line.description or "")
        whole += paragraph("One subcommand per action: " + ", ".join(f"%mpi {name}" for name in commands.choices)
                           + ". The world stops with the kernel.")
        examples = docstring_parts(MPIMagics.mpi)[1]
        if examples:
            whole += literal_block(examples)
        out.append(whole)
        for name, parser in commands.choices.items():
            prog = f"%mpi {name}"
            node = section(self, prog, f"mpi-{name}", "magic")
            if not helps.get(name):
                missing(f"{prog} has no help", self.get_location())
            text = helps.get(name) or ""
            node += paragraph(text[:1].upper() + text[1:] + ("." if text and not text.endswith(".") else ""))
            node += literal_block(usage(prog, parser))
            table_node = options(self, prog, parser)
            if table_node is not None:
                node += table_node
            whole += node
        return out

    def parse_rst(self, text):
        """The nodes of *text*, a docstring's reST."""
        container = nodes.container()
        nested_parse_with_titles(self.state, StringList(text.splitlines(), source="MPIMagics.mpi_cell"), container)
        return container.children


# ----------------------------------------------------------------------------------------- the settings


def kind(trait):
    """What a setting takes, in words: ``int``, ``str``, ``list of str``, ``one of mpi, ssh``..."""
    name = type(trait).__name__
    if name == "Enum":
        return "one of " + ", ".join(str(value) for value in trait.values)
    if name == "List":
        inner = getattr(trait, "_trait", None)
        return f"list of {kind(inner)}" if inner is not None else "list"
    return {"Int": "int", "Integer": "int", "Float": "float", "Unicode": "str", "Bool": "bool"}.get(name, name)


class SettingsDirective(SphinxDirective):
    """A table of every ``%config MPIMagics.<setting>``: type, default, help, in the order the class defines them."""

    def run(self):
        from mpinb.notebook.magics import MPIMagics

        traits = MPIMagics.class_traits(config=True)
        defining = [klass for klass in MPIMagics.__mro__ if any(name in traits for name in vars(klass))]
        for klass in defining:
            self.env.note_dependency(inspect.getfile(klass))
        # in the order the classes that define them (MPIMagics, then the settings it inherits) do
        ordered = list(dict.fromkeys(name for klass in defining for name in vars(klass) if name in traits))
        rows = []
        std = self.env.get_domain("std")
        for name in ordered:
            trait = traits[name]
            if not (trait.help or "").strip():
                missing(f"MPIMagics.{name} has an empty help=", self.get_location())
            anchor = f"setting-{name.replace('_', '-')}"
            std.note_object("setting", name, anchor, location=self.get_location())
            default = trait.default_value_repr()
            first = nodes.line_block("", nodes.line("", "", nodes.literal(name, name)), nodes.line("", kind(trait)),
                                     ids=[anchor])
            rows.append([first, nodes.paragraph("", "", nodes.literal(default, default)), paragraph(trait.help or "")])
        return [table(["setting", "default", ""], rows, [24, 14, 62])]


# ----------------------------------------------------------------------------------------- a module's API


def public_names(module):
    """*module*'s ``__all__``, the dunders (``__version__``) last."""
    names = list(module.__all__)
    return [name for name in names if not name.startswith("__")] + [name for name in names if name.startswith("__")]


def directive_for(obj):
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return "autoexception", [":members:", ":undoc-members:", ":show-inheritance:"]
    if inspect.isclass(obj):
        return "autoclass", [":members:", ":undoc-members:"]
    if callable(obj):
        return "autofunction", []
    return "autodata", []


class ModuleDirective(SphinxDirective):
    """``{mpinb-module} mpinb.torch``: the module's docstring, a summary table of its ``__all__``, then each name."""

    required_arguments = 1

    def run(self):
        name = self.arguments[0]
        module = importlib.import_module(name)
        self.env.note_dependency(module.__file__)  # its __all__; autodoc notes the modules of the names it reads
        if not getattr(module, "__all__", None):
            logger.warning(f"{name} has no __all__: its public names are what it lists", location=self.get_location())
            return []
        names = public_names(module)
        lines = [f".. automodule:: {name}", "", ".. autosummary::", ""]
        lines += [f"   {item}" for item in names]
        for item in names:
            directive, opts = directive_for(getattr(module, item))
            lines += ["", f".. {directive}:: {name}.{item}"] + [f"   {opt}" for opt in opts]
        container = nodes.container()
        nested_parse_with_titles(self.state, StringList(lines, source=f"{name}.__all__"), container)
        return container.children


# ----------------------------------------------------------------------------------------- the docstring check


def check_docstring(app, what, name, obj, options, lines):
    """A public name autodoc documents without a docstring is a warning, named."""
    last = name.rsplit(".", 1)[-1]
    if last.startswith("_") and not (last.startswith("__") and last.endswith("__")):
        return
    text = [line.strip() for line in lines if line.strip()]
    if what in ("data", "attribute") and text and text[0] == inspect.getdoc(type(obj)).splitlines()[0].strip():
        text = []  # autodoc fell back on the docstring of the value's type (str's, tuple's): the name has none
    if text:
        return
    seen = app.env.temp_data.setdefault("mpinb_undocumented", set())
    if name in seen:  # autosummary's table and autodoc's entry both ask
        return
    seen.add(name)
    missing(f"{what} {name} has no docstring", (app.env.docname, None))


def warn_dangling(app, env, node, contnode):
    """``{magic}`` and ``{setting}`` that name nothing are warnings (Sphinx lets generic roles dangle silently)."""
    if node.get("refdomain") == "std" and node.get("reftype") in ("magic", "setting"):
        logger.warning(f"{node['reftype']} {node['reftarget']!r} is not in the reference (is it spelled as in "
                       "the code?)", location=node, type="mpinb", subtype="xref")
    return None


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.setup_extension("sphinx.ext.autosummary")
    app.setup_extension("sphinx.ext.napoleon")
    app.add_crossref_type("magic", "magic", objname="magic")
    app.add_crossref_type("setting", "setting", objname="MPIMagics setting")
    app.add_directive("mpinb-magics", MagicsDirective)
    app.add_directive("mpinb-settings", SettingsDirective)
    app.add_directive("mpinb-module", ModuleDirective)
    app.connect("autodoc-process-docstring", check_docstring, priority=900)  # after napoleon's rewrite
    app.connect("missing-reference", warn_dangling)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
