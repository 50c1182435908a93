"""The kernel's end of JupyterLab's MPI panel: a thread that, a few times a second, asks the running cell's ranks
where they are (a roll call, answered by each rank's roll-call thread even while it waits in MPI), reads their
processes' CPU and memory, and writes the panel's state file (``wire/panel_files.py``) for the Jupyter server to
hand the browser. It never waits for the kernel's shell: the roll call's answers come back through the running
cell's loop, which feeds them here, and between cells there is nothing to ask. It also takes the panel's requests
(a rank's stacks, read from outside the ranks as ``%mpi stacks`` reads them)."""

import logging
import os
import threading
import time

import psutil

from ...wire import panel_files
from ...wire.kinds import DebugStopped, Input, Metrics, Out, Reply, RollCall, Waiting, Where
from .model import PanelModel

log = logging.getLogger("mpinb")

EVERY = 0.3  # seconds between two writes of the state file (3.3 updates a second)
USAGE_EVERY = 1.0  # seconds between two reads of the ranks' CPU and memory
IDLE_EVERY = 2.0  # seconds between two writes while this kernel has no world
CALLS = 3_000_000  # roll-call numbers of the panel's own, apart from those of the cell's checks


def kernel_id():
    """The id of the Jupyter kernel this runs in (from its connection file's name), or ``None`` outside of one."""
    try:
        from ipykernel.connect import get_connection_file

        name = os.path.basename(get_connection_file())
    except Exception:  # noqa: BLE001 - not in a kernel (terminal IPython, a script): no panel
        return None
    if not name.startswith("kernel-") or not name.endswith(".json"):
        return None
    return name[len("kernel-"):-len(".json")]


class Publisher(threading.Thread):
    """Writes *kernel*'s panel state every *every* seconds while the kernel lives; fed by the running cell."""

    def __init__(self, kernel, *, every=EVERY, directory=None):
        super().__init__(name="mpinb-panel", daemon=True)
        self.kernel, self.every = kernel, every
        self.directory = directory or panel_dir_or_none()
        self.model = PanelModel()
        self.world = None
        self.calls = CALLS
        self.processes = {}  # pid -> psutil.Process, for CPU percent between two reads
        self.closing = threading.Event()
        self.writes = 0
        self.written = 0.0  # when the state file was last written (monotonic)
        self.usage_read = (0.0, {})  # when the ranks' CPU and memory were last read, and what they were

    # fed from the kernel's main thread ------------------------------------------------------------------------

    def cell_started(self, world, number, ranks, code):
        self.world = world
        self.model.cell_started(number, ranks, code)

    def cell_ended(self):
        self.model.cell_ended()
        self.usage_read = (0.0, self.usage_read[1])  # read afresh: a rank that died in the cell is said dead at once

    def feed(self, message):
        """One message of the running cell; whether it was the panel's own (then for no one else)."""
        if isinstance(message, Where) and message.where.asked is not None and message.where.asked >= CALLS:
            self.model.where(message.rank, message.where)
            return True
        if isinstance(message, (Waiting, Where)):
            self.model.where(message.rank, message.where)
        elif isinstance(message, Metrics):
            self.model.metrics(message.rank, message.records)
        elif isinstance(message, Input):
            self.model.prompt(message.rank)
        elif isinstance(message, DebugStopped):
            self.model.prompt(message.rank)
        elif isinstance(message, Out):
            self.model.prompt(message.rank, waiting=False)
        elif isinstance(message, Reply):
            self.model.replied(message.rank, message.reply.error is not None)
        return False

    # the panel's thread ---------------------------------------------------------------------------------------

    def run(self):
        if self.directory is None:
            return
        path = panel_files.state_path(self.kernel, self.directory)
        while not self.closing.is_set():
            began = time.monotonic()
            try:
                self.tick(path)
            except Exception as exc:  # noqa: BLE001 - a world changing as it is read: the next tick reads again
                log.debug("mpinb panel: %s", exc, exc_info=True)
            self.closing.wait(max(0.05, self.every - (time.monotonic() - began)))
        try:
            os.unlink(path)
        except OSError:
            pass

    def tick(self, path):
        world = self.world
        cell = self.model.cell
        if world is not None and cell is not None and world.channel is not None:
            self.calls += 1
            message = RollCall(self.calls)
            for rank in cell["ranks"]:
                if rank not in self.model.finished:
                    world.channel.post(rank, message)
        for request_id, request in panel_files.take_requests(self.kernel, self.directory):
            self.take(request_id, request)
        quiet = (world is None or not world.running) and not self.model.answers
        if quiet and time.monotonic() - self.written < IDLE_EVERY:
            return  # no world: nothing changes but the file's time, which tells the server this kernel lives
        panel_files.write_state(path, self.state())
        self.written = time.monotonic()
        self.writes += 1

    def state(self):
        """The state file's contents now."""
        world = self.world
        state = {"version": panel_files.VERSION, "kernel": self.kernel, "pid": os.getpid(), "time": time.time(),
                 "every": self.every, "world": None, "cell": None, "ranks": [], "answers": {}}
        if world is None or not world.running or not world.identities:
            state["answers"] = dict(self.model.answers)
            return state
        identities = dict(world.identities)
        local = set(world.local_ranks(list(identities)))
        if time.monotonic() - self.usage_read[0] >= USAGE_EVERY or set(self.usage_read[1]) != local:
            self.usage_read = (time.monotonic(), self.usage(identities, local))
        usage = self.usage_read[1]
        why = f"its process ended{_during(world)}"
        dead = {rank: why for rank in local if usage.get(rank) is None}
        # ranks on other hosts: ipyparallel's client (which knows of their death) is the main thread's alone
        facts = {"identities": identities, "size": world.size, "mpi": identities[min(identities)].get("mpi", ""),
                 "launcher": _launcher(world), "hosts": {host: label_ranks_short(ranks)
                                                         for host, ranks in world.hosts().items()},
                 "state": str(getattr(world.state, "value", world.state)), "local": sorted(local)}
        state.update(self.model.snapshot(facts, {rank: value for rank, value in usage.items() if value}, dead))
        return state

    def usage(self, identities, local):
        """``{rank: (cpu percent, resident bytes)}`` of the ranks on this host (``None``: its process is gone)."""
        usage = {}
        for rank in local:
            pid = identities[rank].get("pid")
            process = self.processes.get(pid)
            try:
                if process is None:
                    process = self.processes[pid] = psutil.Process(pid)
                    process.cpu_percent()  # the first read starts the count
                with process.oneshot():
                    if process.status() == psutil.STATUS_ZOMBIE:
                        raise psutil.NoSuchProcess(pid)
                    usage[rank] = (round(process.cpu_percent(), 1), process.memory_info().rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied, TypeError):
                usage[rank] = None
        return usage

    def take(self, request_id, request):
        """One request of the panel's: a rank's stacks (on a thread of its own: py-spy takes a while)."""
        action, rank = request.get("action"), request.get("rank")
        world = self.world
        if action != "stacks":
            self.model.answer(request_id, {"action": action, "rank": rank, "ok": False,
                                           "text": f"the kernel does not take {action!r} from the panel"})
            return
        if world is None or not world.running or rank not in world.identities:
            self.model.answer(request_id, {"action": action, "rank": rank, "ok": False,
                                           "text": f"rank {rank} is not in a running world"})
            return
        threading.Thread(target=self._stacks, args=(request_id, world, rank), name="mpinb-panel-stacks",
                         daemon=True).start()

    def _stacks(self, request_id, world, rank):
        from ..diagnosis import native

        cell = self.model.cell
        try:
            text = native.stacks(world, [rank], cell["code"] if cell else "")
            answer = {"ok": True, "text": text}
        except Exception as exc:  # noqa: BLE001 - said in the panel, as %mpi stacks would say it
            answer = {"ok": False, "text": f"%mpi stacks {rank}: {exc}"}
        self.model.answer(request_id, {"action": "stacks", "rank": rank, **answer})

    def close(self):
        self.closing.set()
        if self.is_alive():
            self.join(timeout=2)


def _during(world):
    return f" during In[{world.died_in}]" if getattr(world, "died_in", None) is not None else ""


def _launcher(world):
    """``mpiexec`` (its path), with the batch job or host file the ranks were placed by, as ``%mpi status`` says."""
    via = world.mpi.mpiexec if getattr(world, "mpi", None) is not None else "mpiexec"
    placement = getattr(world, "launcher", None) or getattr(world, "placement", None)
    try:
        where = placement.describe(job_id=world.job_id()) if placement is not None else ""
    except Exception:  # noqa: BLE001 - the job asked as it ends: the launcher alone is said
        where = ""
    return f"{via} ({where})" if where else via


def label_ranks_short(ranks):
    from ...wire.ranks import format_ranks

    return format_ranks(list(ranks))


def panel_dir_or_none():
    try:
        return panel_files.panel_dir()
    except OSError as exc:
        log.debug("mpinb panel: no directory for its state: %s", exc)
        return None
