"""``%mpi grads model``, rank side: per layer, this rank's gradient and parameter statistics and how far they are
from rank 0's. Collective: every rank of the communicator calls it, and only statistics leave the rank.
"""

import numpy as np

from ..wire.array_stats import HISTOGRAM_BINS
from ..wire.ranks import label_ranks


class NotComparable(ValueError):
    """The model cannot be compared across ranks (missing on some, not a module, shaped differently); the message
    names the ranks and the cause, the same on every rank."""


def grad_stats(name, *, namespace=None, comm=None):
    """Statistics of the ``torch.nn.Module`` called *name* (``model`` or ``trainer.model``) on this rank.

    Returns ``{layer: {"kind", "shape", "norm", "grad_norm", "diff", "grad_diff", "scale", "grad_scale", "nan",
    "grad_nan", "inf", "grad_inf", "grad_histogram"}}`` where ``diff``/``grad_diff`` are the max absolute
    difference of this rank's parameter (or buffer) and gradient to rank 0's where both are finite (NaN where only
    one of them is not), ``scale``/``grad_scale`` rank 0's max absolute finite value and ``nan``/``inf`` this
    rank's counts of NaN and Inf. Raises
    :class:`NotComparable` on every rank, naming the ranks, when some rank lacks the model or holds a different one.
    """
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    if namespace is None:
        from .runner import user_namespace

        namespace = user_namespace()
    problem, tensors = None, []
    try:
        tensors = _tensors(_resolve(name, namespace), name)
    except (NameError, TypeError) as exc:
        problem = str(exc)
    signature = [(layer, kind, tuple(t.shape), grad is not None) for layer, kind, t, grad in tensors]
    everyone = comm.allgather((problem, signature))
    failed = {}
    for rank, (p, _) in enumerate(everyone):
        if p:
            failed.setdefault(p, []).append(rank)
    if failed:
        raise NotComparable("; ".join(f"{label_ranks(ranks)}: {p}" for p, ranks in failed.items()))
    odd = [rank for rank, (_, s) in enumerate(everyone) if s != everyone[0][1]]
    if odd:
        raise NotComparable(f"{name} differs in structure from rank 0's on ranks {odd} (other layers, shapes, or "
                         "gradients present on some ranks only)")
    stats = {}
    for layer, kind, tensor, grad in tensors:
        row = {"kind": kind, "shape": tuple(tensor.shape)}
        row.update(_compare(_numpy(tensor), comm, ""))
        if grad is not None:
            values = _numpy(grad)
            row.update(_compare(values, comm, "grad_"))
            row["grad_histogram"] = _histogram(values)
        stats[layer] = row
    return stats


def _resolve(name, namespace):
    head, *rest = name.split(".")
    if head not in namespace:
        raise NameError(f"name {head!r} is not defined")
    value = namespace[head]
    for attribute in rest:
        value = getattr(value, attribute)
    return value


def _tensors(model, name):
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{name} is a {type(model).__name__}, not a torch.nn.Module")
    out = [(layer, "parameter", p, p.grad) for layer, p in model.named_parameters()]
    out += [(layer, "buffer", b, None) for layer, b in model.named_buffers() if b.is_floating_point()]
    return out


def _numpy(tensor):
    """A CPU numpy copy or view of *tensor* (bfloat16, which numpy lacks, as float32)."""
    tensor = tensor.detach().cpu()
    if str(tensor.dtype) == "torch.bfloat16":
        tensor = tensor.float()
    return tensor.contiguous().numpy()


def _compare(values, comm, prefix):
    """Norm, NaN and Inf counts, rank 0's scale, and the max |this − rank 0| of *values* (rank 0's copy comes by
    ``Bcast``). The difference is taken where both are finite; NaN where one holds a NaN or Inf the other lacks,
    so identical all-NaN tensors differ by 0, and a NaN is told apart from a different value by the counts."""
    reference = np.ascontiguousarray(values) if comm.rank == 0 else np.empty_like(values)
    comm.Bcast(reference, root=0)
    mine, theirs = values.astype(np.float64).ravel(), reference.astype(np.float64).ravel()
    finite, reference_finite = np.isfinite(mine), np.isfinite(theirs)
    both = finite & reference_finite
    with np.errstate(invalid="ignore", over="ignore"):
        difference = np.abs(mine[both] - theirs[both])
        diff = float(difference.max()) if difference.size else 0.0
        scale = float(np.abs(theirs[reference_finite]).max()) if reference_finite.any() else 0.0
        norm = float(np.linalg.norm(mine))
    odd = ~both & ~((mine == theirs) | (np.isnan(mine) & np.isnan(theirs)))  # non-finite in one place only
    if odd.any():
        diff = float("nan")
    nan = 0 if finite.all() else int(np.isnan(mine).sum())
    return {f"{prefix}norm": norm, f"{prefix}diff": diff, f"{prefix}scale": scale, f"{prefix}nan": nan,
            f"{prefix}inf": int((~finite).sum()) - nan}


def _histogram(values):
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return None
    low, high = float(finite.min()), float(finite.max())
    counts, edges = np.histogram(finite, bins=HISTOGRAM_BINS, range=(low, high) if high > low else None)
    return counts.tolist(), edges.tolist()
