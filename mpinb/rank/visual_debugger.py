"""The rank's end of the notebook's visual debugger (JupyterLab's panel, or any client of the kernel's Debug
Adapter Protocol): breakpoints in a ``%%mpi`` cell, its exception filters, and the requests of a stop.

The kernel sends each cell a :class:`~mpinb.wire.kinds.DebugSetup` while its debugger is on. A cell with
breakpoints or exception filters runs under :class:`RankDebugger` (Python's ``bdb``, on the cell's thread only:
the rank's other threads are never traced). Where it stops, it says so (:class:`~mpinb.wire.kinds.DebugStopped`)
and answers the panel's requests (:class:`~mpinb.wire.kinds.DebugCommand`, handed over by the roll-call thread)
until one resumes it. Frames of the cell are named by the kernel's path for the cell and its lines, so that the
panel shows them in the cell; frames of mpinb's own code are never shown. Ids are those of
``wire/debug_ids.py``. The Stop button interrupts a stopped rank as it does a running one.
"""

import bdb
import builtins
import linecache
import os
import queue
import reprlib
import sys

from ..wire import debug_ids
from ..wire.kinds import DebugAnswer, DebugStopped

_MPINB = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_requests = queue.SimpleQueue()  # DebugCommands for the stopped debugger, from the roll-call thread
_send = None  # sends a message to the notebook after the output before it: set by the agent
rank = None
cell_id = None  # the running cell's (the agent sets it)
armed = True  # False once the debugger was switched off during the running cell: nothing stops it any more
cell_paths = {}  # file a cell was compiled as here -> (the kernel's path for it, line offset)
stopped = False  # whether this rank waits in the visual debugger now
RESUMING = ("continue", "next", "stepIn", "stepOut")
SHOWN_ITEMS = 300  # children of one value listed at most
_repr = reprlib.Repr()
_repr.maxstring, _repr.maxother, _repr.maxlist, _repr.maxdict = 200, 200, 20, 20


def install(send, this_rank):
    """Send what the debugger says through *send(message)* (the agent's outbox)."""
    global _send, rank
    _send, rank = send, this_rank


def request(command):
    """A :class:`~mpinb.wire.kinds.DebugCommand` from the notebook (the roll-call thread calls this).
    ``disconnect`` (the panel was switched off) lets a stopped rank go on, and stops nothing else in its cell."""
    global armed
    if command.command == "disconnect":
        armed = False
    if stopped:
        _requests.put(command)
    else:  # nothing waits to answer it: say so at once
        _answer(command.seq, False, {}, f"rank {rank} is not stopped in the debugger")


def _answer(seq, success, body, message=""):
    if _send is not None:
        _send(DebugAnswer(rank, seq, success, body, message))


def mpinb_frame(frame):
    """Whether *frame* runs mpinb's own code (never shown in the panel)."""
    return frame.f_code.co_filename.startswith(_MPINB)


class RankDebugger(bdb.Bdb):
    """Runs one cell, stopping at its breakpoints and, with the filters asked for, where an exception is raised
    or where the cell failed; each stop is served by :meth:`serve`."""

    def __init__(self, setup, filename):
        super().__init__(skip=["mpinb", "mpinb.*"])
        self.setup, self.filename = setup, filename
        self.raised = "raised" in setup.filters
        self.failed = bool({"uncaught", "userUnhandled"} & set(setup.filters))
        self.seen = None  # the exception last stopped at (once each, where raised, not at each frame it leaves)
        for line in setup.lines:
            self.set_break(filename, line)

    def run_cell(self, code, namespace):
        """``exec(code, namespace)`` under the debugger: stop only at breakpoints (and exceptions) until told to
        step."""
        global armed
        armed = True
        self.reset()
        self.botframe = sys._getframe()
        self._go_on()
        sys.settrace(self.trace_dispatch)
        try:
            exec(code, namespace)
        except BaseException as exc:
            if self.failed and not isinstance(exc, (KeyboardInterrupt, bdb.BdbQuit)):
                self._post_mortem(exc)
            raise
        finally:
            sys.settrace(None)
            self.clear_all_breaks()

    def _go_on(self):
        """Run on to the next breakpoint (bdb's ``set_continue``, which stops tracing where nothing can stop)."""
        self._set_stopinfo(self.botframe, None, -1)

    # bdb's hooks: where to stop
    def dispatch_call(self, frame, arg):
        if self.raised and not mpinb_frame(frame):  # exceptions are seen only in traced frames
            super().dispatch_call(frame, arg)
            return self.trace_dispatch
        return super().dispatch_call(frame, arg)

    def dispatch_exception(self, frame, arg):
        exc = arg[1]
        if self.raised and armed and exc is not self.seen and not mpinb_frame(frame) and \
                not isinstance(exc, (StopIteration, GeneratorExit, KeyboardInterrupt)):
            self.seen = exc
            self.serve(frame, "exception", _describe(exc))
            return self.trace_dispatch
        return super().dispatch_exception(frame, arg)

    def user_line(self, frame):
        if armed:
            self.serve(frame, "breakpoint" if self.break_here(frame) else "step", "")

    def user_call(self, frame, argument_list):
        pass  # a step into a function stops at its first line, not at its call

    def user_return(self, frame, return_value):
        pass

    def user_exception(self, frame, exc_info):
        pass

    def _post_mortem(self, exc):
        """Stop where the cell failed, its frames those of the traceback (the panel's uncaught-exception filter)."""
        tb, frames = exc.__traceback__, []
        while tb is not None:
            if not mpinb_frame(tb.tb_frame):
                frames.append((tb.tb_frame, tb.tb_lineno))
            tb = tb.tb_next
        if frames and armed:
            sys.settrace(None)
            serve(frames[::-1], "exception", _describe(exc))

    def serve(self, frame, reason, text):
        """Stop at *frame* until the panel resumes this rank, then go on as it asked."""
        command = serve(self._frames(frame), reason, text)
        self._resume(command, frame)

    def _resume(self, command, frame):
        if command in ("continue", "disconnect") or not armed:
            self._go_on()
        elif command == "next":
            self.set_next(frame)
        elif command == "stepIn":
            self.set_step()
        else:
            self.set_return(frame)

    def _frames(self, frame):
        frames = []
        while frame is not None and frame is not self.botframe:
            if not mpinb_frame(frame):
                frames.append((frame, frame.f_lineno))
            frame = frame.f_back
        return frames


def serve(frames, reason, text):
    """Say that this rank stopped, in *frames* (``(frame, line)``, innermost first), and answer the panel's
    requests until one resumes it; return that request's command."""
    global stopped
    stop = Stop(frames)
    stopped = True
    try:
        _send(DebugStopped(rank, cell_id, reason, text))
        while True:
            command = _next_request()
            if command.command == "disconnect":
                _answer(command.seq, True, {})
                return command.command
            handler = getattr(stop, "on_" + command.command, None)
            if handler is None:
                _answer(command.seq, False, {}, f"{command.command} is not supported on a rank")
                continue
            try:
                body = handler(command.arguments or {})
            except Exception as exc:  # noqa: BLE001 - a bad request (an expression that raises) is answered
                _answer(command.seq, False, {}, _describe(exc))
                continue
            _answer(command.seq, True, body)
            if command.command in RESUMING:
                return command.command
    finally:
        stopped = False
        while not _requests.empty():  # asked of this stop after it ended
            late = _requests.get()
            _answer(late.seq, False, {}, f"rank {rank} is not stopped in the debugger any more")


def post_mortem():
    """Show this rank's last failed cell in the panel, where it failed (``%mpi debug R --panel``)."""
    from . import debug

    failure = debug.last_failure()
    if failure is None:
        print(f"rank {rank} has no failed cell to debug: %mpi debug R --panel works after a cell failed on rank R")
        return
    exc, tb = failure
    frames = []
    while tb is not None:
        if not mpinb_frame(tb.tb_frame):
            frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    serve(frames[::-1], "exception", _describe(exc))


def _next_request():
    while True:
        try:  # a timeout, so that an interrupt (the Stop button) gets through
            return _requests.get(timeout=0.1)
        except queue.Empty:
            continue


class Stop:
    """The requests one stop answers: each ``on_<command>`` takes the request's arguments and returns its body.
    References to frames and values hold only while the rank is stopped here, as DAP has it."""

    def __init__(self, frames):
        self.frames = frames
        self.references = [None]  # index: a local id

    def _reference(self, thing):
        self.references.append(thing)
        return debug_ids.encode(rank, len(self.references) - 1)

    def _lookup(self, value):
        if debug_ids.rank_of(value) != rank or not 0 < debug_ids.local(value) < len(self.references):
            raise ValueError(f"rank {rank} has no debugger reference {value} in this stop")
        return self.references[debug_ids.local(value)]

    def on_threads(self, arguments):
        return {"threads": [{"id": debug_ids.thread_id(rank), "name": f"rank {rank}"}]}

    def on_stackTrace(self, arguments):
        start = arguments.get("startFrame") or 0
        count = arguments.get("levels") or len(self.frames)
        shown = []
        for frame, line in self.frames[start:start + count]:
            path, offset = cell_paths.get(frame.f_code.co_filename, (frame.f_code.co_filename, 0))
            name = frame.f_code.co_name
            shown.append({"id": self._reference(frame), "name": f"{'cell' if name == '<module>' else name} "
                                                                f"(rank {rank})",
                          "line": line + offset, "column": 1,
                          "source": {"name": os.path.basename(path), "path": path}})
        return {"stackFrames": shown, "totalFrames": len(self.frames)}

    def on_scopes(self, arguments):
        frame = self._lookup(arguments["frameId"])
        if frame.f_locals is frame.f_globals:  # the cell itself: its variables are the rank's namespace
            return {"scopes": [_scope("Locals", self._reference(_Names(frame.f_globals, cell=True)))]}
        return {"scopes": [_scope("Locals", self._reference(_Names(frame.f_locals))),
                           _scope("Globals", self._reference(_Names(frame.f_globals, cell=True)))]}

    def on_variables(self, arguments):
        thing = self._lookup(arguments["variablesReference"])
        items = thing.items() if isinstance(thing, _Names) else _children(thing)
        return {"variables": [self._variable(name, value) for name, value in items]}

    def _variable(self, name, value):
        expandable = _expandable(value)
        return {"name": str(name), "value": _text(value), "type": type(value).__name__,
                "evaluateName": str(name), "variablesReference": self._reference(value) if expandable else 0}

    # evaluate runs what the user typed in the panel's debug console, in the stopped frame, as pdb's ``p`` and
    # ``!`` do: that is what the console is for, on the user's own rank
    def on_evaluate(self, arguments):
        frame = self._lookup(arguments["frameId"]) if arguments.get("frameId") else self.frames[0][0]
        expression = arguments["expression"]
        try:
            value = eval(expression, frame.f_globals, frame.f_locals)
        except SyntaxError:  # a statement, typed in the debug console
            exec(expression, frame.f_globals, frame.f_locals)
            return {"result": "", "variablesReference": 0}
        variable = self._variable(expression, value)
        return {"result": variable["value"], "type": variable["type"],
                "variablesReference": variable["variablesReference"]}

    def on_richInspectVariables(self, arguments):
        """The panel shows one variable it listed (a name, or a dotted path into one): looked up, not run."""
        frame = self._lookup(arguments["frameId"]) if arguments.get("frameId") else self.frames[0][0]
        first, *attributes = arguments["variableName"].split(".")
        scopes = (frame.f_locals, frame.f_globals, vars(builtins))
        scope = next((scope for scope in scopes if first in scope), None)
        if scope is None:
            raise NameError(f"name {first!r} is not defined in the stopped frame of rank {rank}")
        value = scope[first]
        for attribute in attributes:
            value = getattr(value, attribute)
        return {"data": {"text/plain": repr(value)}, "metadata": {}}

    def on_source(self, arguments):
        path = (arguments.get("source") or {}).get("path", "")
        for filename, (kernel_path, _) in cell_paths.items():
            if kernel_path == path:
                path = filename
        lines = linecache.getlines(path)
        if not lines:
            raise FileNotFoundError(f"rank {rank} has no source for {path}")
        return {"content": "".join(lines)}

    def on_continue(self, arguments):
        return {"allThreadsContinued": False}

    def on_next(self, arguments):
        return {}

    on_stepIn = on_stepOut = on_next


class _Names(dict):
    """A scope's variables: a namespace, without what IPython and mpinb put in a rank's (``In``, ``_i3``)."""

    def __init__(self, namespace, *, cell=False):
        super().__init__((name, value) for name, value in namespace.items()
                         if not (cell and _hidden(name, value)))


_HIDDEN = {"In", "Out", "get_ipython", "exit", "quit", "open", "_", "__", "___", "_mpinb_cell_value"}


def _hidden(name, value):
    if name in _HIDDEN or name.startswith("__") or (name.startswith("_i") and name[2:].isdigit()):
        return True
    if name.startswith("_") and name[1:].isdigit() or name in ("_ih", "_oh", "_dh", "_ii", "_iii", "_i"):
        return True
    return type(value).__name__ == "module" and name.startswith("_")


def _scope(name, reference):
    return {"name": name, "variablesReference": reference, "expensive": False}


def _describe(exc):
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - user code's __str__ may raise anything
        return type(exc).__name__


def _text(value):
    """A value as the panel shows it on one line: an array or tensor by its shape and type, else a short repr."""
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype") and not isinstance(shape, type(_text)):
        try:
            size = int(getattr(value, "size", 0) if not callable(getattr(value, "size", None)) else value.numel())
        except Exception:  # noqa: BLE001
            size = 0
        if size > 20:
            return f"{type(value).__name__} of shape {tuple(shape)}, {value.dtype}"
    try:
        return _repr.repr(value)
    except Exception as exc:  # noqa: BLE001 - a user type's __repr__ may raise
        return f"<{type(value).__name__} object: its repr() raised {type(exc).__name__}>"


_LEAVES = (int, float, complex, bool, str, bytes, type(None))


def _expandable(value):
    if isinstance(value, _LEAVES):
        return False
    return bool(isinstance(value, (dict, list, tuple, set, frozenset)) and value) or hasattr(value, "shape") \
        or hasattr(value, "__dict__")


def _children(value):
    """``(name, value)`` of what *value* holds: items, elements, an array's shape and rows, attributes."""
    if isinstance(value, dict):
        return [(repr(key), item) for key, item in list(value.items())[:SHOWN_ITEMS]]
    if isinstance(value, (list, tuple)):
        return list(enumerate(value[:SHOWN_ITEMS]))
    if isinstance(value, (set, frozenset)):
        return list(enumerate(sorted(value, key=repr)[:SHOWN_ITEMS]))
    shown = []
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        for name in ("shape", "dtype", "device", "requires_grad", "grad"):
            if hasattr(value, name):
                shown.append((name, getattr(value, name)))
        try:
            if len(value.shape) > 0:
                shown.extend((f"[{index}]", value[index]) for index in range(min(len(value), SHOWN_ITEMS)))
        except Exception:  # noqa: BLE001 - an array type without indexing: its attributes are enough
            pass
        return shown
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        shown.extend((name, item) for name, item in list(attributes.items())[:SHOWN_ITEMS]
                     if not name.startswith("__"))
    return shown
