"""The exceptions users see: one error for a cell, naming every failing rank, rendered like IPython's."""

from .wire.failures import MPIError, MpinbError, fitted
from .wire.ranks import label_ranks

__all__ = ["MpinbError", "BadArguments", "NoMPI", "MPIError", "RankLost", "RankError", "Interrupted", "GatherError",
           "StartInterrupted"]


class BadArguments(MpinbError, ValueError):
    """What was asked cannot work as written: a size, a rank set, a launcher, a host file, a scheduler option."""


class NoMPI(MpinbError):
    """No usable MPI: no launcher, no library mpi4py can load, or a launcher and a library of different MPIs."""


class RankLost(MpinbError):
    """A rank died or went silent while a cell ran; a :class:`RankError` names it among the cell's failures,
    with this class's name, and says what the other ranks were doing."""


class RankError(MpinbError):
    """A cell raised on one or more ranks.

    ``failures`` maps each failing rank to ``{"ename", "evalue", "traceback"}``; identical failures are shown
    once with the list of ranks. ``ranks`` are the ranks the cell ran on; the failure of rank *first* (the one
    whose death ended the others) is shown first.
    """

    #: Failures listed after the others: ranks that timed out, were aborted, interrupted or lost, usually because of
    #: another rank's failure.
    SECONDARY = ("Timeout", "Aborted", "KeyboardInterrupt", RankLost.__name__)

    def __init__(self, failures, ranks, notes=(), *, what="failed", first=None):
        self.what, self.first = what, first
        self.failures = dict(sorted(failures.items()))
        self.ranks = list(ranks)
        self.notes = list(notes)
        super().__init__(self.summary())

    @property
    def groups(self):
        """``[(ranks, failure), ...]``: identical failures merged, in order of their first rank."""
        merged = {}
        for rank, failure in self.failures.items():
            key = (failure["ename"], failure["evalue"], tuple(failure["traceback"]))
            merged.setdefault(key, ([], failure))[0].append(rank)
        return sorted(merged.values(), key=lambda group: (self.first not in group[0],
                                                          group[1]["ename"] in self.SECONDARY))

    def summary(self):
        """The error's message: what happened (``cell failed on rank 1; rank 0 finished it``), then a line for
        each group of identical failures (``ranks 0-3: ZeroDivisionError: division by zero``), then the notes."""
        failed = list(self.failures)
        finished = [rank for rank in self.ranks if rank not in self.failures]
        if not finished:
            head = f"cell {self.what} on every rank it ran on ({label_ranks(failed)})" if len(failed) > 1 else \
                f"cell {self.what} on {label_ranks(failed)}, the only rank it ran on"
        else:
            head = f"cell {self.what} on {label_ranks(failed)}; {label_ranks(finished)} finished it"
        lines = [f"{label_ranks(ranks)}: {f['ename']}: {f['evalue']}" for ranks, f in self.groups]
        return head + "\n" + "\n".join(lines + self.notes)

    def _render_traceback_(self, *, name="RankError"):
        out = []
        for ranks, failure in self.groups:
            out.extend(fitted([f"\x1b[1;31m[{label_ranks(ranks)}]\x1b[0m {failure['ename']}: {failure['evalue']}"]))
            out.extend(failure["traceback"])  # as the rank's IPython wrote it
            out.append("")
        out.extend(fitted([f"{name}: {self.summary()}"]))
        return out


class Interrupted(KeyboardInterrupt):
    """The cell was stopped (the Stop button, Ctrl-C): a ``KeyboardInterrupt`` that shows, rank by rank, where
    each rank was (like :class:`RankError`) instead of the notebook's own frames."""

    def __init__(self, failures, ranks, notes=(), *, first=None):
        self.error = RankError(failures, ranks, notes=notes, what="interrupted", first=first)
        super().__init__(self.error.summary())

    def _render_traceback_(self):
        return self.error._render_traceback_(name="KeyboardInterrupt")


class GatherError(MpinbError):
    """``--gather`` could not bring a value back. On a rank: the value cannot be sent (its message names the
    type and what to do). In the notebook: some ranks' values are missing; the message names the ranks and the
    reason, and the values of the other ranks are already in the notebook."""

    def _render_traceback_(self):
        return fitted([f"GatherError: {self}"])


class StartInterrupted(KeyboardInterrupt):
    """A Stop ended a world's start at a safe point: what the start had launched is stopped (nothing is left
    running), and the message says so in one line instead of the frames the start was in."""

    def _render_traceback_(self):
        return fitted([f"\x1b[1;31mKeyboardInterrupt\x1b[0m: {self}"])
