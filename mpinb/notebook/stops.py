"""The Stop button (SIGINT): a ``KeyboardInterrupt`` in the user's code, as usual; counted and acted on at safe
points in mpinb's own work; let go once the cell's code is over.

Python's own handler raises wherever a Stop lands: half-way through stopping a world, inside ipyparallel's start,
while IPython shows a cell's error or runs its post-run callbacks (sealing the cell's views), or while ipykernel
flushes the output and sends the cell's reply, which it then never sends (ipykernel installs that handler for
the whole request, logs "KeyboardInterrupt caught in kernel", and the front end waits for ever). So:

* :func:`guard` keeps mpinb's handler in place from the moment the kernel takes an execute request (in a shell
  without a kernel, from the moment a cell begins) until the request is answered (the kernel then puts back its
  own). It raises only where the user's code runs: the cell's own code, or what it calls, with no frame of mpinb's
  above it. Elsewhere (before the cell's code, in mpinb's code, after it) a Stop has nothing to stop: it is
  counted and let go.
* Inside :func:`deferred` a Stop is only counted; the code that deferred it looks at :func:`presses` where it is
  safe to act (a start rolls back, a cell escalates), and :func:`raising` re-opens a block where raising is safe
  (a prompt waiting for the user).

Signal handlers can only be set in the main thread; elsewhere nothing is deferred."""

import contextlib
import functools
import inspect
import os
import signal
import sys
import threading

_RAISE, _DEFER, _USER = "raise", "defer", "user"
_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # mpinb's own code
_cell_runners = set()  # the code of IPython's run_code: the frame it runs is a cell's own code


class _Watch:
    """A SIGINT handler of mpinb's: the outermost deferred block's, or a cell's (:func:`guard`), which is the
    outermost block of those deferred inside the cell."""

    def __init__(self, *, cell=False, until_cell_ends=False):
        self.presses = 0
        self.modes = [_USER] if cell else []
        self.until_cell_ends = until_cell_ends  # taken off by the cell's post_run_cell (no kernel puts one back)
        self.previous = None

    def handler(self, signum, frame):
        self.presses += 1
        mode = self.modes[-1] if self.modes else _DEFER
        if mode == _RAISE or mode == _USER and _in_user_code(frame):
            stop = KeyboardInterrupt()
            stop._render_traceback_ = functools.partial(_shown, stop)  # as Python's own: without this frame
            raise stop

    def install(self):
        """Make this the SIGINT handler; whether it could be (not in an embedded interpreter without signals)."""
        try:
            self.previous = signal.signal(signal.SIGINT, self.handler)
        except (ValueError, OSError):
            return False
        return True

    def uninstall(self):
        """Put back the handler this one replaced: a handler set from C reads as None, and cannot be set back:
        Python's default then."""
        signal.signal(signal.SIGINT, self.previous if self.previous is not None else signal.default_int_handler)


def _shown(stop):
    """The traceback IPython shows for *stop*, raised by mpinb's handler: the frames down to where the Stop landed,
    as for Python's own handler (the handler's frame is dropped from the exception's traceback itself, so that
    ``%debug`` and ``%tb`` do not show it either)."""
    tb = stop.__traceback__
    while tb is not None and tb.tb_next is not None:
        if tb.tb_next.tb_frame.f_code is _Watch.handler.__code__:
            tb.tb_next = None
        tb = tb.tb_next
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        import traceback

        return traceback.format_exception(stop)
    return shell.InteractiveTB.structured_traceback(type(stop), stop, stop.__traceback__)


def _current():
    """The watch whose handler is installed now (``None``: someone else's, such as the kernel's between requests)."""
    watch = getattr(signal.getsignal(signal.SIGINT), "__self__", None)
    return watch if isinstance(watch, _Watch) else None


def _own(code):
    return code.co_filename.startswith(_OWN)


def _in_user_code(frame):
    """Whether *frame*, where a Stop landed, runs the user's code: a cell's own code (the frame IPython's
    ``run_code`` runs) or what it calls, with no frame of mpinb's on the way."""
    while frame is not None:
        if _own(frame.f_code):
            return False
        back = frame.f_back
        if back is not None and back.f_code in _cell_runners:
            return True
        frame = back
    return False


def _in_cell():
    """Whether a cell's code is running now (further out on this thread's stack)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code in _cell_runners:
            return True
        frame = frame.f_back
    return False


def presses():
    """How many times Stop was pressed since mpinb's handler was put in place (0 when it is not): compare two
    counts taken in one deferred block."""
    watch = _current()
    return watch.presses if watch is not None else 0


def active():
    """Whether Stops are being deferred right now."""
    watch = _current()
    return watch is not None and bool(watch.modes) and watch.modes[-1] == _DEFER


@contextlib.contextmanager
def _mode(mode):
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    watch = _current()
    outermost = watch is None
    if outermost:
        if mode == _RAISE:  # nothing deferred around it: the handler in place raises already
            yield
            return
        watch = _Watch()
        if not watch.install():  # no signals here (an embedded interpreter)
            yield
            return
    watch.modes.append(mode)
    try:
        yield
    finally:
        watch.modes.pop()
        if outermost:
            watch.uninstall()


def deferred():
    """A block in which Stop is counted (:func:`presses`), not raised."""
    return _mode(_DEFER)


def raising():
    """Inside a deferred block, a block in which Stop raises ``KeyboardInterrupt`` again (a wait that is safe to cut,
    such as a prompt)."""
    return _mode(_RAISE)


# ---------------------------------------------------------------------- a cell's Stops (the extension's guard)

def guard(shell):
    """From now on, while *shell* runs a cell, a Stop raises only in the user's code (see the module's docstring).

    In a kernel, mpinb's handler replaces the one ipykernel's ``pre_handler_hook`` puts in place for each execute
    request, and stays until its ``post_handler_hook`` puts back the kernel's own, after the reply is sent; in a
    shell without a kernel (terminal IPython), from ``pre_run_cell`` to ``post_run_cell``. It only ever replaces
    Python's default handler: one set by someone else (ipykernel's for a cell that awaits, the user's own) is kept.
    Called while a cell runs (``%load_ext mpinb``), it guards the rest of that cell too. :func:`unguard` undoes it.
    """
    for cls in type(shell).__mro__:
        run_code = cls.__dict__.get("run_code")
        if run_code is not None:
            _cell_runners.add(inspect.unwrap(run_code).__code__)
    callbacks = shell.events.callbacks
    if _cell_begins not in callbacks["pre_run_cell"]:
        shell.events.register("pre_run_cell", _cell_begins)
    if _cell_ends not in callbacks["post_run_cell"]:
        shell.events.register("post_run_cell", _cell_ends)  # after the views are sealed (registered before)
    kernel = getattr(shell, "kernel", None)
    hook = getattr(kernel, "pre_handler_hook", None) if hasattr(kernel, "get_parent") else None
    if hook is not None and not hasattr(hook, "mpinb_replaced"):
        kernel.pre_handler_hook = _kernel_hook(kernel, hook)
    if _in_cell():
        _guard_now(until_cell_ends=hook is None)


def unguard(shell):
    """Undo :func:`guard`: Stops are the kernel's (or Python's) again from the next cell on, and from now on in a
    shell without a kernel."""
    for event, callback in (("pre_run_cell", _cell_begins), ("post_run_cell", _cell_ends)):
        if callback in shell.events.callbacks[event]:
            shell.events.unregister(event, callback)
    kernel = getattr(shell, "kernel", None)
    replaced = getattr(getattr(kernel, "pre_handler_hook", None), "mpinb_replaced", None)
    if replaced is not None:
        kernel.pre_handler_hook = replaced
    watch = _current()
    if watch is not None and watch.until_cell_ends and watch.modes == [_USER]:
        watch.uninstall()


def _kernel_hook(kernel, hook):
    """ipykernel's *hook* (Python's default handler for the request), then mpinb's for an execute request."""
    def pre_handler_hook():
        hook()
        parent = kernel.get_parent("shell") or {}  # the request being handled (ipykernel 6 and later)
        if parent.get("header", {}).get("msg_type") == "execute_request":
            _guard_now(until_cell_ends=False)
    pre_handler_hook.mpinb_replaced = hook
    return pre_handler_hook


def _guard_now(*, until_cell_ends):
    """Put mpinb's handler in place of Python's default one (only that one), if this is the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        _Watch(cell=True, until_cell_ends=until_cell_ends).install()


def _cell_begins(info=None):
    """pre_run_cell: a shell without a kernel (or a kernel's request that did not pass its hook) is guarded."""
    if _current() is None:
        _guard_now(until_cell_ends=True)


def _cell_ends(result=None):
    """post_run_cell: the handler put in place when the cell began is taken off, unless a cell further out runs
    on (a cell's code called ``run_cell``)."""
    watch = _current()
    if watch is not None and watch.until_cell_ends and watch.modes == [_USER] and not _in_cell():
        watch.uninstall()
