"""Each rank's variables kept on its own host after every cell it finished, so that a world whose process died
can be started again with them (``%mpi restart``).

After a cell ends well, a thread of the rank pickles its namespace in one pass (cloudpickle, so that functions
and classes defined in cells travel by value; shared objects stay shared: an optimizer still holds the model's
own parameters) with the bytes of arrays and tensors out of band. Each such buffer is stored once under its
content hash, so a value that did not change is not written again; the rest (the object graph, small) is written
per cell, with what could not be kept and why. The next cell waits for the snapshot (at most as long as writing
what changed takes): a snapshot is never of a namespace a cell is changing. Files live in a private directory
of the world's (``$MPINB_SNAPSHOT_DIR``), made on the rank's host, one folder per rank; the notebook removes it
when the world is stopped, and keeps it when a world that died is started again.
"""

import io
import math
import os
import pickle
import sys
import threading
import time

import xxhash

from ..wire import files
from .who.text import size_text

KEEP = 3  # snapshots of the last cells kept (the last one every rank finished is among them)
LIMIT_ENV = "MPINB_SNAPSHOT_LIMIT"  # bytes one name may take, at most (else it is listed as not kept)
DEFAULT_LIMIT = 1 << 30
IDLE_ENV = "MPINB_SNAPSHOT_IDLE"  # seconds a rank waits after a cell before its snapshot
IDLE = 0.2
LAG_ENV = "MPINB_SNAPSHOT_LAG"  # seconds of a rank's work a crash may lose at most (see Snapshots.wait)
LAG = 10.0
DIRECTORY_ENV = "MPINB_SNAPSHOT_DIR"
# names a world defines itself on every rank, made again by the next one
WORLD_NAMES = {"comm", "rank", "size", "MPI", "mpi_rank", "mpi_size", "In", "Out", "get_ipython", "exit", "quit",
               "open",
               "_ih", "_oh", "_dh", "_", "__", "___", "_i", "_ii", "_iii", "_mpinb_cell_value"}

_snapshots = None


def install(rank):
    """Start keeping *rank*'s snapshots, where the world asked for them (``$MPINB_SNAPSHOT_DIR``); ``None``
    where it did not (snapshots off)."""
    global _snapshots
    directory = os.environ.get(DIRECTORY_ENV)
    _snapshots = Snapshots(directory, rank) if directory else None
    return _snapshots


def current():
    return _snapshots


def _hidden(name):
    return name in WORLD_NAMES or name.startswith("__") or (name.startswith("_i") and name[2:].isdigit()) or \
        (name.startswith("_") and name[1:].isdigit())


class _Tensor:
    """How a CPU tensor travels: its bytes out of band (a ``PickleBuffer``), rebuilt by :func:`_tensor`."""


def _tensor(data, dtype, shape, requires_grad, parameter):
    import torch

    flat = torch.frombuffer(bytearray(data) if isinstance(data, (bytes, memoryview)) else data, dtype=torch.uint8)
    value = flat.view(getattr(torch, dtype)).reshape(shape) if flat.numel() else \
        torch.empty(shape, dtype=getattr(torch, dtype))
    if parameter:
        return torch.nn.Parameter(value, requires_grad=requires_grad)
    return value.requires_grad_(requires_grad) if requires_grad else value


def _pickler_class():
    import cloudpickle

    class Pickler(cloudpickle.Pickler):
        """cloudpickle, with CPU tensors' bytes out of band (torch pickles them in band, through a copy), the
        world's own objects (``comm``, ``MPI.COMM_WORLD``) by reference, and the functions and classes of cells
        bound to the namespace they are loaded into, as if defined there."""

        check = staticmethod(lambda: None)  # raises Cancelled when a cell arrived
        namespace = None  # the rank's namespace: its functions' globals travel as a reference to it
        world = {}  # id of an object of the world's -> its name (bound to the new world's at load)

        def reducer_override(self, obj):
            self.check()
            name = self.world.get(id(obj))
            if name is not None:
                return _world_object, (name,)
            if obj.__class__ is _LiveNamespace:
                return _live_namespace, ()
            made_anew = _made_anew(obj)
            if made_anew is not None:
                raise pickle.PicklingError(made_anew)
            torch = _torch()
            if torch is not None and isinstance(obj, torch.Tensor) and type(obj) in (torch.Tensor,
                                                                                      torch.nn.Parameter) \
                    and obj.device.type == "cpu" and obj.layout == torch.strided and not obj.is_quantized:
                data = obj.detach().contiguous()
                raw = data.reshape(-1).view(torch.uint8).numpy() if data.numel() else b""
                return _tensor, (pickle.PickleBuffer(raw), str(data.dtype).removeprefix("torch."),
                                 tuple(data.shape), obj.requires_grad, type(obj) is torch.nn.Parameter)
            return super().reducer_override(obj)

        def _dynamic_function_reduce(self, func):
            reduced = super()._dynamic_function_reduce(func)
            if self.namespace is None or func.__globals__ is not self.namespace:
                return reduced
            # a function of a cell reads the rank's live namespace once restored (a name rebound later is what it
            # then sees), not a copy of the globals it used: those come back as the snapshot's values, the
            # world's names (comm, rank, size) as the new world's
            make, (code, _, *rest), (state, slots), *tail = reduced
            # (a communicator or process group it reads as a global is not kept, and is listed under its own name)
            slots["__globals__"] = {key: value for key, value in slots["__globals__"].items()
                                    if not _hidden(key) and _made_anew(value) is None}
            return (make, (code, _LIVE, *rest), (state, slots), *tail)

    return Pickler


class _LiveNamespace:
    """Stands for the rank's namespace in a snapshot: the globals of the functions defined in cells."""


_LIVE = _LiveNamespace()
_loading_into = None  # the namespace a restore is loading into


def _live_namespace():
    return _loading_into


def _world_object(name):
    """The new world's object for *name*: an MPI predefined communicator, or a name the world defines."""
    if name.startswith("MPI."):
        from mpi4py import MPI

        return getattr(MPI, name.removeprefix("MPI."))
    return _loading_into[name]


def _world_objects(namespace):
    """``{id: name}`` of the objects a world makes itself, which a snapshot keeps by reference."""
    objects = {}
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None:
        for name in ("COMM_WORLD", "COMM_SELF", "COMM_NULL"):
            objects[id(getattr(mpi, name))] = f"MPI.{name}"
    if "comm" in namespace and id(namespace["comm"]) not in objects:
        objects[id(namespace["comm"])] = "comm"
    return objects


RANDOM_STATE = "random"  # the manifest's key for the global random generators' state


def random_state():
    """The state of the global random generators this rank has imported: Python's ``random``, numpy's global
    generator, torch's CPU generator and every CUDA device's (once CUDA is initialised)."""
    import random

    state = {"random": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    torch = _torch()
    if torch is not None:
        state["torch"] = torch.get_rng_state().numpy().tobytes()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = [generator.numpy().tobytes() for generator in torch.cuda.get_rng_state_all()]
    return state


def set_random_state(state):
    """Put back what :func:`random_state` saved (importing numpy and torch where it holds their state)."""
    import random

    random.setstate(state["random"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
    if "torch" in state:
        import torch

        torch.set_rng_state(torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8))
        if "cuda" in state and torch.cuda.is_available():
            devices = torch.cuda.device_count()
            torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(raw), dtype=torch.uint8)
                                          for raw in state["cuda"][:devices]])


# what a fresh world makes anew rather than restores: it belongs to the world that died (pickled, a DDP
# wrapper would come back without its process group, and fail the whole restore)
MADE_ANEW = {
    "DistributedDataParallel": "a DDP wrapper: run the cell that wrapped the model again (the model under it "
                               "is kept where a name holds it)",
    "ProcessGroup": "a process group: run the cell that made it again (mpinb.torch.init_process_group())",
    **dict.fromkeys(("Intracomm", "Intercomm", "Cartcomm", "Graphcomm", "Distgraphcomm", "Topocomm"),
                    "a communicator made in a cell (comm.Split, comm.Dup, Create_cart...) of the world that died: "
                    "run the cell that made it again"),
    "Request": "an MPI request of the world that died", "Win": "an MPI window of the world that died",
    "File": "an MPI file of the world that died",
}


def _made_anew(obj):
    for kind in type(obj).__mro__:  # mpinb's traced communicators are subclasses of mpi4py's
        why = MADE_ANEW.get(kind.__name__)
        if why is not None and kind.__module__.startswith(("torch", "mpi4py")):
            return why
    return None


def _torch():
    import sys

    return sys.modules.get("torch")


class Cancelled(Exception):
    """A cell arrived while a snapshot was being taken: it is dropped, the cell runs at once."""


class Snapshots:
    """Takes this rank's snapshots on a thread of its own, :data:`IDLE` seconds after a cell ended well, when no
    other cell came meanwhile: a cell that arrives first cancels it (at the next object pickled or the next 8 MB
    written) and runs at once, unless the last snapshot is older than :data:`LAG` seconds (then the cell waits for
    this one). A restart uses the last cell every rank finished and has a snapshot of; which cells have one,
    every rank says then (:func:`available`)."""

    def __init__(self, directory, rank):
        self.root = os.path.join(directory, f"rank-{rank}")
        self.blobs = os.path.join(self.root, "blobs")
        for path in (directory, self.root, self.blobs):
            _private_directory(path)
        self.rank = rank
        self.limit = int(os.environ.get(LIMIT_ENV, DEFAULT_LIMIT))
        self.idle = float(os.environ.get(IDLE_ENV, IDLE))
        self.lag = float(os.environ.get(LAG_ENV, LAG))
        # when the last snapshot was taken: never yet, so the first cell that comes before one is taken waits for
        # it (a notebook run top to bottom by nbclient or papermill, a cell at once after the other, keeps state)
        self.taken_at = -math.inf
        self.last = None  # what the last snapshot said: (cell, kept, not kept, bytes written, seconds)
        self.refused = {}  # name -> (id of the value, why): a value that would not pickle, not tried again
        self.pickler = None
        self.phases = {}  # seconds the last snapshot spent pickling, hashing, writing, forgetting old ones
        self.complete = None  # the last cell every rank finished, as the notebook last said
        self.manifests = {}  # cell -> the buffers (hashes) its snapshot names
        self.lock = threading.Condition()
        self.pending = None  # (cell, namespace items) to take once the rank was idle long enough
        self.namespace = None  # the namespace those items are of (its functions' globals)
        self.due = None
        self.busy = False  # a snapshot is being taken
        self.asleep = False  # the thread waits with nothing pending (a new snapshot must wake it)
        self.cancel = False
        self.on_taken = None  # called with a cell's id once its snapshot is written (the agent tells the notebook)
        self.thread = threading.Thread(target=self._run, name="mpinb-snapshots", daemon=True)
        self.thread.start()

    def after_cell(self, cell, namespace):
        """Keep *namespace* as of the end of cell *cell*, once the rank was idle for :attr:`idle` seconds."""
        items = {name: value for name, value in namespace.items() if not _hidden(name)}
        with self.lock:
            self.namespace = namespace
            self.pending, self.due, self.cancel = (cell, items), time.monotonic() + self.idle, False
            if self.asleep:  # else it wakes at an earlier due time, and waits on for this one: no wake-up per cell
                self.lock.notify()

    def wait(self):
        """A cell is about to run: no snapshot may read the namespace while it does. While the last snapshot
        taken is younger than :attr:`lag` seconds, a pending one is dropped and a running one stopped; older, the
        cell waits for the pending one to be taken (so a crash loses at most that much of a rank's work, also
        when cells follow each other with no pause)."""
        with self.lock:
            if self.pending is None and not self.busy:
                return
            if time.monotonic() - self.taken_at >= self.lag:
                self.due = 0.0
                self.lock.notify_all()
                while self.pending is not None or self.busy:
                    self.lock.wait()
                return
            self.pending = None  # the thread, woken at its due time, finds nothing to do
            if self.busy:
                self.cancel = True
                while self.busy:
                    self.lock.wait()
            self.cancel = False

    def settle(self, timeout=30.0):
        """Wait until the pending snapshot is taken (for tests and benchmarks: a restart only uses those taken)."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while (self.pending is not None or self.busy) and time.monotonic() < deadline:
                self.lock.wait(0.05)

    def _run(self):
        while True:
            with self.lock:
                while self.pending is None or time.monotonic() < self.due:
                    self.asleep = self.pending is None
                    self.lock.wait(None if self.asleep else max(0.0, self.due - time.monotonic()))
                    self.asleep = False
                (cell, items), self.pending, self.busy = self.pending, None, True
            try:
                self.last = self.take(cell, items)
                self.taken_at = time.monotonic()
                if self.on_taken is not None:
                    self.on_taken(cell)
            except Cancelled:
                pass
            except Exception as exc:  # noqa: BLE001 - a snapshot that failed must never fail the rank's next cell
                self.last = (cell, [], {"*": f"the snapshot failed: {type(exc).__name__}: {exc}"}, 0, 0.0)
            finally:
                del items
                with self.lock:
                    self.busy = False
                    self.lock.notify_all()

    def _check(self):
        if self.cancel:
            raise Cancelled

    def take(self, cell, items):
        """Write the snapshot of cell *cell*; returns ``(cell, kept names, {name: why not kept}, bytes, s)``."""
        tic = time.perf_counter()
        not_kept = {}
        for name in list(items):
            size = getattr(items[name], "nbytes", 0)
            if isinstance(size, int) and size > self.limit:
                not_kept[name] = (f"{size_text(size)}, over the snapshot limit of {size_text(self.limit)}: "
                                  "%config MPIMagics.snapshot_limit")
                del items[name]
                continue
            refused = self.refused.get(name)
            if refused is not None and refused[0] == id(items[name]):
                not_kept[name] = refused[1]
                del items[name]
        while True:
            try:
                header, buffers = self._pickle(items)
                break
            except Cancelled:
                raise
            except Exception:  # noqa: BLE001 - find which names do not pickle, list them, keep the rest
                for name in list(items):
                    try:
                        self._pickle({name: items[name]})
                    except Cancelled:
                        raise
                    except Exception as exc:  # noqa: BLE001
                        why = _why(items[name], exc)
                        not_kept[name] = why
                        self.refused[name] = (id(items[name]), why)
                        del items[name]
        hashes, written, hashing = [], 0, 0.0
        pickled = time.perf_counter()
        self._forget_old(room=1)  # the oldest goes before this one is written: the disk holds KEEP at most
        for buffer in buffers:
            self._check()
            view = buffer.raw()
            started = time.perf_counter()
            digest = xxhash.xxh3_128_hexdigest(view)
            hashing += time.perf_counter() - started
            hashes.append(digest)
            path = os.path.join(self.blobs, digest)
            if not os.path.exists(path):
                _write(path, view, self._check)
                written += view.nbytes
        self._check()
        # no cell runs while a snapshot is taken (wait() cancels it or waits): the generators are as the cell left
        manifest = pickle.dumps({"cell": cell, "names": sorted(items), "not_kept": not_kept, "header": header,
                                 "buffers": hashes, RANDOM_STATE: random_state()}, protocol=pickle.HIGHEST_PROTOCOL)
        _write(os.path.join(self.root, f"cell-{cell:08d}"), manifest)
        written += len(manifest)
        self.manifests[cell] = hashes
        self._forget_old()
        self.phases = {"pickle": pickled - tic, "hash": hashing, "write": time.perf_counter() - pickled - hashing}
        return cell, sorted(items), not_kept, written, time.perf_counter() - tic

    def _pickle(self, items):
        if self.pickler is None:
            self.pickler = _pickler_class()
        buffers, out = [], io.BytesIO()
        pickler = self.pickler(out, protocol=5, buffer_callback=buffers.append)
        pickler.check = self._check
        if self.namespace is not None:
            pickler.namespace, pickler.world = self.namespace, _world_objects(self.namespace)
        pickler.dump(items)
        return out.getvalue(), buffers

    def _forget_old(self, room=0):
        """Keep the last :data:`KEEP` snapshots (less *room*, for the one about to be written) and the one of the
        last cell every rank finished (the notebook says which: ``complete``), and the buffers they name."""
        cells = sorted(self.manifests)
        kept = set(cells[len(cells) - (KEEP - room):]) | ({self.complete} & set(cells))
        for cell in cells:
            if cell not in kept:
                os.unlink(os.path.join(self.root, f"cell-{cell:08d}"))
                del self.manifests[cell]
        wanted = set().union(*self.manifests.values())
        for name in os.listdir(self.blobs):
            if name not in wanted and not name.startswith(".mpinb-"):
                os.unlink(os.path.join(self.blobs, name))


def _private_directory(path):
    """Make *path* a directory only this user may enter, or check that it is one (another user could have
    made it first on a shared host)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    if not files.private_directory(path):
        raise PermissionError(f"{path} is not a private directory of this user's: snapshots are not kept there")


def _why(value, exc):
    if isinstance(exc, pickle.PicklingError) and str(exc) in MADE_ANEW.values():
        return str(exc) if _made_anew(value) else f"it holds {exc}"
    kind = type(value).__name__
    return f"a {kind} does not pickle ({type(exc).__name__}: {str(exc)[:120]})"


CHUNK = 8 << 20  # bytes written between looks at whether a cell arrived


def _write(path, data, check=None):
    """Write *data* to *path* whole or not at all (a fresh file, renamed once written); *check* is called
    between chunks (it raises to give up)."""
    view = memoryview(data).cast("B")

    def write(file):
        for start in range(0, max(1, view.nbytes), CHUNK):
            if check is not None:
                check()
            file.write(view[start:start + CHUNK])

    files.replace(path, write, mode="wb")


def changes_namespace(call):
    """Whether *call* (a ``Call`` of mpinb's own rank-side code) changes the rank's namespace as a cell does."""
    return call.module == __name__ and call.name == restore.__name__


def flush(timeout=30.0):
    """Write this rank's pending snapshot now, without its wait for idleness (a restart of a world that answers is
    about to stop it: the last cell every rank finished is kept); returns the cell of the last snapshot taken."""
    snapshots = current()
    if snapshots is None:
        return None
    with snapshots.lock:
        if snapshots.pending is not None:
            snapshots.due = 0.0
            snapshots.lock.notify_all()
    snapshots.settle(timeout)
    return snapshots.last[0] if snapshots.last else None


def available(directory, rank=None):
    """The cells this rank has a whole snapshot of under *directory* (a world's snapshot folder on this host)."""
    from .runner import user_namespace

    rank = user_namespace()["rank"] if rank is None else rank
    try:
        names = os.listdir(os.path.join(directory, f"rank-{rank}"))
    except FileNotFoundError:
        return []
    return sorted(int(name.removeprefix("cell-")) for name in names if name.startswith("cell-"))


def restore(directory, cell, rank=None, namespace=None):
    """Put the variables of *rank*'s snapshot of cell *cell* (under *directory*, a world's snapshot folder on this
    host) into *namespace* (the rank's, by default), and the global random generators' state; returns ``(names
    restored, {name: why not kept}, bytes read, seconds)``. Called on each rank of a fresh world by a restart.

    Nothing is unpickled unless *directory*, the rank's folder, its blobs' folder and every file read are this
    user's own, private and not reached through a link (another user of a shared host could have planted them)."""
    global _loading_into
    from .runner import user_namespace

    namespace = user_namespace() if namespace is None else namespace
    rank = namespace["rank"] if rank is None else rank
    tic = time.perf_counter()
    root = os.path.join(directory, f"rank-{rank}")
    blobs = os.path.join(root, "blobs")
    path = os.path.join(root, f"cell-{cell:08d}")
    if not os.path.lexists(path):
        raise FileNotFoundError(f"no snapshot of cell {cell} on this host ({path})")
    for folder in (directory, root, blobs):
        if not files.private_directory(folder):
            raise PermissionError(f"{folder} is not a private directory of this user's: its snapshot is not read")
    manifest = pickle.loads(_read_own(path))
    buffers = [_read_own(os.path.join(blobs, digest)) for digest in manifest["buffers"]]
    read = sum(len(data) for data in buffers)
    builtins = namespace.get("__builtins__")
    _loading_into = namespace
    try:
        values = pickle.loads(manifest["header"], buffers=buffers)
    finally:
        _loading_into = None
        if builtins is not None:  # a function's restore sets its globals' __builtins__ to the builtins' dict
            namespace["__builtins__"] = builtins
    namespace.update(values)
    if RANDOM_STATE in manifest:
        set_random_state(manifest[RANDOM_STATE])
    return manifest["names"], manifest["not_kept"], read, time.perf_counter() - tic


def _read_own(path):
    """The bytes of *path*, a regular file of this user's that no one else may write, never through a link."""
    fd = files.open_own(path, os.O_RDONLY)
    with open(fd, "rb") as file:
        status = os.fstat(file.fileno())
        if status.st_mode & 0o022:
            raise PermissionError(f"{path} may be written by other users: its snapshot is not read")
        data = bytearray(status.st_size)
        file.readinto(data)
    return data
