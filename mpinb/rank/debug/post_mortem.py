"""pdb on a rank, with its prompt in the notebook: post-mortem on the rank's last failure, and ``breakpoint()``.

The debugger runs on the rank, in the cell's own thread; what it prints is the cell's output, and each line it
reads comes from the notebook: the rank asks for it (an :class:`~mpinb.wire.kinds.Input`, sent after the output
before it), the notebook shows the prompt through the kernel's stdin as ``input()`` does, and the answer comes
back to the rank's roll-call thread, which hands it over. Installed by the rank's agent only: under plain
``mpiexec``, ``breakpoint()`` is Python's own.
"""

import cmd
import pdb
import queue
import sys

from .. import stacks

_pdb_set_trace = pdb.set_trace

_lines = queue.SimpleQueue()  # answers from the notebook
_ask = None  # sends a prompt to the notebook: set by the agent
_last = None  # (exception, traceback) of this rank's last failed cell
rank = None


def install(ask, this_rank):
    """Route debugger prompts to the notebook through *ask(prompt)*; make ``breakpoint()`` open them."""
    global _ask, rank
    _ask, rank = ask, this_rank
    sys.breakpointhook = set_trace
    pdb.set_trace = set_trace  # import pdb; pdb.set_trace() too


def answer(line):
    """A line the notebook typed (the roll-call thread calls this)."""
    _lines.put(line)


def keep(exc):
    """Keep the exception a cell ended with, for :func:`post_mortem`."""
    global _last
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.endswith(("mpinb/rank/runner.py",
                                                                      "mpinb/rank/debug/visual_debugger.py")):
        tb = tb.tb_next  # the cell runner's own frame: pdb's "up" stops at the cell
    if tb is not None and not isinstance(exc, KeyboardInterrupt):
        _last = (exc, tb)


def last_failure():
    """``(exception, traceback)`` of this rank's last failed cell, or ``None``."""
    return _last


def remote_input(prompt=""):
    """``input()`` for the debugger: the prompt goes to the notebook, the answer comes back from it."""
    while not _lines.empty():  # an answer meant for an earlier prompt (the session ended first)
        _lines.get()
    _ask(prompt)
    while True:
        try:
            line = _lines.get(timeout=0.1)  # a timeout, so that an interrupt (the Stop button) gets through
        except queue.Empty:
            continue
        if line is None:
            raise EOFError
        return line


class RankPdb(pdb.Pdb):
    """pdb whose prompt names the rank and is answered in the notebook."""

    def __init__(self):
        super().__init__(nosigint=True)
        self.prompt = f"(rank {rank}) (Pdb) "

    def format_stack_entry(self, frame_lineno, lprefix=": "):
        """pdb's ``> file(line)function()``, a notebook cell named as IPython does (``Cell In[3]``) rather than
        by the file the kernel compiled it as."""
        text = super().format_stack_entry(frame_lineno, lprefix)
        filename = frame_lineno[0].f_code.co_filename
        number = stacks.cell_numbers.get(filename)
        return text if number is None else text.replace(self.canonic(filename), f"Cell In[{number}]", 1)

    def setup(self, f, tb):
        """pdb's stack from the cell inwards: the engine's, ipyparallel's and mpinb's frames above the cell are not
        the user's (``w`` starts at the cell; ``u`` stops there, ``*** Oldest frame``)."""
        super().setup(f, tb)
        user = stacks.current_cell_file
        first = next((i for i, (frame, _) in enumerate(self.stack)
                      if frame.f_code.co_filename in stacks.cell_numbers or frame.f_code.co_filename == user), 0)
        if 0 < first <= self.curindex:
            del self.stack[:first]
            self.curindex -= first
            self.curframe = self.stack[self.curindex][0]

    def cmdloop(self, intro=None):
        before = cmd.__dict__.get("input")
        cmd.input = remote_input  # cmd.Cmd reads its lines with input()
        try:
            return super().cmdloop(intro)
        finally:
            if before is None:
                del cmd.input
            else:
                cmd.input = before


def set_trace(*args, **kwargs):
    """``breakpoint()`` on a rank: stop here and debug in the notebook (``c`` continues)."""
    if _ask is None:
        return _pdb_set_trace(*args, **kwargs)
    RankPdb().set_trace(kwargs.get("frame") or sys._getframe(1))


def post_mortem():
    """Debug the traceback of this rank's last failed cell (``%mpi debug R`` runs this on rank R)."""
    if _last is None:
        print(f"rank {rank} has no failed cell to debug: %mpi debug R works after a cell failed on rank R")
        return
    exc, traceback = _last
    print(f"{type(exc).__name__}: {exc}")
    debugger = RankPdb()
    debugger.reset()
    debugger.interaction(None, traceback)
