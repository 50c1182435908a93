"""Models meant to be the same on every rank, and a fingerprint of each after a cell, to catch replicas drifting.

A DistributedDataParallel model, and a model given to ``mpinb.torch``'s data-parallel helpers
(``broadcast_parameters``, ``allreduce_gradients``, ``GradientAllreducer``, ``DistributedOptimizer``), is a replica:
after each cell its parameters and buffers must be bit for bit those of every other rank. A rank that skipped the
gradient allreduce, parameters never broadcast, a step taken on one rank only, or BatchNorm's running statistics
computed from each rank's own batch make them differ; the notebook compares the fingerprints (``notebook/
replicas.py``) and says which tensors differ on which ranks.

A fingerprint is the sum of a tensor's bits read as integers (wrapping, so exact and independent of the order
of summation or the number of threads): one pass over the model's memory, on its device, per cell.
"""

import weakref

LIMIT = 1 << 26  # elements: larger models are not fingerprinted after every cell (a pass over 256 MB or more)
watched = weakref.WeakSet()


def watch(model):
    """Check *model* (an ``nn.Module``, or a DDP model: its module is checked) after each cell from now on."""
    inner = getattr(model, "module", model)
    try:
        watched.add(inner)
    except TypeError:  # not a module: nothing to watch
        pass


def fingerprints(namespace):
    """``{label: {"params": {name: int}, "buffers": {name: int}, "batchnorm": bool}}`` of the watched models,
    labelled by the name the user's *namespace* gives each (or its type); ``{}`` when none are watched."""
    models = list(watched)
    if not models:
        return {}
    import torch

    names = {}
    for name, value in list(namespace.items()):
        if not name.startswith("_"):
            inner = getattr(value, "module", value)
            if isinstance(inner, torch.nn.Module):
                names.setdefault(id(inner), name)
    out = {}
    for model in models:
        tensors = list(model.named_parameters()) + list(model.named_buffers())
        if sum(tensor.numel() for _, tensor in tensors) > LIMIT:
            continue
        label = names.get(id(model))
        if label is None:
            continue  # no longer the user's: nobody to tell
        with torch.no_grad():
            params = {name: _bits(tensor) for name, tensor in model.named_parameters()}
            buffers = {name: _bits(tensor) for name, tensor in model.named_buffers()}
        batchnorm = any(isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and
                        not isinstance(module, torch.nn.SyncBatchNorm) for module in model.modules())
        out[label] = {"params": params, "buffers": buffers, "batchnorm": batchnorm}
    return out


_VIEWS = {8: "int64", 4: "int32", 2: "int16", 1: "uint8"}


def _bits(tensor):
    import torch

    flat = tensor.detach().contiguous().reshape(-1)
    view = flat.view(getattr(torch, _VIEWS.get(flat.element_size(), "uint8")))
    return int(view.sum(dtype=torch.int64))
