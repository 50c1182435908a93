"""A stopped rank's names and values as the visual debugger's panel reads and writes them: a frame's scopes (a rank's
namespace without what IPython puts there, mpinb's predefined names under one entry after the user's own), a value
on one line and what it holds, and the expressions the user types, run in the stopped frame."""

import reprlib
import sys

# what a rank's namespace holds that mpinb put there (rank/world.py, and ipyparallel's MPI engines), not the user
PREDEFINED = ("MPI", "comm", "rank", "size", "mpi_rank", "mpi_size")
GROUP = "mpinb (predefined)"  # the entry they are listed under, after the user's own names
CO_OPTIMIZED = 0x1  # a function's code: its frame's variables live in slots that f_locals only copies
SHOWN_ITEMS = 300  # children of one value listed at most
_repr = reprlib.Repr()
_repr.maxstring, _repr.maxother, _repr.maxlist, _repr.maxdict = 200, 200, 20, 20


def evaluated(expression, frame):
    """The value of *expression*, typed by the user in the panel (its console, a breakpoint's condition, a new value
    for a variable), in *frame*, the user's own stopped frame on their own rank: the one place the panel runs
    what the user wrote, as pdb's ``p`` does."""
    return eval(expression, frame.f_globals, frame.f_locals)


class Scope:
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
        group = Predefined(self.frame)
        return shown + ([(GROUP, group)] if group.items() else [])

    def set(self, name, value):
        if self.kind == "locals":
            names = self.frame.f_locals
            names[name] = value
            written(self.frame, names)
        else:
            self.frame.f_globals[name] = value


class Predefined:
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


def written(frame, names):
    """Keep what was written into *names* (a function frame's ``f_locals``, a copy of its variables before Python
    3.13) as the frame's own variables: the copy is refreshed, and the write lost, when ``f_locals`` is read next."""
    if frame.f_code.co_flags & CO_OPTIMIZED and sys.version_info < (3, 13) and names is not frame.f_globals:
        import ctypes

        ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))


_HIDDEN = {"In", "Out", "get_ipython", "exit", "quit", "open", "_", "__", "___", "_mpinb_cell_value"}


def _hidden(name, value):
    if name in _HIDDEN or name.startswith("__") or (name.startswith("_i") and name[2:].isdigit()):
        return True
    if name.startswith("_") and name[1:].isdigit() or name in ("_ih", "_oh", "_dh", "_ii", "_iii", "_i"):
        return True
    return type(value).__name__ == "module" and name.startswith("_")


def describe(exc):
    """``ValueError: ...``: an exception in one line, even where its ``__str__`` raises."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - user code's __str__ may raise anything
        return type(exc).__name__


def text(value):
    """A value as the panel shows it on one line: an array or tensor by its shape and type, else a short repr."""
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype") and not isinstance(shape, type(text)):
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


def expandable(value):
    """Whether the panel can open *value* to list what it holds (:func:`children`)."""
    if isinstance(value, _LEAVES):
        return False
    return bool(isinstance(value, (dict, list, tuple, set, frozenset)) and value) or hasattr(value, "shape") \
        or hasattr(value, "__dict__")


def children(value):
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
