"""The notebook's side of tests/test_multihost.py, run on the first of the test's hosts: an IPython shell with
mpinb loaded runs the steps given as JSON and prints what each showed, as one JSON line after ``RESULT``.

Each step is ``["line", "start -n 4"]`` (``%mpi``), ``["cell", "--gather x", "code"]`` (a ``%%mpi`` cell) or
``["eval", "expression"]`` (in the notebook's namespace), run as a user runs them; what it printed (stdout,
stderr), the exception it raised (type and text) and when it ended are recorded. ``setup`` options are
``MPIMagics`` settings. With ``"echo_stderr": true`` what each step writes to stderr also goes to the driver's own
stderr as it is written, for a test that waits for it.
"""

import contextlib
import io
import json
import sys
import time

from IPython.core.interactiveshell import InteractiveShell


class _Both(io.TextIOBase):
    """Writes to *first* and *second* alike."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def write(self, text):
        self.first.write(text)
        self.second.write(text)
        return len(text)

    def flush(self):
        self.first.flush()
        self.second.flush()


def main():
    config = json.loads(sys.argv[1])
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "mpinb")
    magics = ip.magics_manager.registry["MPIMagics"]
    for name, value in config.get("setup", {}).items():
        setattr(magics, name, value)
    results = []
    for step in config["steps"]:
        out, err = io.StringIO(), io.StringIO()
        started, raised, value = time.time(), None, None
        try:
            shown = _Both(err, sys.__stderr__) if config.get("echo_stderr") else err
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(shown):
                if step[0] == "line":
                    value = ip.run_line_magic("mpi", step[1])
                elif step[0] == "eval":  # a Python expression in the notebook's namespace
                    value = repr(ip.ev(step[1]))
                else:
                    value = ip.run_cell_magic("mpi", step[1], step[2])
        except BaseException as exc:  # noqa: BLE001 - what the user would see is the result
            raised = [type(exc).__name__, str(exc)]
        if step[0] == "cell" and value is not None:
            value = {str(rank): repr(item) for rank, item in dict(value).items()}
        results.append({"stdout": out.getvalue(), "stderr": err.getvalue(), "raised": raised, "value": value,
                        "started": started, "ended": time.time()})
    world = magics.world
    extra = {}
    if world is not None and world.running:
        extra["hosts"] = world.hosts()
        extra["history"] = len(magics.history)
        magics.stop()
    print("RESULT " + json.dumps({"steps": results, **extra}), flush=True)


if __name__ == "__main__":
    main()
