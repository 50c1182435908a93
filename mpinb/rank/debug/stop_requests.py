"""The requests the visual debugger's panel makes of a stopped rank (DAP's ``threads``, ``stackTrace``,
``scopes``, ``variables``, ``setVariable``, ``evaluate``, ``richInspectVariables``, ``source`` and the ones that
resume it), answered for one stop. Frames of a cell are named by the kernel's path for the cell and its lines;
references are those of ``wire/debug_ids.py``, new at each stop."""

import builtins
import itertools
import linecache
import os

from ...wire import debug_ids
from . import panel_values
from .panel_values import CO_OPTIMIZED, GROUP, Predefined, Scope, evaluated, written

_ids = itertools.count()  # every reference this rank hands out, over all stops: never the same twice in a row
_IDS = debug_ids.thread_id(1) - debug_ids.thread_id(0) - 1  # local ids a rank has (encode's 1.._IDS), counted round


class Stop:
    """The requests one stop of *rank*, in *frames* (``(frame, line)``, innermost first), answers: each
    ``on_<command>`` takes the request's arguments and returns its body. *cell_paths* maps the file a cell was
    compiled as to the kernel's path for it and its line offset. References to frames and values hold only while
    the rank is stopped here, as DAP has it."""

    def __init__(self, frames, rank, cell_paths):
        self.frames, self.rank, self.cell_paths = frames, rank, cell_paths
        self.references = {}  # local id -> the frame, scope or value it names, this stop only
        self.given = {}  # id() of what was named -> its reference: asked twice in a stop, named the same

    def _reference(self, thing):
        """A reference to *thing*, new at this stop (the rank's count goes on from the last stop's)."""
        known = self.given.get(id(thing))
        if known is not None and self.references[debug_ids.local(known)] is thing:
            return known
        local = next(_ids) % _IDS + 1
        self.references[local] = thing
        self.given[id(thing)] = reference = debug_ids.encode(self.rank, local)
        return reference

    def _lookup(self, value):
        thing = self.references.get(debug_ids.local(value)) if debug_ids.rank_of(value) == self.rank else None
        if thing is None:
            raise ValueError(f"rank {self.rank} has no debugger reference {value} in this stop (references hold "
                             "only while the rank is stopped where they were given)")
        return thing

    def on_threads(self, arguments):
        return {"threads": [{"id": debug_ids.thread_id(self.rank), "name": f"rank {self.rank}"}]}

    def on_stackTrace(self, arguments):
        start = arguments.get("startFrame") or 0
        count = arguments.get("levels") or len(self.frames)
        shown = []
        for frame, line in self.frames[start:start + count]:
            path, offset = self.cell_paths.get(frame.f_code.co_filename, (frame.f_code.co_filename, 0))
            name = frame.f_code.co_name
            shown.append({"id": self._reference(frame), "name": f"{'cell' if name == '<module>' else name} "
                                                                f"(rank {self.rank})",
                          "line": line + offset, "column": 1,
                          "source": {"name": os.path.basename(path), "path": path}})
        return {"stackFrames": shown, "totalFrames": len(self.frames)}

    def on_scopes(self, arguments):
        frame = self._lookup(arguments["frameId"])
        if not frame.f_code.co_flags & CO_OPTIMIZED:  # the cell itself: its variables are the rank's namespace
            return {"scopes": [_scope("Locals", self._reference(self._scope(frame, "globals")))]}
        return {"scopes": [_scope("Locals", self._reference(self._scope(frame, "locals"))),
                           _scope("Globals", self._reference(self._scope(frame, "globals")))]}

    def _scope(self, frame, kind):
        """One :class:`Scope` per frame and kind in a stop, so that asking twice gives the same reference."""
        scopes = self.given.setdefault(("scopes", id(frame)), {})
        return scopes.setdefault(kind, Scope(frame, kind))

    def on_variables(self, arguments):
        thing = self._lookup(arguments["variablesReference"])
        items = thing.items() if isinstance(thing, (Scope, Predefined)) else panel_values.children(thing)
        return {"variables": [self._variable(name, value) for name, value in items]}

    def _variable(self, name, value):
        if isinstance(value, Predefined):
            # JupyterLab's tree shows a variable's type beside its name: the group's says whose names they are
            return {"name": GROUP, "value": value.text(), "type": value.label(),
                    "variablesReference": self._reference(value)}
        expandable = panel_values.expandable(value)
        return {"name": str(name), "value": panel_values.text(value), "type": type(value).__name__,
                "evaluateName": str(name), "variablesReference": self._reference(value) if expandable else 0}

    def on_setVariable(self, arguments):
        """Change a variable the panel listed (DAP's ``setVariable``): its new value is an expression, run in the
        frame of its scope (the top frame for what a value holds); the frame's own variable changes, not a copy."""
        container, name = self._lookup(arguments["variablesReference"]), arguments["name"]
        frame = container.frame if isinstance(container, (Scope, Predefined)) else self.frames[0][0]
        value = evaluated(arguments["value"], frame)
        if isinstance(container, (Scope, Predefined)):
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
            written(frame, names)
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
            raise NameError(f"name {first!r} is not defined in the stopped frame of rank {self.rank}")
        value = scope[first]
        for attribute in attributes:
            value = getattr(value, attribute)
        return {"data": {"text/plain": repr(value)}, "metadata": {}}

    def on_source(self, arguments):
        path = (arguments.get("source") or {}).get("path", "")
        for filename, (kernel_path, _) in self.cell_paths.items():
            if kernel_path == path:
                path = filename
        lines = linecache.getlines(path)
        if not lines:
            raise FileNotFoundError(f"rank {self.rank} has no source for {path}")
        return {"content": "".join(lines)}

    def on_continue(self, arguments):
        return {"allThreadsContinued": False}

    def on_next(self, arguments):
        return {}

    on_stepIn = on_stepOut = on_next


def _scope(name, reference):
    return {"name": name, "variablesReference": reference, "expensive": False}
