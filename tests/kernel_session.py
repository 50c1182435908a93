"""A real kernel driven as a notebook front end drives it (jupyter_client): run a cell, press Stop at chosen moments
(the manager's ``interrupt_kernel``, which is what JupyterLab's Stop button sends), answer or refuse prompts, and
read back what the cell showed. Used by the lifecycle tests and the random-sequence test."""

import contextlib
import re
import threading
import time
from dataclasses import dataclass, field

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# frames of mpinb's own code or of ipyparallel's, as a traceback shows them
INTERNAL_FRAME = re.compile(r"(site-packages/(mpinb|ipyparallel)/|/main/mpinb/|mpinb/(notebook|rank|wire)/\w+\.py)")


@dataclass
class Shown:
    """What one request showed: its reply status, its text (streams, results, errors, ANSI codes removed), the
    prompts it asked and the error's name."""

    status: str
    text: str
    prompts: list = field(default_factory=list)
    ename: str = None
    seconds: float = 0.0
    number: int = None  # the request's execution count (its In[number])

    def internal_frames(self):
        """Lines of this output that are frames of mpinb's or ipyparallel's code."""
        return [line for line in self.text.splitlines() if INTERNAL_FRAME.search(line)]


class Session:
    """One kernel and its client; ``run`` executes a cell as a notebook does (``allow_stdin`` as asked)."""

    def __init__(self, client, manager):
        self.client, self.manager = client, manager

    @property
    def pid(self):
        """The kernel's process id (whatever it starts is its child while it runs)."""
        return self.manager.provisioner.process.pid

    def stop_button(self):
        self.manager.interrupt_kernel()

    def run(self, code, *, stops=(), after=None, allow_stdin=True, answers=(), timeout=180):
        """Execute *code*, pressing Stop *stops* seconds (each from the start) after sending it, or after the text
        *after* first shows in its output (so that a busy machine's slow start moves the Stops with it); answer
        each prompt from *answers* (``c`` once they run out; or a function of the prompt). Returns
        :class:`Shown`; a reply that does not come within *timeout* seconds raises ``TimeoutError`` (a hang)."""
        answers, prompts, out = answers if callable(answers) else list(answers), [], []
        timers = [threading.Timer(delay, self.stop_button) for delay in stops]

        def shown(message):
            started = after is not None and after in _text(out)
            out.append(message)
            if after is not None and not started and after in _text(out):
                for timer in timers:
                    timer.start()

        def typed(message):
            prompt = message["content"]["prompt"]
            prompts.append(prompt)
            if callable(answers):  # a function of the prompt: it may take its time, as a user does
                self.client.input(answers(prompt))
            else:
                self.client.input(answers.pop(0) if answers else "c")

        tic = time.monotonic()
        for timer in timers if after is None else ():
            timer.start()
        try:
            reply = self.client.execute_interactive(code, timeout=timeout, output_hook=shown,
                                                    allow_stdin=allow_stdin, stdin_hook=typed, stop_on_error=False)
        finally:
            for timer in timers:
                timer.cancel()
        seconds = time.monotonic() - tic
        # a Stop that fired after the reply came interrupts nothing of this cell; let it land before the next one
        late = [delay for delay in stops if delay > seconds]
        if late:
            time.sleep(0.3)
        return Shown(reply["content"]["status"], _text(out), prompts, reply["content"].get("ename"), seconds,
                     reply["content"].get("execution_count"))


def _text(messages):
    parts = []
    for message in messages:
        kind, content = message["msg_type"], message["content"]
        if kind == "stream":
            parts.append(content.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            parts.append(content["data"].get("text/plain", "") + "\n")
        elif kind == "error":
            parts.append("\n".join(content.get("traceback", [])) + "\n")
    return ANSI.sub("", "".join(parts))


def run(session, code, answers=()):
    """Execute *code* in *session*, typing *answers* at each prompt (``c`` once they run out): ``(status, output,
    prompts)``."""
    shown = session.run(code, answers=answers, timeout=120)
    return shown.status, shown.text, shown.prompts


@contextlib.contextmanager
def jupyter_client_kernel(env=None):
    """A real ipykernel started and driven by jupyter_client (its own process, reached over ZMQ as a front end
    reaches it, no Jupyter server between), as a :class:`Session`; shut down (and its processes with it) at the end.
    A kernel that a Jupyter server starts and forwards over its websocket is ``lab_server``'s."""
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(**({"env": env} if env else {}))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield Session(client, manager)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)
