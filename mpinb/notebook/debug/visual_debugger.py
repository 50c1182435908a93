"""The kernel's end of the visual debugger for ``%%mpi`` cells: JupyterLab's debugger panel (and any client of the
kernel's Debug Adapter Protocol) stops ranks at the breakpoints clicked in a cell, and shows a rank's frames and
variables.

It sits in front of ipykernel's own debugger (``kernel.debugger``, which speaks to debugpy in the kernel), and
answers or forwards each request: breakpoints in a ``%%mpi`` cell are kept here and travel to the ranks with the
cell (:class:`~mpinb.wire.kinds.DebugSetup`); requests that name a rank's thread, frame or variable (ids of
``wire/debug_ids.py``) go to that rank (``rank/debug/visual_debugger.py``); everything else is ipykernel's, so ordinary
cells debug as before. The panel shows one rank at a time: the chosen one (``%mpi debug --rank R``, rank 0
unless chosen) when it stops, else, after :data:`CHOSEN_WAIT` seconds, the first other rank that stopped. The
other stopped ranks wait, and go on whenever the shown rank does; none waits past the end of its cell, or past
the moment the debugger is switched off. When the shown rank goes on, the panel is told (a ``continued`` event,
as debugpy sends) before the rank is: JupyterLab then clears its call stack and variables, and shows the next
stop afresh, never a frame of the last one. A breakpoint's ``condition`` and ``hitCondition`` travel with its
line (``(line, condition, hitCondition)``), for the rank to decide.

What this uses of ipykernel and debugpy beyond their documented protocols is here only: ``kernel.debugger``
with ``process_request``, ``event_callback``, ``is_started``, ``stopped_threads`` and ``breakpoint_list``;
``kernel.control_thread.io_loop``; ``ipykernel.compiler`` (the path the kernel's debugger gives a cell); the
kernel compiler's ``get_code_name``; debugpy's ``setDebuggerProperty`` request and its subprocess patches.
"""

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import sys
import threading
import time

from ...wire import debug_ids
from ...wire.kinds import DebugCommand, DebugSetup

CHOSEN_WAIT = 1.0  # seconds another rank's stop waits for the chosen rank's before the panel shows it
ANSWER_TIMEOUT = 30.0  # seconds a rank gets to answer one request of the panel
RESUMING = ("continue", "next", "stepIn", "stepOut")
# a stopped rank's requests that JupyterLab sends with the thread it last saw stopped, which it forgets first
CURRENT_THREAD = ("continue", "next", "stepIn", "stepOut", "pause")
_MPINB = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

current = None  # the one VisualDebugger of this kernel, once the extension is loaded in a kernel with a debugger


def install(shell):
    """Put mpinb in front of the kernel's debugger, where *shell* runs in a kernel that has one."""
    global current
    debugger = getattr(getattr(shell, "kernel", None), "debugger", None)
    if debugger is None or not hasattr(debugger, "process_request") or current is not None:
        return current
    current = VisualDebugger(debugger, shell)
    no_subprocess_attach()
    return current


def no_subprocess_attach():
    """Keep debugpy from attaching to the processes the kernel starts.

    Once listening in the kernel, debugpy makes every Python process the kernel starts wait for a debugger client
    of its own, which JupyterLab never attaches (it ignores the ``debugpyAttach`` event): a world's start (its
    mpi4py check, its controller) would wait forever. Set before debugpy listens (``debugpy.configure``), and
    undone where it already listens (its patches of ``os``, ``subprocess`` and ``_posixsubprocess`` keep the
    originals beside them as ``original_NAME``)."""
    debugpy = sys.modules.get("debugpy")
    if debugpy is not None:
        try:
            debugpy.configure(subProcess=False)
        except Exception:  # noqa: BLE001 - a debugpy without this setting: the patches below still go
            pass
    for module in (sys.modules.get(name) for name in ("os", "subprocess", "_posixsubprocess")):
        for name, original in list(vars(module or object).items()):
            patched = getattr(module, name.removeprefix("original_"), None)
            if name.startswith("original_") and "pydev" in getattr(patched, "__module__", ""):
                setattr(module, name.removeprefix("original_"), original)


def setup():
    """The :class:`~mpinb.wire.kinds.DebugSetup` for the ``%%mpi`` cell about to run, or ``None`` when the kernel's
    debugger is off (or this kernel has none)."""
    return current.setup() if current is not None else None


@contextlib.contextmanager
def kernel_untraced():
    """The kernel's own debugger (debugpy) neither traces nor stops this thread meanwhile: mpinb's work in the
    kernel for a magic. With its exception filters on, it stopped wherever mpinb or a library it calls raised and
    handled an exception (``zmq.Again`` on every poll), not in the user's code, which runs on the ranks."""
    debugpy = sys.modules.get("debugpy") if current is not None and current.on else None
    if debugpy is None:
        yield
        return
    try:
        debugpy.trace_this_thread(False)
    except Exception:  # noqa: BLE001 - a debugpy that is not listening in this process: nothing to leave off
        yield
        return
    try:
        yield
    finally:
        debugpy.trace_this_thread(True)


class VisualDebugger:
    def __init__(self, debugger, shell):
        self.debugger = debugger
        self.forward = debugger.process_request
        debugger.process_request = self.process_request
        self.rank = 0  # the rank the panel shows (%mpi debug --rank R)
        self.breakpoints = {}  # the kernel's path for a %%mpi cell -> its breakpoints as _breakpoints gives them
        self.filters = ()
        self.lock = threading.Lock()
        self.answers = {}  # DebugCommand seq -> concurrent.futures.Future of its DebugAnswer
        self.numbers = itertools.count(1)
        self.events = itertools.count(1)
        self.channel = self.ranks = None  # of the %%mpi cell running now
        self.stopped = {}  # rank -> (DebugStopped, when it came) for the ranks stopped now
        self.shown = None  # the stopped rank the panel shows
        self.replied = set()  # ranks that finished the running cell
        self.raw_cell = ""
        shell.events.register("pre_run_cell", self._pre_run_cell)
        _name_mpi_cells_apart(shell)
        self.control = getattr(getattr(shell.kernel, "control_thread", None), "io_loop", None)
        if self.on and self.control is not None:  # switched on before mpinb was loaded
            self.control.add_callback(self._skip_mpinb)
        for path, points in dict(getattr(debugger, "breakpoint_list", {})).items():  # set before mpinb loaded
            if _is_mpi_cell(path):
                self.breakpoints[path] = _breakpoints(points)

    def _pre_run_cell(self, info):
        self.raw_cell = info.raw_cell or ""

    async def _skip_mpinb(self):
        """Tell the kernel's debugpy never to trace nor stop in mpinb's code, nor in the line a ``%%mpi`` cell runs
        in the kernel (a rank's error passes through it; the ranks stop where it was raised). Files debugpy does
        not trace are its own (``dontTrace`` patterns), so its own are named again."""
        import debugpy

        await self.forward({"type": "request", "seq": 0, "command": "setDebuggerProperty", "arguments": {
            "dontTraceStartPatterns": [os.path.dirname(os.path.abspath(debugpy.__file__)), _MPINB + os.sep,
                                       os.path.join(_tmp_directory(), CELL_PREFIX)],
            "dontTraceEndPatterns": ["debugpy_launcher.py"]}})

    @property
    def on(self):
        return bool(self.debugger.is_started)

    def setup(self):
        if not self.on:
            return None
        from ipykernel.compiler import get_file_name

        path = get_file_name(self.raw_cell)
        lines = tuple(point for point in self.breakpoints.get(path, ()) if _line(point) > 1)
        return DebugSetup(path, 0, lines, tuple(self.filters))

    # the protocol, from the control thread
    async def process_request(self, message):
        command, arguments = message.get("command"), message.get("arguments") or {}
        if command == "initialize":
            no_subprocess_attach()  # before debugpy listens
        elif command == "attach":
            # debugpy attaches to every Python process the kernel starts unless told not to, and each then
            # waits for a client that JupyterLab never sends: the world's start (an mpi4py check, the
            # controller) would hang
            arguments["subProcess"] = False
            message["arguments"] = arguments
        elif command == "setBreakpoints" and _is_mpi_cell(arguments.get("source", {}).get("path", "")):
            return self._set_breakpoints(message, arguments)
        elif command == "setExceptionBreakpoints":
            self.filters = tuple(arguments.get("filters") or ())
        elif command == "disconnect":
            self.switched_off()
            self.breakpoints.clear()
        rank = self._rank_for(command, arguments)
        if rank is not None:
            return await self._ask_rank(rank, message, command, arguments)
        reply = await self.forward(message)
        if command == "initialize":
            no_subprocess_attach()  # in case it listened before
        elif command == "attach" and reply.get("success"):
            await self._skip_mpinb()
        elif command == "debugInfo" and self.shown is not None:
            reply["body"]["stoppedThreads"] = [*reply["body"].get("stoppedThreads", []),
                                               debug_ids.thread_id(self.shown)]
        elif command == "threads" and reply.get("success") and self.shown is not None:
            reply["body"]["threads"] = [*reply["body"].get("threads", []),
                                        {"id": debug_ids.thread_id(self.shown), "name": f"rank {self.shown}"}]
        return reply

    def _set_breakpoints(self, message, arguments):
        path = arguments["source"]["path"]
        self.breakpoints[path] = _breakpoints(arguments.get("breakpoints") or [])
        lines = [_line(point) for point in self.breakpoints[path]]
        self.debugger.breakpoint_list[path] = [  # debugInfo lists them
            {"line": line, **({} if isinstance(point, int) else
                              {key: value for key, value in zip(("condition", "hitCondition"), point[1:]) if value})}
            for line, point in zip(lines, self.breakpoints[path])]
        points = [{"verified": line > 1, "line": line, "source": {"path": path},
                   **({} if line > 1 else {"message": "the %%mpi line runs in the kernel, not on the ranks"})}
                  for line in lines]
        return _response(message, True, {"breakpoints": points})

    def _rank_for(self, command, arguments):
        """The rank a request is for, or ``None`` for the kernel's own debugger."""
        for key in ("threadId", "frameId", "variablesReference"):
            rank = debug_ids.rank_of(arguments.get(key))
            if rank is not None:
                return rank
        if self.shown is None or self.debugger.stopped_threads:
            return None
        if command in CURRENT_THREAD:
            return self.shown
        if command == "source" and not os.path.isfile((arguments.get("source") or {}).get("path", "")):
            return self.shown
        return None

    async def _ask_rank(self, rank, message, command, arguments):
        with self.lock:
            if self.channel is None or rank not in self.stopped:
                return _response(message, False, {}, f"rank {rank} is not stopped in the debugger")
            seq, future = next(self.numbers), concurrent.futures.Future()
            self.answers[seq] = future
            if command in RESUMING:  # it goes on: the panel shows it no more, the ranks waiting with it go on
                if rank == self.shown:  # told before the rank goes on, so before its next stop
                    self._event("continued", {"threadId": debug_ids.thread_id(rank), "allThreadsContinued": False})
                self._resumed(rank)
            self.channel.post(rank, DebugCommand(seq, command, arguments))
        try:
            answer = await asyncio.wait_for(asyncio.wrap_future(future), ANSWER_TIMEOUT)
        except asyncio.TimeoutError:
            return _response(message, False, {}, f"rank {rank} did not answer {command} within {ANSWER_TIMEOUT:g} s")
        finally:
            self.answers.pop(seq, None)
        if answer is None:
            return _response(message, False, {}, f"the cell ended before rank {rank} answered {command}")
        return _response(message, answer.success, answer.body, answer.message)

    def _resumed(self, rank):
        """*rank* goes on (under the lock): so do the ranks waiting while it was shown."""
        self.stopped.pop(rank, None)
        if rank == self.shown:
            self.shown = None
            for other in list(self.stopped):
                self._go_on(other)

    def _go_on(self, rank):
        self.stopped.pop(rank, None)
        self.channel.post(rank, DebugCommand(next(self.numbers), "continue", {}))

    def switched_off(self):
        """The panel was switched off: every rank of the running cell goes on, and stops nowhere else in it."""
        with self.lock:
            if self.channel is not None:
                for rank in self.ranks:
                    self.channel.post(rank, DebugCommand(next(self.numbers), "disconnect", {}))
            self.stopped, self.shown = {}, None

    # the running cell, from the thread that waits for it
    def cell_started(self, channel, ranks):
        with self.lock:
            self.channel, self.ranks = channel, list(ranks)
            self.stopped, self.shown, self.replied = {}, None, set()

    def cell_ended(self):
        with self.lock:
            shown, self.shown = self.shown, None
            self.channel = self.ranks = None
            self.stopped = {}
            for future in self.answers.values():
                if not future.done():
                    future.set_result(None)
        if shown is not None:
            self._event("continued", {"threadId": debug_ids.thread_id(shown), "allThreadsContinued": False})

    @property
    def paused(self):
        """Whether a rank waits in the debugger (the cell's time is the user's, not its own)."""
        return bool(self.stopped)

    def on_stopped(self, message, now):
        with self.lock:
            if not self.on:  # switched off as it stopped
                self.channel.post(message.rank, DebugCommand(next(self.numbers), "disconnect", {}))
                return
            self.stopped[message.rank] = (message, now)
            show = self.shown is None and (message.rank == self.rank or self.rank not in self.ranks
                                           or self.rank in self.replied)
        if show:
            self._show(message.rank)

    def on_answer(self, message):
        future = self.answers.get(message.seq)
        if future is not None and not future.done():
            future.set_result(message)

    def on_reply(self, rank):
        with self.lock:
            self.replied.add(rank)
        self.tick(time.monotonic(), waited=0.0)

    def tick(self, now, waited=CHOSEN_WAIT):
        """Show a stopped rank when the chosen one did not stop within *waited* seconds of it (or finished)."""
        with self.lock:
            if self.shown is not None or not self.stopped or self.rank in self.stopped:
                return
            rank, (_, when) = min(self.stopped.items())
            if now - when < waited and self.rank not in self.replied:
                return
        self._show(rank)

    def _show(self, rank):
        with self.lock:
            if rank not in self.stopped or self.shown is not None:
                return
            self.shown = rank
            message, _ = self.stopped[rank]
        chosen = "" if rank == self.rank else f" (rank {self.rank} did not stop)"
        self._event("stopped", {"reason": message.reason, "threadId": debug_ids.thread_id(rank),
                                "allThreadsStopped": False, "preserveFocusHint": False,
                                "description": f"rank {rank}: {message.text or message.reason}{chosen}",
                                "text": message.text})

    def _event(self, name, body):
        self.debugger.event_callback({"type": "event", "seq": next(self.events), "event": name, "body": body})


CELL_PREFIX = "mpinb-cell-"


def _tmp_directory():
    from ipykernel.compiler import get_tmp_directory

    return get_tmp_directory()


def _name_mpi_cells_apart(shell):
    """Have the kernel compile a ``%%mpi`` cell (one line: ``run_cell_magic``) as a file of its own name, not the
    name the panel knows the cell by: the kernel's debugger then never stops there (a breakpoint on the
    ``%%mpi`` line, the rank's error passing through that line: see ``_skip_mpinb``), and the panel's
    breakpoints are the ranks'."""
    compiler = getattr(shell, "compile", None)
    name = getattr(compiler, "get_code_name", None)
    if name is None or getattr(name, "mpinb", False):
        return

    def get_code_name(raw_code, *args, **kwargs):
        code_name = name(raw_code, *args, **kwargs)
        if raw_code.lstrip().startswith("%%mpi"):
            directory, base = os.path.split(code_name)
            return os.path.join(directory, CELL_PREFIX + base)
        return code_name

    get_code_name.mpinb = True
    compiler.get_code_name = get_code_name


def _breakpoints(points):
    """DAP's source breakpoints as they travel to the ranks, by line: a line, or ``(line, condition, hitCondition)``
    for one with either (``rank/debug/visual_debugger.py`` decides them where it runs)."""
    chosen = {}
    for point in points:
        condition, hit = point.get("condition") or None, point.get("hitCondition") or None
        chosen[int(point["line"])] = (int(point["line"]), condition, hit) if condition or hit else int(point["line"])
    return [chosen[line] for line in sorted(chosen)]


def _line(point):
    return point if isinstance(point, int) else point[0]


def _is_mpi_cell(path):
    """Whether the kernel's debugger file *path* holds a ``%%mpi`` cell (dumped by the panel)."""
    try:
        with open(path, encoding="utf-8") as file:
            return file.read(64).lstrip().startswith("%%mpi")
    except OSError:
        return False


def _response(message, success, body, text=""):
    reply = {"type": "response", "request_seq": message.get("seq"), "seq": 0, "command": message.get("command"),
             "success": bool(success), "body": body or {}}
    if text:
        reply["message"] = text
    return reply
