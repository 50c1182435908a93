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

    def stack(self):
        """Every rank's value stacked along a new first axis, in rank order.

        Tensors give a tensor (``torch.stack``), arrays and numbers a numpy array, dicts (a ``state_dict``,
        named gradients) a dict of stacks. Values of different shapes raise ``ValueError`` naming the ranks.
        """
        return _stack([self[rank] for rank in self.ranks], self.ranks)


def _stack(values, ranks):
    first = values[0]
    if isinstance(first, dict):
        keys = list(first)
        odd = [rank for rank, value in zip(ranks, values) if list(value) != keys]
        if odd:
            raise ValueError(f"cannot stack: ranks {odd} hold other keys than rank {ranks[0]}")
        return {key: _stack([value[key] for value in values], ranks) for key in keys}
    shapes = {rank: tuple(getattr(value, "shape", ())) for rank, value in zip(ranks, values)}
    if len(set(shapes.values())) > 1:
        raise ValueError("cannot stack values of different shapes: "
                         + ", ".join(f"rank {rank} {shape}" for rank, shape in shapes.items()))
    if type(first).__module__.startswith("torch"):
        import torch

        return torch.stack(values)
    import numpy as np

    return np.stack([np.asarray(value) for value in values])
