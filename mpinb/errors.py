"""The exceptions users see: one error for a cell, naming every failing rank, rendered like IPython's."""

from .ranks import label_ranks


class MPIError(Exception):
    """Something about the MPI world itself went wrong (start, stop, a rank that vanished)."""


class RankError(Exception):
    """A cell raised on one or more ranks.

    ``failures`` maps each failing rank to ``{"ename", "evalue", "traceback"}``; identical failures are shown
    once with the list of ranks. ``size`` is the number of ranks the cell ran on.
    """

    SECONDARY = ("Timeout", "Aborted", "KeyboardInterrupt", "RankLost")  # shown after the real exceptions

    def __init__(self, failures, ranks, notes=()):
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
        return sorted(merged.values(), key=lambda group: group[1]["ename"] in self.SECONDARY)

    def summary(self):
        failed = list(self.failures)
        head = f"cell failed on {label_ranks(failed)} ({len(failed)} of {len(self.ranks)} ran it)"
        lines = [f"{label_ranks(ranks)}: {f['ename']}: {f['evalue']}" for ranks, f in self.groups]
        return head + "\n" + "\n".join(lines + self.notes)

    def _render_traceback_(self):
        out = []
        for ranks, failure in self.groups:
            out.append(f"\x1b[1;31m[{label_ranks(ranks)}]\x1b[0m {failure['ename']}: {failure['evalue']}")
            out.extend(failure["traceback"])
            out.append("")
        out.append(f"RankError: {self.summary()}")
        return out


class GatherError(Exception):
    """``--gather`` could not bring a name back from some ranks; the message names the ranks and the reason,
    and the values of the other ranks are already in the notebook."""

    def _render_traceback_(self):
        return [f"GatherError: {self}"]
