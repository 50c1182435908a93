"""An optimizer's state for ``broadcast_optimizer_state``: its parameters as every rank must hold them, and root's
``state_dict`` broadcast as a pickled skeleton apart from its tensors, which travel as buffers."""

import pickle
from collections import OrderedDict

import torch


def optimizer_signature(optimizer):
    """What every rank's *optimizer* must agree on: each parameter's place in ``param_groups``, shape and dtype."""
    return [(f"param_groups[{g}][{i}]", tuple(p.shape), str(p.dtype), True)
            for g, group in enumerate(optimizer.param_groups) for i, p in enumerate(group["params"])]


def share_skeleton(comm, optimizer, root, what):
    """Root's ``state_dict`` with its tensors taken out, pickled once and broadcast: ``(skeleton, tensors)``, the
    tensors root's own on root and empty ones to receive them into elsewhere. Raises on every rank when root's
    state cannot be pickled."""
    if comm.rank == root:
        tensors = []
        skeleton = _without_tensors(optimizer.state_dict(), tensors)
        try:
            message = ("state", pickle.dumps((skeleton, [(tuple(t.shape), t.dtype) for t in tensors])))
        except Exception as error:  # tell the other ranks, which would otherwise wait in Bcast
            message = ("error", f"rank {root}'s optimizer state cannot be pickled: {type(error).__name__}: {error}")
        kind, payload = comm.bcast(message, root=root)
    else:
        kind, payload = comm.bcast(None, root=root)
        if kind == "state":
            skeleton, specs = pickle.loads(payload)
            tensors = [torch.empty(shape, dtype=dtype) for shape, dtype in specs]
    if kind == "error":
        raise TypeError(f"{what}: {payload}")
    return skeleton, tensors


class _Slot(int):
    """Stands for the state_dict tensor of this index in the pickled rest of an optimizer's state."""


def _without_tensors(value, tensors):
    """*value* with each tensor appended to *tensors* and replaced by its :class:`_Slot`."""
    if isinstance(value, torch.Tensor):
        tensors.append(value.detach())
        return _Slot(len(tensors) - 1)
    if type(value) in (dict, OrderedDict):
        return type(value)((key, _without_tensors(item, tensors)) for key, item in value.items())
    if type(value) in (list, tuple):
        return type(value)(_without_tensors(item, tensors) for item in value)
    return value  # anything else is pickled as it is


def with_tensors(value, tensors):
    if isinstance(value, _Slot):
        return tensors[value]
    if type(value) in (dict, OrderedDict):
        return type(value)((key, with_tensors(item, tensors)) for key, item in value.items())
    if type(value) in (list, tuple):
        return type(value)(with_tensors(item, tensors) for item in value)
    return value
