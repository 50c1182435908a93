"""Taking a rank's snapshots: on a thread of its own, once the rank was idle after a cell, the changed buffers
written once under their content hash, the last few kept."""

import io
import math
import os
import pickle
import threading
import time

import xxhash

from ...wire import files
from ..who.text import size_text
from .pickling import RANDOM_STATE, hidden, pickler_class, random_state, why_not_kept, world_objects

KEEP = 3  # snapshots of the last cells kept (the last one every rank finished is among them)
LIMIT_ENV = "MPINB_SNAPSHOT_LIMIT"  # bytes one name may take, at most (else it is listed as not kept)
DEFAULT_LIMIT = 1 << 30
IDLE_ENV = "MPINB_SNAPSHOT_IDLE"  # seconds a rank waits after a cell before its snapshot
IDLE = 0.2
LAG_ENV = "MPINB_SNAPSHOT_LAG"  # seconds of a rank's work a crash may lose at most (see Snapshots.wait)
LAG = 10.0
DIRECTORY_ENV = "MPINB_SNAPSHOT_DIR"
# names a world defines itself on every rank, made again by the next one

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
            private_directory(path)
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
        items = {name: value for name, value in namespace.items() if not hidden(name)}
        with self.lock:
            self.namespace = namespace
            self.pending, self.due, self.cancel = (cell, items), time.monotonic() + self.idle, False
            if self.asleep:  # else it wakes at an earlier due time, and waits on for this one: no wake-up per cell
                self.lock.notify()

    def wait(self, *, due=False):
        """A cell is about to run: no snapshot may read the namespace while it does. While the last snapshot
        taken is younger than :attr:`lag` seconds, a pending one is dropped and a running one stopped; older, or
        when the notebook says it is *due* (for every rank at once), the cell waits for the pending one to be
        taken (so a crash loses at most that much of a rank's work, also when cells follow each other with no
        pause)."""
        with self.lock:
            if self.pending is None and not self.busy:
                return
            if due or time.monotonic() - self.taken_at >= self.lag:
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
                        why = why_not_kept(items[name], exc)
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
            self.pickler = pickler_class()
        buffers, out = [], io.BytesIO()
        pickler = self.pickler(out, protocol=5, buffer_callback=buffers.append)
        pickler.check = self._check
        if self.namespace is not None:
            pickler.namespace, pickler.world = self.namespace, world_objects(self.namespace)
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


def private_directory(path):
    """Make *path* a directory only this user may enter, or check that it is one (another user could have
    made it first on a shared host)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    if not files.private_directory(path):
        raise PermissionError(f"{path} is not a private directory of this user's: snapshots are not kept there")


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
