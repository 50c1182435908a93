"""Every rank's variables across a death: the folders the ranks keep their snapshots in (``rank/snapshots/``),
one per start of a world, which cells every rank finished, and the restore after ``%mpi restart``.

A world's snapshot folder is private (0700) and made here for the ranks on this host (a rank on another host
makes the same path on its own). A restart keeps the folder of the world that died until the fresh world has
read it; ``%mpi stop`` and the kernel's exit remove them all, and so does the world's reaper (``reaper.py``) when
the kernel is killed, also once the world itself has ended (its reaper is then kept here, watching the kernel).
"""

import atexit
import math
import os
import shutil
import tempfile
import time

from ...wire.kinds import Kept
from ...wire.ranks import label_ranks


_roots = set()  # every snapshot folder this kernel made, removed at its exit whatever became of the worlds


@atexit.register
def _remove_all():
    for root in list(_roots):
        shutil.rmtree(root, ignore_errors=True)


class KeptState:
    """The snapshot folders of one :class:`~mpinb.notebook.world.cluster.World` across its starts."""

    def __init__(self):
        self.enabled = True
        self.limit = None  # bytes one name may take (the ranks' default when None)
        self.lag = None  # seconds of a rank's work a crash may lose at most (the ranks' default when None)
        self.root = None
        self.generation = 0
        self.complete = []  # cells (ids) of the current start that every rank finished, with their numbers
        self.previous = []  # those of the start a restart restores (source), until it is restored or dropped
        self.source = None  # that start's generation: the last one in which every rank finished a cell
        self.sizes = {}  # start -> its number of ranks
        self.taken = {}  # rank -> the last cell of the current start whose snapshot it wrote
        self.common = 0  # the last cell every rank of the current start wrote a snapshot of
        self.common_at = -math.inf  # when the notebook learnt it (time.monotonic())
        self._came_up = True  # whether the start of the current generation came up (none yet: nothing pending)
        self._watcher = None  # an ended world's reaper, which removes root if the kernel is killed

    def configure(self, enabled, *, limit=None, lag=None):
        """Whether the ranks of the next start snapshot their variables (for a restart after a death), and how."""
        self.enabled, self.limit, self.lag = enabled, limit, lag

    def environment(self, size):
        """The ranks' environment for the next start, of *size* ranks: where they keep snapshots (nothing when
        off). A start that follows one that never came up (it failed, or was stopped: a retry) keeps that one's
        generation, so the world before both is still the one restored."""
        if self._came_up:
            if self.complete:  # else the start before finished no cell (its restore was stopped): its own is kept
                if self.source is not None and self.root is not None:
                    shutil.rmtree(self.folder(self.source), ignore_errors=True)
                self.previous, self.source = self.complete, self.generation
            self.generation += 1
            self.complete, self.taken, self.common, self.common_at = [], {}, 0, -math.inf
        self._came_up = False
        self.sizes[self.generation] = size
        if not self.enabled:
            return {}
        if self.root is None:
            self.root = tempfile.mkdtemp(prefix="mpinb-snapshots-")
            _roots.add(self.root)
        path = self.folder(self.generation)
        os.makedirs(path, mode=0o700, exist_ok=True)
        environment = {"MPINB_SNAPSHOT_DIR": path}
        if self.limit is not None:
            environment["MPINB_SNAPSHOT_LIMIT"] = str(int(self.limit))
        if self.lag is not None:
            environment["MPINB_SNAPSHOT_LAG"] = repr(float(self.lag))
        return environment

    def holds(self):
        """Whether a restart may restore something: cells of this start or of the one before were kept."""
        return self.root is not None and bool(self.complete or self.previous)

    def adopt(self, reaper):
        """Keep the reaper of a world that ended (its processes are gone): it removes :attr:`root` if the kernel is
        killed before the next start's reaper takes over (:meth:`release`) or :meth:`forget` removes it."""
        if self._watcher is not None and self._watcher is not reaper:
            self._watcher.kill()
            self._watcher.wait(timeout=5)
        self._watcher = reaper

    def release(self):
        """The reaper kept by :meth:`adopt` (``None`` if none), for the next start's reaper to replace."""
        watcher, self._watcher = self._watcher, None
        return watcher

    def came_up(self):
        """The start made with the last :meth:`environment` has every rank running."""
        self._came_up = True

    def folder(self, generation):
        return os.path.join(self.root, f"start-{generation}")

    def finished(self, cell_id, number):
        """Cell *cell_id* (``In[number]``) ended well on every rank."""
        self.complete = [*self.complete[-63:], (cell_id, number)]

    @property
    def last_complete(self):
        return self.complete[-1][0] if self.complete else None

    def note_taken(self, rank, cell_id):
        """*rank* wrote its snapshot of cell *cell_id* (a ``Kept`` message)."""
        self.taken[rank] = max(self.taken.get(rank, 0), cell_id)
        size = self.sizes.get(self.generation)
        if size and len(self.taken) == size and min(self.taken.values()) > self.common:
            self.common, self.common_at = min(self.taken.values()), time.monotonic()

    def snapshot_due(self, lag):
        """Whether the next cell waits for every rank's pending snapshot: the last cell every rank kept is *lag*
        seconds old or more. Each rank also keeps its own clock; deciding here for all of them at once makes them
        keep the same cell, which a restore needs (on their own clocks, ranks of a world running cell after cell
        kept different cells, and a death lost every cell since the last one they had in common)."""
        return self.enabled and time.monotonic() - self.common_at >= lag

    def wait_until_kept(self, channel, ranks, timeout=10.0):
        """With ``snapshot_lag = 0`` (nothing of a finished cell may be lost), wait up to *timeout* seconds until
        every one of *ranks* wrote its snapshot of the last cell every rank finished. Each rank's next cell waits
        for its own snapshot anyway; this makes a rank that fails at once (``MPI_Abort`` ends every rank) wait
        for the others' too. What else arrives meanwhile is kept for the cell."""
        cell = self.last_complete
        if not self.enabled or self.lag != 0 or cell is None:
            return
        deadline = time.monotonic() + timeout
        while any(self.taken.get(rank, 0) < cell for rank in ranks) and time.monotonic() < deadline:
            for message in channel.receive(0.05, keep=False):
                if isinstance(message, Kept):
                    self.note_taken(message.rank, message.cell_id)
                else:
                    channel.hold(message)

    def forget(self):
        """Remove every snapshot (the world is stopped for good)."""
        root, self.root, self.complete, self.previous, self.source = self.root, None, [], [], None
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.kill()
            watcher.wait(timeout=5)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
            _roots.discard(root)

    def drop_previous(self):
        """The world before is restored, or will not be: its folder goes."""
        if self.root is not None and self.source is not None:
            shutil.rmtree(self.folder(self.source), ignore_errors=True)
        self.previous, self.source = [], None


def restore(world, on_ranks, fresh=False):
    """After a world was started again (``%mpi restart``, or by mpinb itself): put back every rank's variables as
    of the last cell every rank finished and kept, and say what was restored and what was not (lines to print). *on_ranks(function, *args)* calls a
    rank-side function on every rank (``WorldCommands._on_ranks``)."""
    from ...rank import snapshots

    kept = world.kept_state
    previous = kept.previous
    if fresh or not kept.enabled or not previous or kept.root is None or kept.source is None:
        kept.drop_previous()
        return []
    folder = kept.folder(kept.source)
    size = kept.sizes.get(kept.source, world.size)
    if size != world.size:
        kept.drop_previous()
        return [f"[mpinb] the world before had {size} ranks and this one has {world.size}: its variables were "
                f"not restored (%mpi restart -n {size} restores them)"]
    held = on_ranks(snapshots.available, folder)
    common = set.intersection(*(set(cells) for cells in held.values.values())) \
        if len(held.values) == world.size else set()
    usable = [(cell, number) for cell, number in previous if cell in common]
    if not usable:
        kept.drop_previous()
        return ["[mpinb] no cell every rank finished has a snapshot on every rank (a rank takes one when it has "
                "been idle for a moment after a cell): the variables of the world before are lost"]
    cell, number = usable[-1]
    result = on_ranks(snapshots.restore, folder, cell)
    if not result.errors:  # the fresh world's own first snapshot holds them: a second death loses nothing either
        kept.finished(result.cell_id, number)
    lines = []
    if result.errors:
        failed = sorted(result.errors)
        lines.append(f"[mpinb] could not restore the variables of {label_ranks(failed)}: "
                     f"{result.errors[failed[0]]['evalue']}")
    restored = {rank: value for rank, value in result.values.items()}
    if restored:
        names = sorted(set().union(*(set(value[0]) for value in restored.values())))
        not_kept = {}
        for value in restored.values():
            not_kept.update(value[1])
        size_read = max(value[2] for value in restored.values())
        seconds = max(value[3] for value in restored.values())
        every = "every rank's" if len(restored) == world.size else f"{label_ranks(sorted(restored))}'s"
        lines.append(f"[mpinb] restored {every} variables as of In[{number}], the last cell every rank finished "
                     f"and kept: {', '.join(names) or 'none'} ({_size(size_read)} per rank at most, restored in "
                     f"{seconds:.2f} s)")
        if not_kept:
            lines.append("[mpinb] not kept, so not restored: " + "; ".join(
                f"{name} ({why})" for name, why in sorted(not_kept.items())) +
                ". Run the cells that made them again (a process group, a DDP model, a communicator, a lock or an "
                "open file is made anew, not saved)")
    kept.drop_previous()
    return lines


def _size(nbytes):
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"
