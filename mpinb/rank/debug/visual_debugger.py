"""The rank's end of the notebook's visual debugger (JupyterLab's panel, or any client of the kernel's Debug
Adapter Protocol): breakpoints in a ``%%mpi`` cell, its exception filters, and the requests of a stop.

The kernel sends each cell a :class:`~mpinb.wire.kinds.DebugSetup` while its debugger is on. A cell with
breakpoints or exception filters runs under :class:`RankDebugger` (Python's ``bdb``, on the cell's thread only:
the rank's other threads are never traced). Where it stops, it says so (:class:`~mpinb.wire.kinds.DebugStopped`)
and answers the panel's requests (:class:`~mpinb.wire.kinds.DebugCommand`, handed over by the roll-call thread)
until one resumes it (``stop_requests.py`` answers them). Frames of the cell are named by the kernel's path for the
cell and its lines, so that the panel shows them in the cell; frames of mpinb's own code are never shown. Ids are
those of ``wire/debug_ids.py``, and each stop hands out new ones: JupyterLab keeps showing the frame it showed
while the new stop lists a frame of the same id, so ids that came again left its editor and Variables pane on the
last stop; an id of an earlier stop is refused, never resolved to what it named then.

The names mpinb predefines on a rank (``panel_values.PREDEFINED``) are listed after the user's own, under one
entry. A breakpoint of the setup may be a line or ``(line, condition, hitCondition)`` (DAP's, as debugpy reads
them: ``breakpoints.py``). A stopped rank waits for the panel in :func:`next_request`, where the notebook knows it
paused (``wire/debug_pause.py``). The Stop button interrupts a stopped rank as it does a running one; the error
then says where it was paused, without the debugger's frames.
"""

import bdb
import os
import queue
import sys

from ...wire.kinds import DebugAnswer, DebugStopped
from .breakpoints import Breakpoint
from .panel_values import describe
from .stop_requests import Stop

_MPINB = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_requests = queue.SimpleQueue()  # DebugCommands for the stopped debugger, from the roll-call thread
_send = None  # sends a message to the notebook after the output before it: set by the agent
rank = None
cell_id = None  # the running cell's (the agent sets it)
armed = True  # False once the debugger was switched off during the running cell: nothing stops it any more
cell_paths = {}  # file a cell was compiled as here -> (the kernel's path for it, line offset)
stopped = False  # whether this rank waits in the visual debugger now
RESUMING = ("continue", "next", "stepIn", "stepOut")


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


def _cut_after(tb, frame):
    """End traceback *tb* at *frame*'s entry: the debugger's own frames below it are not the user's."""
    while tb is not None and tb.tb_frame is not frame:
        tb = tb.tb_next
    if tb is not None:
        tb.tb_next = None


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
            self.serve(frame, "exception", describe(exc))
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
            serve(frames[::-1], "exception", describe(exc))

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
    stop = Stop(frames, rank, cell_paths)
    stopped = True
    try:
        _send(DebugStopped(rank, cell_id, reason, text))
        while True:
            command = next_request()
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
                _answer(command.seq, False, {}, describe(exc))
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
    serve(frames[::-1], "exception", describe(exc))


def next_request():
    """The panel's next request of this stopped rank: where a paused rank waits (``wire/debug_pause.py`` knows it
    there by this function's name and file)."""
    while True:
        try:  # a timeout, so that an interrupt (the Stop button) gets through
            return _requests.get(timeout=0.1)
        except queue.Empty:
            continue
