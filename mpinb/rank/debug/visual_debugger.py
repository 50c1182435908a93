"""The rank's end of the notebook's visual debugger (JupyterLab's panel, or any client of the kernel's Debug
Adapter Protocol): breakpoints in a ``%%mpi`` cell, its exception filters, and the requests of a stop.

The kernel sends each cell a :class:`~mpinb.wire.kinds.DebugSetup` while its debugger is on. A cell with
breakpoints or exception filters runs under :class:`RankDebugger` (Python's ``bdb``, on the cell's thread only:
the rank's other threads are never traced). Where it stops, it says so (:class:`~mpinb.wire.kinds.DebugStopped`)
and answers the panel's requests (:class:`~mpinb.wire.kinds.DebugCommand`, handed over by the roll-call thread)
until one resumes it. Frames of the cell are named by the kernel's path for the cell and its lines, so that the
panel shows them in the cell; frames of mpinb's own code are never shown. Ids are those of
``wire/debug_ids.py``, and each stop hands out new ones: JupyterLab keeps showing the frame it showed while the
new stop lists a frame of the same id, so ids that came again left its editor and Variables pane on the last
stop; an id of an earlier stop is refused, never resolved to what it named then.

The names mpinb predefines on a rank (:data:`PREDEFINED`) are listed after the user's own, under one entry.
A breakpoint of the setup may be a line or ``(line, condition, hitCondition)`` (DAP's, as debugpy reads them).
The Stop button interrupts a stopped rank as it does a running one; the error then says where it was paused,
without the debugger's frames.
"""

import bdb
import builtins
import itertools
import linecache
import operator
import os
import queue
import re
import reprlib
import sys

from ...wire import debug_ids
from ...wire.kinds import DebugAnswer, DebugStopped

_MPINB = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_requests = queue.SimpleQueue()  # DebugCommands for the stopped debugger, from the roll-call thread
_send = None  # sends a message to the notebook after the output before it: set by the agent
rank = None
cell_id = None  # the running cell's (the agent sets it)
armed = True  # False once the debugger was switched off during the running cell: nothing stops it any more
cell_paths = {}  # file a cell was compiled as here -> (the kernel's path for it, line offset)
stopped = False  # whether this rank waits in the visual debugger now
RESUMING = ("continue", "next", "stepIn", "stepOut")
# what a rank's namespace holds that mpinb put there (rank/world.py, and ipyparallel's MPI engines), not the user
PREDEFINED = ("MPI", "comm", "rank", "size", "mpi_rank", "mpi_size")
GROUP = "mpinb (predefined)"  # the entry they are listed under, after the user's own names
_ids = itertools.count()  # every reference this rank hands out, over all stops: never the same twice in a row
_IDS = debug_ids.thread_id(1) - debug_ids.thread_id(0) - 1  # local ids a rank has (encode's 1.._IDS), counted round
_CO_OPTIMIZED = 0x1  # a function's code: its frame's variables live in slots that f_locals only copies
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


class Breakpoint:
    """One breakpoint's *line*, its *condition* (an expression of the frame's names) and *hit* condition (DAP's
    ``hitCondition``: ``3`` or ``== 3``, ``>= 3``, ``% 3``, as debugpy reads it, parsed, not evaluated), and how
    often it held."""

    def __init__(self, line, condition=None, hit=None):
        self.line, self.condition, self.hits = int(line), (condition or "").strip(), 0
        self.hit = (hit or "").strip()
        form = _HIT.match(self.hit)
        self.test = (_COMPARE[form[1] or "=="], int(form[2])) if form else None  # read, never evaluated

    def holds(self, frame):
        """Whether to stop at it in *frame*, and what to say: a condition that cannot be evaluated stops, and says
        why, as debugpy does (a typo in it must not go unseen)."""
        if self.condition:
            try:
                if not evaluated(self.condition, frame):
                    return False, ""
            except Exception as exc:  # noqa: BLE001 - the user's expression may raise anything
                return True, f"the condition {self.condition!r} raised {_describe(exc)}"
        self.hits += 1
        if not self.hit:
            return True, ""
        if self.test is None or (self.test[0] is _every and self.test[1] == 0):
            return True, f"the hit condition {self.hit!r} is not N, == N, >= N, > N, <= N, < N or % N (N > 0 for %)"
        compare, count = self.test
        return compare(self.hits, count), ""


def evaluated(expression, frame):
    """The value of *expression*, typed by the user in the panel (its console, a breakpoint's condition, a new value
    for a variable), in *frame*, the user's own stopped frame on their own rank: the one place the panel runs
    what the user wrote, as pdb's ``p`` does."""
    return eval(expression, frame.f_globals, frame.f_locals)


def _every(hits, count):
    return hits % count == 0


_HIT = re.compile(r"^(==|>=|<=|>|<|%)?\s*(\d+)$")
_COMPARE = {"==": operator.eq, ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "%": _every}


def _cut_after(tb, frame):
    """End traceback *tb* at *frame*'s entry: the debugger's own frames below it are not the user's."""
    while tb is not None and tb.tb_frame is not frame:
        tb = tb.tb_next
    if tb is not None:
        tb.tb_next = None


def paused_in(frames):
    """Whether a rank whose stack is *frames* (``(file, line, function)``, as ``rank/stacks.py`` dumps them) waits
    in this debugger for the panel: what the notebook says of a rank it stopped there."""
    return any(file.endswith(_THIS) and function == _next_request.__name__ for file, _, function in frames)


_THIS = os.path.join("mpinb", "rank", "debug", "visual_debugger.py")


def paused_interrupt(frames):
    """The KeyboardInterrupt of a rank that was paused in *frames* (innermost first) when Stop was pressed."""
    place = "a frame of no cell"
    for frame, line in frames:
        path, offset = cell_paths.get(frame.f_code.co_filename, (None, 0))
        if path is not None:
            place = f"cell line {line + offset}"
            break
    return KeyboardInterrupt(f"interrupted while paused in the debugger at {place}")


class RankDebugger(bdb.Bdb):
    """Runs one cell, stopping at its breakpoints and, with the filters asked for, where an exception is raised
    or where the cell failed; each stop is served by :meth:`serve`."""

    def __init__(self, setup, filename):
        super().__init__(skip=["mpinb", "mpinb.*"])
        self.setup, self.filename = setup, filename
        self.raised = "raised" in setup.filters
        self.failed = bool({"uncaught", "userUnhandled"} & set(setup.filters))
        self.seen = None  # the exception last stopped at (once each, where raised, not at each frame it leaves)
        self.points = {}  # line -> its Breakpoint
        for entry in setup.lines:
            point = Breakpoint(*((entry,) if isinstance(entry, int) else tuple(entry)))
            self.points[point.line] = point
            self.set_break(filename, point.line)

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
            if getattr(exc, "paused_in", None) is not None:
                _cut_after(exc.__traceback__, exc.paused_in)
                exc.paused_in = None
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

    def dispatch_line(self, frame):
        """bdb's, but each breakpoint's condition and hit count decided here, once for each time its line runs,
        stepping or not, as debugpy counts them."""
        point = self.points.get(frame.f_lineno) if frame.f_code.co_filename == self.filename else None
        holds, why = point.holds(frame) if point is not None else (False, "")
        if armed and (holds or self.stop_here(frame)):
            self.serve(frame, "breakpoint" if holds else "step", why)
        return self.trace_dispatch

    def user_line(self, frame):
        pass  # stops are decided in dispatch_line

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
        frames = self._frames(frame)
        try:
            command = serve(frames, reason, text)
        except KeyboardInterrupt:  # Stop pressed while paused: said where (run_cell leaves this debugger's frames)
            sys.settrace(None)
            interrupt = paused_interrupt(frames)
            interrupt.paused_in = frame
            raise interrupt from None
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
    from . import post_mortem as debug

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
        self.references = {}  # local id -> the frame, scope or value it names, this stop only
        self.given = {}  # id() of what was named -> its reference: asked twice in a stop, named the same

    def _reference(self, thing):
        """A reference to *thing*, new at this stop (the rank's count goes on from the last stop's)."""
        known = self.given.get(id(thing))
        if known is not None and self.references[debug_ids.local(known)] is thing:
            return known
        local = next(_ids) % _IDS + 1
        self.references[local] = thing
        self.given[id(thing)] = reference = debug_ids.encode(rank, local)
        return reference

    def _lookup(self, value):
        thing = self.references.get(debug_ids.local(value)) if debug_ids.rank_of(value) == rank else None
        if thing is None:
            raise ValueError(f"rank {rank} has no debugger reference {value} in this stop (references hold only "
                             "while the rank is stopped where they were given)")
        return thing

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
        if not frame.f_code.co_flags & _CO_OPTIMIZED:  # the cell itself: its variables are the rank's namespace
            return {"scopes": [_scope("Locals", self._reference(self._scope(frame, "globals")))]}
        return {"scopes": [_scope("Locals", self._reference(self._scope(frame, "locals"))),
                           _scope("Globals", self._reference(self._scope(frame, "globals")))]}

    def _scope(self, frame, kind):
        """One :class:`_Scope` per frame and kind in a stop, so that asking twice gives the same reference."""
        scopes = self.given.setdefault(("scopes", id(frame)), {})
        return scopes.setdefault(kind, _Scope(frame, kind))

    def on_variables(self, arguments):
        thing = self._lookup(arguments["variablesReference"])
        items = thing.items() if isinstance(thing, (_Scope, _Predefined)) else _children(thing)
        return {"variables": [self._variable(name, value) for name, value in items]}

    def _variable(self, name, value):
        if isinstance(value, _Predefined):
            # JupyterLab's tree shows a variable's type beside its name: the group's says whose names they are
            return {"name": GROUP, "value": value.text(), "type": value.label(),
                    "variablesReference": self._reference(value)}
        expandable = _expandable(value)
        return {"name": str(name), "value": _text(value), "type": type(value).__name__,
                "evaluateName": str(name), "variablesReference": self._reference(value) if expandable else 0}

    def on_setVariable(self, arguments):
        """Change a variable the panel listed (DAP's ``setVariable``): its new value is an expression, run in the
        frame of its scope (the top frame for what a value holds); the frame's own variable changes, not a copy."""
        container, name = self._lookup(arguments["variablesReference"]), arguments["name"]
        frame = container.frame if isinstance(container, (_Scope, _Predefined)) else self.frames[0][0]
        value = evaluated(arguments["value"], frame)
        if isinstance(container, (_Scope, _Predefined)):
            container.set(name, value)
        elif isinstance(container, dict):
            keys = [key for key in container if repr(key) == name]
            if not keys:
                raise KeyError(f"{name} is not a key of this dict")
            container[keys[0]] = value
        elif isinstance(container, list):
            container[int(name)] = value
        elif hasattr(container, "__dict__") and not hasattr(container, "shape"):
            setattr(container, name, value)
        else:
            raise TypeError(f"a {type(container).__name__}'s items cannot be set from the panel")
        variable = self._variable(name, value)
        return {"value": variable["value"], "type": variable["type"],
                "variablesReference": variable["variablesReference"]}

    # evaluate runs what the user typed in the panel's debug console, in the stopped frame, as pdb's ``p`` and
    # ``!`` do: that is what the console is for, on the user's own rank
    def on_evaluate(self, arguments):
        frame = self._lookup(arguments["frameId"]) if arguments.get("frameId") else self.frames[0][0]
        expression = arguments["expression"]
        try:
            value = evaluated(expression, frame)
        except SyntaxError:  # a statement, typed in the debug console
            names = frame.f_locals
            exec(expression, frame.f_globals, names)
            _written(frame, names)
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


class _Scope:
    """A frame's ``locals`` or ``globals``, read when the panel asks (a statement typed in its console shows).
    The globals are a rank's namespace: without what IPython puts there (``In``, ``_i3``), the user's names first,
    then mpinb's (:data:`PREDEFINED`) under one entry."""

    def __init__(self, frame, kind):
        self.frame, self.kind = frame, kind

    def items(self):
        if self.kind == "locals":
            return list(self.frame.f_locals.items())
        namespace = self.frame.f_globals
        shown = [(name, value) for name, value in namespace.items()
                 if name not in PREDEFINED and not _hidden(name, value)]
        group = _Predefined(self.frame)
        return shown + ([(GROUP, group)] if group.items() else [])

    def set(self, name, value):
        if self.kind == "locals":
            names = self.frame.f_locals
            names[name] = value
            _written(self.frame, names)
        else:
            self.frame.f_globals[name] = value


class _Predefined:
    """The names mpinb predefines in a rank's namespace, listed apart from the user's."""

    def __init__(self, frame):
        self.frame = frame

    def items(self):
        namespace = self.frame.f_globals
        return [(name, namespace[name]) for name in PREDEFINED if name in namespace]

    def label(self):
        """``rank 0 of 2``, while ``rank`` and ``size`` are mpinb's still."""
        rank, size = self.frame.f_globals.get("rank"), self.frame.f_globals.get("size")
        return f"rank {rank} of {size}" if isinstance(rank, int) and isinstance(size, int) else ""

    def text(self):
        names = ", ".join(name for name, _ in self.items())
        return f"{self.label()}: {names}" if self.label() else names

    def set(self, name, value):
        self.frame.f_globals[name] = value


def _written(frame, names):
    """Keep what was written into *names* (a function frame's ``f_locals``, a copy of its variables before Python
    3.13) as the frame's own variables: the copy is refreshed, and the write lost, when ``f_locals`` is read next."""
    if frame.f_code.co_flags & _CO_OPTIMIZED and sys.version_info < (3, 13) and names is not frame.f_globals:
        import ctypes

        ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))


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
