"""What the MPI panel shows of a world, as a plain object: the facts the running cell's messages bring (where each
rank is, its last losses, whether it finished) and the processes' CPU and memory go in; :meth:`PanelModel.snapshot`
gives the JSON the browser draws, one row per rank, the rank holding the others up named with the reason."""

import collections
import dataclasses
import threading
import time

from ...wire.ranks import label_ranks

LOSSES = 60  # the last values of a rank's loss the sparkline shows
STALE = 2.0  # seconds after which a rank's last roll-call answer no longer says where it is
_DEBUGGERS = ("bdb.py", "pdb.py", "visual_debugger.py")  # a main thread stopped in one of these is paused
_OWN = ("/mpinb/rank/", "/mpinb/wire/")  # mpinb's frames: the user's line is the cell's, below them
_META = ("rank", "run", "step", "time")


class PanelModel:
    """One kernel's world as the panel shows it; fed from the kernel's main thread (:meth:`cell_started`,
    :meth:`where`, :meth:`metrics`, :meth:`replied`, :meth:`cell_ended`) and read from the panel's thread
    (:meth:`snapshot`), under one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.cell = None  # {"number", "started", "ranks", "code"} while a %%mpi cell runs
        self.wheres = {}  # rank -> (WhereAnswer, monotonic time it came)
        # rank -> (its clock, its CPU seconds, pid, CPU percent, resident bytes, GPU bytes and use or None): what a
        # rank says of its process
        # in its roll-call answers, shown for a rank on another host, whose process this one cannot read
        self.told = {}
        self.finished = {}  # rank -> "ok" or "error", for the running cell
        self.prompts = set()  # ranks whose debugger waits at a prompt in the notebook
        self.losses = collections.defaultdict(lambda: collections.deque(maxlen=LOSSES))
        self.loss_names = {}
        self.answers = collections.OrderedDict()  # request id -> {"action", "rank", "ok", "text"}

    def cell_started(self, number, ranks, code, now=None):
        with self.lock:
            self.cell = {"number": number, "started": time.monotonic() if now is None else now,
                         "ranks": list(ranks), "code": code}
            self.wheres, self.finished, self.prompts = {}, {}, set()

    def cell_ended(self):
        with self.lock:
            self.cell, self.wheres, self.prompts = None, {}, set()

    def where(self, rank, where, now=None):
        with self.lock:
            self.wheres[rank] = (where, time.monotonic() if now is None else now)
            if where.usage is not None:
                self.told[rank] = told_usage(self.told.get(rank), where.usage)

    def prompt(self, rank, waiting=True):
        with self.lock:
            (self.prompts.add if waiting else self.prompts.discard)(rank)

    def replied(self, rank, failed):
        with self.lock:
            self.finished[rank] = "error" if failed else "ok"
            self.prompts.discard(rank)

    def metrics(self, rank, records):
        """``mpinb.report()`` records of *rank* (``(run, step, time, values, comm seconds)``, or the values
        alone): its loss (the first metric, when none is called loss) kept."""
        with self.lock:
            for record in records:
                if isinstance(record, (tuple, list)):
                    record = record[3] if len(record) > 3 and isinstance(record[3], dict) else {}
                name = self.loss_names.get(rank)
                if name not in record:
                    numbers = [key for key, value in record.items() if key not in _META and
                               isinstance(value, (int, float)) and not isinstance(value, bool)]
                    name = "loss" if "loss" in numbers else (numbers[0] if numbers else None)
                    if name is None:
                        continue
                    if self.loss_names.get(rank) != name:
                        self.losses[rank].clear()
                    self.loss_names[rank] = name
                value = record.get(name)
                if isinstance(value, (int, float)) and value == value and abs(value) != float("inf"):
                    self.losses[rank].append(float(value))

    def answer(self, request_id, answer):
        with self.lock:
            self.answers[request_id] = answer
            while len(self.answers) > 8:
                self.answers.popitem(last=False)

    def snapshot(self, world, usage=None, dead=(), now=None):
        """The panel's JSON for *world* (a dict: ``world`` describes it, ``ranks`` one row each); *usage*:
        ``{rank: (cpu percent, resident bytes)}`` of the ranks on this host (the others' are what they told);
        *dead*: ``{rank: why}``."""
        now = time.monotonic() if now is None else now
        usage, dead = usage or {}, dict(dead)
        with self.lock:
            told = {rank: told for rank, told in self.told.items()
                    if told[2] == world["identities"].get(rank, {}).get("pid")}  # the world's process, not an old one
            usage = {**{rank: told[3:5] for rank, told in told.items() if rank not in world["local"]}, **usage}
            cell = dict(self.cell) if self.cell else None
            wheres, finished, prompts = dict(self.wheres), dict(self.finished), set(self.prompts)
            losses = {rank: list(values) for rank, values in self.losses.items()}
            names = dict(self.loss_names)
            answers = dict(self.answers)
        rows = []
        for rank, who in sorted(world["identities"].items()):
            state, text = _state(rank, cell, wheres.get(rank), finished, prompts, dead, now)
            cpu, rss = usage.get(rank, (None, None))
            gpu_memory, gpu_use = (told[rank][5] if rank in told else None) or (None, None)
            rows.append({"rank": rank, "host": who.get("host", ""), "pid": who.get("pid"), "state": state,
                         "text": text, "cpu": cpu, "rss": rss, "gpu_memory": gpu_memory, "gpu_use": gpu_use,
                         "loss_name": names.get(rank),
                         "losses": losses.get(rank, []), "holding": None})
        if cell is not None:
            for rank, reason in holding_up(cell, wheres, finished, now).items():
                if 0 <= rank < len(rows) and rows[rank]["rank"] == rank:
                    rows[rank]["holding"] = reason
        return {"world": {key: world[key] for key in ("size", "mpi", "launcher", "hosts", "state", "local")},
                "cell": None if cell is None or not cell["number"] else {"number": cell["number"],
                                                   "seconds": round(now - cell["started"], 1)},
                "ranks": rows, "answers": answers}


def cell_line(where):
    """The line of the running cell *where* (a ``WhereAnswer``) is at: the editor's, ``%%mpi`` being line 1."""
    if not where.cell_file:
        return None
    return next((line for file, line, _ in where.frames if file == where.cell_file), None)


def _state(rank, cell, seen, finished, prompts, dead, now):
    """``(state, words)`` of one rank: idle, running, collective, paused, done, failed or dead."""
    if rank in dead:
        return "dead", f"dead: {dead[rank]}" if dead[rank] else "dead"
    if cell is None:
        return "idle", "idle"
    number = cell["number"]
    if not number:  # a %mpi command's own call on the ranks (who, inject, stacks between cells)
        return "running", "running a %mpi command"
    if rank in finished:
        if finished[rank] == "error":
            return "failed", f"failed in In[{number}]"
        return "done", f"finished In[{number}]; the others are still running"
    if rank in prompts:
        return "paused", f"paused at a debugger prompt in In[{number}]"
    if seen is None or now - seen[1] > STALE:
        return "running", f"running In[{number}]"
    where, at = seen
    line = cell_line(where)
    at_line = f" at line {line}" if line else ""
    if any(file.endswith(_DEBUGGERS) for file, _, _ in where.frames[:8]):
        return "paused", f"paused at a breakpoint in In[{number}]{at_line}"
    if where.waiting is not None:
        wait = where.waiting
        waited = wait.waited + (now - at)
        return "collective", (f"in {_operation(wait)} on {wait.comm} since {waited:.1f} s"
                              f" (In[{number}]{at_line})")
    return "running", f"running In[{number}]{at_line}"


def _operation(wait):
    op = wait.signature[0] if wait.signature else "a collective"
    return f"{op} #{wait.seq}"


def holding_up(cell, wheres, finished, now, *, after=0.2):
    """``{rank: reason}``: the ranks the others wait for. The collective waited in longest (for more than *after*
    seconds) on a communicator names its members that are not in it: each one still computing, in an earlier
    collective, or done with the cell without calling it holds up those waiting."""
    fresh = {rank: where for rank, (where, at) in wheres.items() if now - at <= STALE}
    # each wait as long as it is now: the answer said how long it was then
    waits = {rank: dataclasses.replace(where.waiting, waited=where.waiting.waited + now - wheres[rank][1])
             for rank, where in fresh.items() if where.waiting is not None and rank not in finished}
    # a rank already in a later collective on the same communicator: the earlier one completed, and an answer
    # still saying a rank waits in it was given before it did
    latest = {}
    for wait in waits.values():
        latest[wait.comm] = max(latest.get(wait.comm, wait.seq), wait.seq)
    waits = {rank: wait for rank, wait in waits.items() if wait.seq == latest[wait.comm]}
    if not waits:
        return {}
    oldest = max(waits.values(), key=lambda wait: wait.waited)
    if oldest.waited < after:
        return {}
    inside = sorted(rank for rank, wait in waits.items() if wait.comm == oldest.comm and wait.seq == oldest.seq)
    members = oldest.members or tuple(cell["ranks"])
    reasons = {}
    for rank in members:
        if rank in inside or rank not in cell["ranks"]:
            continue
        where, own = fresh.get(rank), waits.get(rank)
        if rank in finished:
            doing = "finished the cell without calling it"
        elif own is not None and own.comm == oldest.comm:
            doing = f"is still in {_operation(own)}"
        elif own is not None:
            doing = f"waits in {_operation(own)} on {own.comm}"
        elif where is not None and cell_line(where):
            doing = f"is still computing (line {cell_line(where)})"
        else:
            doing = "has not reached it"
        reasons[rank] = (f"holding up {label_ranks(inside)}: they wait in {_operation(oldest)} on {oldest.comm} "
                         f"for {oldest.waited:.1f} s; it {doing}")
    return reasons


def told_usage(before, usage):
    """(the rank's clock, CPU seconds, pid, CPU percent, resident bytes, GPU) from a rank's roll-call *usage* (its
    clock, its process's CPU seconds, resident bytes, pid, GPU bytes and use or ``None``) and what it told *before*
    (``None`` at first): the percent is of one core since its previous answer of the same process, and unknown at
    first (a rank restarted is another process; the row shows what a rank told only while its pid is the
    world's)."""
    clock, cpu, resident, pid, gpu = usage
    percent = None
    if before is not None and before[2] == pid and clock > before[0] and cpu >= before[1]:
        percent = round(100 * (cpu - before[1]) / (clock - before[0]), 1)
    return clock, cpu, pid, percent, resident, gpu
