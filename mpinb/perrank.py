"""``PerRank``: a mapping rank → value, the shape every per-rank answer takes in the notebook."""


class PerRank(dict):
    """A ``dict`` from MPI rank to that rank's value, shown one ``[rank R]`` line per rank."""

    @property
    def ranks(self):
        return sorted(self)

    def __repr__(self):
        lines = []
        for rank in self.ranks:
            text = repr(self[rank])
            lines.append(f"[rank {rank}] " + text.replace("\n", "\n" + " " * (len(str(rank)) + 8)))
        return "\n".join(lines) if lines else "PerRank({})"

    def _repr_pretty_(self, printer, cycle):
        printer.text("PerRank(...)" if cycle else repr(self))
