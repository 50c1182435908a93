"""What the data-parallel calls take, checked on each rank before the ranks agree: the root (``root`` or
Horovod's ``root_rank``), the parameters in each form ``broadcast_parameters`` takes, the optimizer of
``broadcast_optimizer_state``, the communicator. The checks return a problem rather than raise it, so that
every rank raises it together once the ranks agree (``agreement.py``)."""

import operator
from collections.abc import Mapping

import torch


class _DefaultRoot(int):
    """The default ``root=0`` (shown as 0), told apart from an explicit one so that ``root_rank=1`` can replace it
    while ``root=0, root_rank=1`` is an error."""


ROOT = _DefaultRoot(0)  # the calls' default root


def world(comm):
    """*comm*, or ``MPI.COMM_WORLD`` for ``None``."""
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    return comm


def root_of(root, root_rank, comm):
    """``(root, None)`` from a broadcast's *root* and *root_rank*, or ``(None, problem)``."""
    name = "root"
    if root_rank is not None:
        if root is not ROOT and root != root_rank:
            return None, ValueError(f"root={root!r} and root_rank={root_rank!r} disagree: give one of them "
                                    "(root_rank is Horovod's name for root)")
        root, name = root_rank, "root_rank"
    try:
        root = operator.index(root)
    except TypeError:
        return None, TypeError(f"{name} must be a rank (an int), not {_a(root)}")
    if not 0 <= root < comm.size:
        from ...wire.ranks import label_ranks

        return None, ValueError(f"{name}={root} is not a rank of comm ({label_ranks(range(comm.size))})")
    return root, None


_PARAMS = ("a torch.nn.Module, a dict of tensors (a state_dict), or an iterable of tensors or of (name, tensor) "
           "pairs such as model.named_parameters()")


def named_tensors(params):
    """``([(name, tensor)], None)`` for what ``broadcast_parameters`` takes, or ``([], problem)``."""
    if isinstance(params, torch.Tensor):
        return [("tensor", params)], None
    if isinstance(params, torch.nn.Module):
        return list(params.named_parameters()) + list(params.named_buffers()), None
    # an optimizer, or one wrapped (mpinb.torch.DistributedOptimizer, Lightning's LightningOptimizer)
    if any(isinstance(each, torch.optim.Optimizer) for each in (params, getattr(params, "optimizer", None))):
        return [], TypeError(f"params must be {_PARAMS}, not an optimizer; for an optimizer's state use "
                             "broadcast_optimizer_state(optimizer)")
    if isinstance(params, Mapping):
        named = sorted(((str(key), value) for key, value in params.items()), key=lambda item: item[0])
        wrong = [(name, value) for name, value in named if not isinstance(value, torch.Tensor)]
        if wrong:
            listed = ", ".join(f"params[{name!r}] is {_a(value)}" for name, value in wrong[:3])
            more = f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""
            return [], TypeError(
                f"{listed}{more}, not a tensor: broadcast_parameters copies root's tensors into every rank's in "
                "place, which only tensors can take. Pass the model itself (parameters and buffers), or leave such "
                "entries out ({k: v for k, v in params.items() if torch.is_tensor(v)}) and send them with "
                "comm.bcast(obj, root=...)")
        return named, None
    try:
        items = list(params)
    except TypeError:
        return [], TypeError(f"params must be {_PARAMS}, not {_a(params)}")
    named = []
    for i, item in enumerate(items):
        if isinstance(item, torch.Tensor):
            named.append((str(i), item))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor):
            named.append((str(item[0]), item[1]))
        else:
            return [], TypeError(f"item {i} of params is {_a(item)}, not a tensor or a (name, tensor) pair; "
                                 f"params must be {_PARAMS}")
    return named, None


def not_an_optimizer(optimizer):
    """Why *optimizer*, not a ``torch.optim.Optimizer``, cannot have its state broadcast (a ``TypeError``)."""
    return TypeError(
        f"optimizer must be a torch.optim.Optimizer (or an mpinb.torch.DistributedOptimizer), not "
        f"{_a(optimizer)}; pass the optimizer itself, e.g. torch.optim.Adam(model.parameters())"
        + ("; for a model's weights use broadcast_parameters(model)" if isinstance(optimizer, torch.nn.Module)
           else ""))


def _a(value):
    """``"an int"``, ``"a str"``: what *value* is, for messages."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def parameters_of(model):
    """``[(name, tensor)]`` of *model*: a module's parameters, or an iterable of tensors or of such pairs."""
    if hasattr(model, "named_parameters"):
        return list(model.named_parameters())
    items = list(model)
    if items and isinstance(items[0], tuple):
        return items
    return [(str(i), tensor) for i, tensor in enumerate(items)]
