"""Run one cell on this rank the way IPython would, and describe the outcome as plain, picklable data."""

import ast
import importlib
import linecache
import os
import sys
import sysconfig
import traceback
import types

from ..wire.kinds import CellReply
from ..wire.rank_files import WRAPPERS
from . import grad_mode, stacks

_RESULT = "_mpinb_cell_value"
# the frames between the agent and the cell: this module's, and the visual debugger's that runs a cell under it
RUNNER_FILES = (__file__, os.path.join(os.path.dirname(__file__), "debug", "visual_debugger.py"))
# what runs a script file for %mpi run, called by a one-line cell: that line and its frames are not the user's code
SCRIPT_RUNNER = os.path.join(os.path.dirname(__file__), "run_script.py")


class RemoteValue:
    """Stands in for a rank's value that cannot travel to the notebook (it cannot be pickled)."""

    def __init__(self, type_name, text):
        self.type_name = type_name
        self.text = text

    def __repr__(self):
        return self.text


def execute(code, *, number=0, namespace=None, source=None, debug=None):
    """Execute *code* in *namespace* and return a :class:`~mpinb.wire.kinds.CellReply` with its value or error.

    IPython syntax (``%magics``, ``!shell``) works when an IPython shell runs this rank, and tracebacks name
    the cell as ``Cell In[number]``; the value of a final expression is returned, as in a notebook cell.
    *source* is *code* as the notebook's IPython transformed it already (the same for every rank; the rank's
    own shell transforms *code* when it is not given).
    With *debug* (a :class:`~mpinb.wire.kinds.DebugSetup`: the kernel's visual debugger is on), the cell runs
    under the rank's end of that debugger when it has breakpoints or exception filters (``debug/visual_debugger.py``).
    Exceptions never escape: they come back described, so one failing rank never turns into a lost reply.
    The value is returned as it is; whoever sends it uses :func:`stand_in` if it does not pickle.
    """
    shell = ipython_shell()
    if namespace is None:
        namespace = user_namespace(shell)
    grad = grad_mode.at_start()
    try:
        if shell is not None:
            if source is None:  # IPython's transform drops leading blank lines: the %%mpi line's stays
                body = code.lstrip("\n")
                source = code[:len(code) - len(body)] + shell.transform_cell(body)
            filename = shell.compile.cache(source, number, raw_code=code)
        else:
            source, filename = code, f"<mpi cell {number}>"
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        stacks.cell_started(filename, number)
        compiled = _compile(source, filename)
        if debug is None:
            exec(compiled, namespace)
        else:
            _debugged(debug, filename, compiled, namespace)
        value = namespace.pop(_RESULT, None)
    except BaseException as exc:  # noqa: BLE001 - every failure, KeyboardInterrupt too, is reported
        from .debug import post_mortem as debug

        debug.keep(exc)  # for %mpi debug
        grad_mode.after_stop(exc, grad)
        return CellReply(error=describe_error(exc, shell))
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    if value is not None:
        namespace["_"] = value
    return CellReply(value=value)


def _debugged(debug, filename, compiled, namespace):
    from .debug import visual_debugger

    visual_debugger.cell_paths[filename] = (debug.path, debug.offset)
    if debug.armed:
        visual_debugger.RankDebugger(debug, filename).run_cell(compiled, namespace)
    else:
        exec(compiled, namespace)


def call(request):
    """Like :func:`execute`, for a :class:`~mpinb.wire.kinds.Call` of mpinb's own rank-side code: its value,
    or its error described."""
    if not request.module.startswith("mpinb.rank."):
        return CellReply(error=describe_error(ValueError(f"{request.module} is not rank-side code of mpinb")))
    try:
        value = getattr(importlib.import_module(request.module), request.name)(*request.args)
    except BaseException as exc:  # noqa: BLE001 - reported like a cell's
        return CellReply(error=describe_error(exc, ipython_shell()))
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    return CellReply(value=value)


def user_namespace(shell=None):
    """Where cells run: the engine's IPython user namespace, else ``__main__``'s globals."""
    shell = shell or ipython_shell()
    return shell.user_ns if shell is not None else sys.modules["__main__"].__dict__


_get_ipython = None  # IPython's get_ipython, imported on first use (this module imports nothing of IPython)


def ipython_shell():
    """The IPython shell running this rank's cells, its compiler set to name cells as IPython does, or ``None``
    where none runs (a script under plain ``mpiexec``)."""
    global _get_ipython
    if _get_ipython is None:
        try:
            from IPython.core.getipython import get_ipython
        except ImportError:
            return None
        _get_ipython = get_ipython
    shell = _get_ipython()
    if shell is not None and "get_code_name" not in vars(shell.compile):
        _name_cells_as_ipython_does(shell.compile)
    return shell


def _name_cells_as_ipython_does(compiler):
    """Name cells as IPython's own compiler does (``<ipython-input-N-HASH>``, hashed by sha1 in C).

    The engine's kernel compiler (ipykernel's) hashes every cell's text in pure Python (murmur2) to make a file
    name for its debugger, which ranks do not use: 105 µs for 500 bytes, on every rank for every cell. Tracebacks
    and pdb still read ``Cell In[N]`` (IPython maps either name to N)."""
    from IPython.core.compilerop import CachingCompiler

    compiler.get_code_name = CachingCompiler.get_code_name.__get__(compiler)


def _compile(source, filename):
    """Compile a cell; a final expression becomes an assignment to ``_RESULT`` so its value can be picked up."""
    tree = ast.parse(source, filename=filename)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        target = ast.Name(id=_RESULT, ctx=ast.Store())
        tree.body[-1] = ast.copy_location(ast.Assign(targets=[target], value=last.value), last)
        ast.fix_missing_locations(tree)
    return compile(tree, filename, "exec")


def describe_error(exc, shell=None):
    """Type, message and a traceback rendered like IPython's (frames of this module left out).

    Never raises: an exception whose ``__str__`` (or whose traceback's rendering) fails is still described,
    with what could not be rendered said in its place.
    """
    tb = _without_wrappers(exc.__traceback__)
    while tb is not None and tb.tb_frame.f_code.co_filename in RUNNER_FILES:
        tb = tb.tb_next
    tb = _from_the_script(tb)
    tb, left_out = _shortened(tb)
    tb, folded = _folded(tb)
    if isinstance(exc, SyntaxError):
        tb = None  # the compiler's frames say nothing: the error itself names the file, line and column
    # in the cell itself: said as IPython says it, the line with a caret under Cell In[N], not the file's name
    in_cell = isinstance(exc, SyntaxError) and str(exc.filename or "").startswith("<")
    ename = type(exc).__name__
    evalue = f"{exc.msg} (cell line {exc.lineno})" if in_cell else _text(exc)
    try:
        if shell is not None and in_cell:
            lines = shell.SyntaxTB.structured_traceback(type(exc), exc, [])
        elif shell is not None:
            lines = shell.InteractiveTB.structured_traceback(type(exc), exc, tb)
        else:
            lines = traceback.format_exception(type(exc), exc, tb)
        lines = [str(line) for line in lines]
    except Exception:  # noqa: BLE001 - the rendering itself failed: fall back to the frames alone
        lines = ["Traceback (most recent call last):\n", *traceback.format_tb(tb), f"{ename}: {evalue}\n"]
    if left_out:
        lines.insert(0, f"[... {left_out} frames left out: the first {KEPT_FRAMES} and the last {KEPT_FRAMES} are "
                        "shown]\n")
    if folded:
        lines.insert(0, f"[... {sum(folded.values())} frames inside {', '.join(sorted(folded))} left out, between "
                        "the first and the last two of each run: %mpi debug R shows them all]\n")
    if ename == "RuntimeError" and "did not receive grad" in evalue:  # DDP's, about unused parameters: name them
        from .tracing.trace_ddp import explain

        evalue = explain(exc, evalue)
    return {"ename": ename, "evalue": evalue, "traceback": lines}


def _from_the_script(tb):
    """*tb* from the script's first frame when the cell ran a script file (``%mpi run``): the cell's call of
    :data:`SCRIPT_RUNNER` and that module's frames left out (``None`` when the script itself has none)."""
    if tb is None or tb.tb_next is None or tb.tb_next.tb_frame.f_code.co_filename != SCRIPT_RUNNER:
        return tb
    tb = tb.tb_next
    while tb is not None and tb.tb_frame.f_code.co_filename == SCRIPT_RUNNER:
        tb = tb.tb_next
    return tb


KEPT_FRAMES = 100  # at each end of a longer traceback: IPython renders a frame in about 0.35 ms


def _shortened(tb):
    """*tb* with at most ``2 * KEPT_FRAMES`` frames (its first and last), and how many were left out: a
    RecursionError under a raised recursion limit otherwise kept its rank rendering for minutes."""
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    if len(frames) <= 2 * KEPT_FRAMES:
        return (frames[0] if frames else None), 0
    kept = frames[:KEPT_FRAMES] + frames[-KEPT_FRAMES:]
    for outer, inner in zip(kept, kept[1:]):
        outer.tb_next = inner
    return kept[0], len(frames) - len(kept)


LIBRARY_RUN = 5  # library frames in a row folded to their first and last two when there are more


def _folded(tb):
    """*tb* as a new chain (the rank's own traceback, which ``%mpi debug`` reads, is left whole) where each run of
    more than :data:`LIBRARY_RUN` frames in installed packages or the standard library keeps its first frame
    (where the user's code called in) and its last two (where it raised); ``{package: frames left out}``.
    A framework's error (DDP's, Lightning's) otherwise buried the line of the user's code under pages of its
    internals."""
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    kept, folded, run = [], {}, []

    def end_run():
        if len(run) > LIBRARY_RUN:
            for dropped in run[1:-2]:
                name = _package(dropped.tb_frame.f_code.co_filename)
                folded[name] = folded.get(name, 0) + 1
            kept.extend([run[0], *run[-2:]])
        else:
            kept.extend(run)
        run.clear()

    for frame in frames:
        if _package(frame.tb_frame.f_code.co_filename) is None:
            end_run()
            kept.append(frame)
        else:
            run.append(frame)
    end_run()
    if not folded:
        return (frames[0] if frames else None), {}
    chain = None
    for frame in reversed(kept):
        chain = types.TracebackType(chain, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return chain, folded


def _package(filename):
    """The top-level package of an installed module's *filename* (``torch``), ``"the standard library"``, or
    ``None`` for the user's code (a cell, a script, a module of theirs)."""
    for root in _LIBRARY_ROOTS:
        if filename.startswith(root):
            rest = filename[len(root):].lstrip(os.sep)
            top = rest.split(os.sep, 1)[0]
            if root in _SITE_ROOTS:
                return top.removesuffix(".py")
            return "site-packages" if top == "site-packages" else "the standard library"
    return None


_SITE_ROOTS = tuple({sysconfig.get_paths()[key] for key in ("purelib", "platlib")})
_LIBRARY_ROOTS = _SITE_ROOTS + (sysconfig.get_paths()["stdlib"],)


def _without_wrappers(tb):
    """*tb* without the frames of mpinb's wrappers around MPI calls (an error MPI raises in a traced call reads
    as if the cell had called mpi4py itself; ``%mpi debug`` does not stop in them either)."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.endswith(WRAPPERS):
            kept.append(tb)
        tb = tb.tb_next
    for outer, inner in zip(kept, kept[1:]):
        outer.tb_next = inner
    if kept:
        kept[-1].tb_next = None
    return kept[0] if kept else None


def _text(exc):
    """``str(exc)``, or why it has none (its ``__str__`` raised)."""
    try:
        return str(exc)
    except Exception as inner:  # noqa: BLE001 - user code's __str__ may raise anything
        try:
            inner_text = f"{type(inner).__name__}: {inner}"
        except Exception:  # noqa: BLE001
            inner_text = type(inner).__name__
        return f"<str() of this {type(exc).__name__} raised {inner_text}>"


def stand_in(value):
    """A :class:`RemoteValue` carrying *value*'s repr, for a value that cannot be pickled."""
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - a user type's __repr__ may raise
        text = f"<{type(value).__name__} object: its repr() raised {type(exc).__name__}>"
    return RemoteValue(type(value).__name__, text)
