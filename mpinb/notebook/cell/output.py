"""Rank-labelled output: stream lines as ``[rank R] ...`` while a cell runs, and show it rank by rank after."""

import sys

RED = "\x1b[31m"
RESET = "\x1b[0m"


class RankPrinter:
    """Prints complete lines from each rank's stdout and stderr, labelled by rank, as they arrive.

    stderr lines go to the notebook's stderr (Jupyter shows them on a red background); in a colour terminal
    their label is red as well. Partial lines wait for their newline or for :meth:`finish`.
    """

    def __init__(self, *, stdout=None, stderr=None, color=False):
        self.files = {"stdout": stdout or sys.stdout, "stderr": stderr or sys.stderr}
        self.color = color
        self._pending = {}

    def feed(self, rank, name, text):
        buffered = self._pending.pop((rank, name), "") + text
        *lines, rest = buffered.split("\n")
        if rest:
            self._pending[(rank, name)] = rest
        self._write(rank, name, lines)

    def finish(self):
        for (rank, name), rest in sorted(self._pending.items()):
            self._write(rank, name, [rest])
        self._pending.clear()

    def _write(self, rank, name, lines):
        if not lines:
            return
        label = f"[rank {rank}]"
        if self.color and name == "stderr":
            label = f"{RED}{label}{RESET}"
        stream = self.files[name]
        stream.write("".join(f"{label} {line}\n" for line in lines))
        stream.flush()


def rank_ordered(stdout, stderr, *, ranks):
    """One block per rank, in rank order: its stdout, then its stderr lines marked ``(stderr)``."""
    blocks = []
    for rank in ranks:
        lines = [f"--- rank {rank} ---"]
        lines += stdout.get(rank, "").splitlines()
        lines += [f"(stderr) {line}" for line in stderr.get(rank, "").splitlines()]
        blocks.append("\n".join(lines))
    return "\n".join(blocks)
