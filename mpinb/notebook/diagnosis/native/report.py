"""What ``%mpi stacks`` prints, and what a rank that did not answer the interrupt adds to its error: both read
the same captures (``py_spy.capture``, or ``diagnose.capture_stacks`` where it cannot be run) and say them with
``places``."""

from ....wire.ranks import label_ranks
from ..diagnose import RankStack, capture_stacks, parse
from ...world import State
from . import places, py_spy


def stacks(world, ranks, code=""):
    """``%mpi stacks``: for every rank of *ranks*, a one-line summary of where it is and its main thread's frames,
    Python and native merged; ranks whose stacks read the same are shown once under one label. *code* is the
    running cell's source (its lines are quoted). Python frames only (faulthandler's), after one line saying why,
    where py-spy cannot be run."""
    # ranks elsewhere are asked through the cell channel, whose socket the running cell's loop owns meanwhile (this
    # runs on another thread then): asked only between cells
    busy = world.state not in (State.IDLE, State.DEAD)
    native, note = py_spy.capture(world, ranks, elsewhere=not busy)
    # the file each rank's cell was compiled as, from its stack file's notes: py-spy's frames say the rest
    python = {rank: _cell_of(world, rank) for rank, stack in native.items() if stack.frames and
              not world.is_remote(rank)}
    others = [rank for rank in ranks if rank not in python]
    asked = [rank for rank in others if not (busy and world.is_remote(rank))]
    python.update(capture_stacks(world, asked) if asked else {})
    for rank in others:
        if rank not in python:
            host = world.identities.get(rank, {}).get("host", "another host")
            python[rank] = RankStack(rank, note=f"on {host}: its stack is asked of the rank between cells only")
    groups = {}  # text -> ranks
    for rank in ranks:
        stack, own = python.get(rank), native.get(rank)
        if own is not None and own.frames:
            head = places.summary(own, stack, code)
            body = places.merged(own, stack)
        else:
            head = stack.where(code, verb="in") if stack is not None else "position unknown"
            if own is not None and own.note and (stack is not None and stack.frames or not world.is_remote(rank)):
                head += f" ({own.note})"
            body = stack.text() if stack is not None and stack.frames else ""
        groups.setdefault((head, body), []).append(rank)
    lines = [f"[mpinb] {note}"] if note else []
    for (head, body), members in groups.items():
        verb = "is" if len(members) == 1 else "are"
        lines.append(f"{label_ranks(members)} {verb} {head}")  # its frames, if any, indented below
        if body:
            lines.append(body)
    return "\n".join(lines)


def _cell_of(world, rank):
    """The :class:`~mpinb.notebook.diagnosis.diagnose.RankStack` (no frames) that names the file *rank*'s running cell was
    compiled as, read from the notes at the head of its stack file (``rank/stacks.py``)."""
    path = world.stack_files.get(rank)
    try:
        with open(path, errors="replace") as file:
            text = file.read()
    except (OSError, TypeError):
        return None
    return parse(text, len(text), rank)


def for_unanswered(world, ranks, stacks=None):
    """``{rank: NativeStack}`` of *ranks* that did not answer the interrupt (empty where py-spy cannot be run):
    read before the world is ended or restarted, while they are still where they were stuck. A rank on another
    host whose roll call gave no Python stack (*stacks*, when the cell was stopped) holds its GIL: it is not
    asked again."""
    silent = [rank for rank in ranks if world.is_remote(rank) and stacks is not None and
              not getattr(stacks.get(rank), "frames", None)]
    ranks = [rank for rank in ranks if rank not in silent]
    if not ranks:
        return {}
    native, _ = py_spy.capture(world, ranks)
    return {rank: stack for rank, stack in native.items() if stack.frames or stack.note}


def in_error(native, python, code):
    """``(what the error's message adds, what its traceback adds)`` for a rank that did not answer: ``"; natively
    in MPI_Barrier (libmpi.so.12)"`` and its innermost native frames; why there are none when py-spy was run and
    gave none (``"; no native frames (py-spy did not answer within 10 s)"``); nothing when it was not run."""
    if native is None:
        return "", []
    if not native.frames:
        if not native.note:
            return "", []
        said = native.note if native.note.startswith("no native frames") else f"no native frames ({native.note})"
        return f"; {said}", []
    spot = places.place(native)
    if spot is None:
        return "", []
    by = places.caller(native)
    said = f"; natively {spot}" + (f", called from {by}" if by else "")
    frames = places.folded(native)
    return said, [f"Where it was in native code (its innermost frames, most recent call last):\n{frames}\n"] \
        if frames else []
