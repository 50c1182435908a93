"""Views that outlive the kernel: a live widget while its cell runs, its static rendering once the cell ended.

JupyterLab saves a widget's output as a reference to a model that lives in the kernel (unless "Save Widget
State Automatically" is on): reopened with a new kernel, such an output reads "Error displaying widget: model
not found", and nbconvert, nbviewer and GitHub show nothing for it. So each view is displayed with a display
id, and when the cell that drew it ends (IPython's ``post_run_cell``) its output is replaced in place by
:mod:`~mpinb.widgets.static`'s rendering (HTML tables with the charts as PNG images, and plain text) and the
widget is closed. With ``MPIMagics.keep_widgets`` the widget stays live and the static rendering is added to
its output's bundle instead (renderers without its model, nbconvert's HTML for one, fall back to it).

Example::

    view = views.show(widget, lambda: static.metrics_bundle(history, runs))
    ...  # the cell runs; the widget updates
    views.seal_all()  # what post_run_cell does
"""

import html
import logging
import sys
import time

log = logging.getLogger("mpinb")

_open = []  # views shown since the last seal_all, in display order
_to_close = []  # widgets of views sealed at the last seal_all: closed at the next one
keep_widgets = False  # MPIMagics.keep_widgets
SETTLE = 1.0  # seconds a widget is left shown before its output is replaced: JupyterLab builds a widget's views
# asynchronously, and an output replaced meanwhile makes it log "Could not add child view to box"


class View:
    """One displayed widget and the function that renders it statically (a MIME bundle)."""

    def __init__(self, widget, static, *, name):
        from IPython.display import display

        self.widget, self.static, self.name = widget, static, name
        self.handle = display(widget, display_id=True)
        self.shown_at = time.monotonic()
        self.sealed = False

    def seal(self):
        """Replace the widget's output by its static rendering (and close the widget), once."""
        if self.sealed:
            return
        self.sealed = True
        started = time.perf_counter()
        try:
            data = self.static()
        except Exception as exc:  # noqa: BLE001 - the live view was shown; losing its copy must not fail the cell
            log.warning("mpinb could not render the %s for the saved notebook: %r", self.name, exc)
            data = {"text/plain": f"[{self.name}: no static rendering ({type(exc).__name__}: {exc})]"}
        self.seconds = time.perf_counter() - started
        if keep_widgets:
            data = {**data, **self.widget._repr_mimebundle_()}
        young = SETTLE - (time.monotonic() - self.shown_at)
        if young > 0 and not keep_widgets:
            time.sleep(young)
        self.handle.update(data, raw=True)
        if not keep_widgets:  # not at once: the browser may still be building the views it replaces
            close_later(self.widget)


def show(widget, static, *, name="view"):
    """Display *widget* now; :func:`seal_all` replaces it by ``static()`` (a MIME bundle). *widget* may be a
    callable making it."""
    view = View(widget() if callable(widget) else widget, static, name=name)
    _open.append(view)
    return view


def show_at_end(widget, static, *, name="view"):
    """A view drawn as its cell ends: its static rendering at once (its widget would be replaced before the
    browser drew it), or with ``keep_widgets`` the widget made by the callable *widget*, as :func:`show` does."""
    if keep_widgets:
        return show(widget, static, name=name)
    from IPython.display import display

    display(static(), raw=True)
    return None


def warm_up():
    """Import matplotlib's Agg drawing in a background thread, so that the first cell to seal a view does not
    wait for it (about 0.4 s)."""
    import threading

    def load():
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401

    thread = threading.Thread(target=load, name="mpinb-warm-up", daemon=True)
    # the kernel's debugger (debugpy) does not trace a thread marked so, as ipykernel marks its own: with the
    # panel's exception filters on, it stopped in numpy where matplotlib's import raises and handles a TypeError
    thread.pydev_do_not_trace = thread.is_pydev_daemon_thread = True
    thread.start()


def seal_all(*args):
    """Seal every view shown since the last call (IPython calls this after each cell), and close the widgets
    of those sealed at the call before."""
    done = list(_to_close)
    _to_close.clear()
    for widget in done:
        close(widget)
    while _open:
        _open.pop(0).seal()


def close_later(widget):
    """Close *widget* (and what it holds) at the next :func:`seal_all`."""
    _to_close.append(widget)


def close(widget):
    """Close *widget* and every widget it holds (children, bqplot marks, axes, scales, layouts), so that
    neither the kernel nor the browser keeps their models."""
    from ipywidgets import Widget

    seen = set()
    stack = [widget]
    while stack:
        item = stack.pop()
        if id(item) in seen or not isinstance(item, Widget):
            continue
        seen.add(id(item))
        for name in item.keys:
            value = getattr(item, name, None)
            if isinstance(value, Widget):
                stack.append(value)
            elif isinstance(value, (list, tuple)):
                stack.extend(v for v in value if isinstance(v, Widget))
            elif isinstance(value, dict):
                stack.extend(v for v in value.values() if isinstance(v, Widget))
        item.close()


class Progress:
    """A line saying how a long step goes, updated in place: an HTML ``<progress>`` line in a notebook (no
    widget: a saved notebook keeps its last state), ``\\r``-rewritten on a terminal's stderr.

    Parameters
    ----------
    notebook : bool
        Display in the notebook (else write to *stream*).
    every : float, default 0.25
        Seconds between updates of the same text shown at most (a new text shows at once).
    """

    def __init__(self, *, notebook, stream=None, every=0.25):
        self.notebook, self.stream, self.every = notebook, stream or sys.stderr, every
        self.handle = None
        self.started = time.monotonic()
        self._shown = 0.0
        self._width = 0
        self._text = None
        self.updates = 0

    def update(self, text, done=None, total=None, *, force=False):
        now = time.monotonic()
        if not force and text == self._text and now - self._shown < self.every:
            return
        self._shown, self._text = now, text
        self.updates += 1
        elapsed = f"{now - self.started:.1f} s"
        if self.notebook:
            bar = f"<progress value='{done}' max='{total}' style='width:160px;vertical-align:middle'></progress> " \
                if total else ""
            count = f" {done}/{total}" if total else ""
            data = {"text/html": f"<div style='font-size:12px'>{bar}{html.escape(text)}{count} · {elapsed}</div>",
                    "text/plain": f"{text}{count} · {elapsed}"}
            self._show(data)
        else:
            line = f"[mpinb] {text}" + (f" {done}/{total}" if total else "") + f" · {elapsed}"
            self.stream.write("\r" + line.ljust(self._width))
            self._width = len(line)
            self.stream.flush()

    def close(self, text=None):
        """End the line: leave *text* in its place (nothing with ``None``)."""
        if self.notebook:
            if self.handle is not None or text:
                self._show({"text/plain": text} if text else {"text/plain": ""})
        elif self._width:
            self.stream.write("\r" + " " * self._width + "\r" + (f"[mpinb] {text}\n" if text else ""))
            self.stream.flush()
        elif text:
            self.stream.write(f"[mpinb] {text}\n")
            self.stream.flush()

    def _show(self, data):
        from IPython.display import display

        if self.handle is None:
            self.handle = display(data, raw=True, display_id=True)
        else:
            self.handle.update(data, raw=True)
