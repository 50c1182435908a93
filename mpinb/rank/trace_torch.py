"""``torch.distributed``'s collectives, seen like MPI's: each call is noted in the rank's ledger and, while
traced, as a span (kind ``"torch"``). The module's functions are wrapped in place once it is imported.
"""

import functools
import importlib.abc
import importlib.util
import sys

from . import tracing

_state = tracing.state
_now = tracing.now_ns
_done = False

# name: (position of the tensor that says count and dtype, root keyword, root position, point to point)
_CALLS = {
    "all_reduce": (0, None, None, False), "broadcast": (0, "src", 1, False), "reduce": (0, "dst", 1, False),
    "all_gather": (1, None, None, False), "all_gather_into_tensor": (1, None, None, False),
    "reduce_scatter": (0, None, None, False), "reduce_scatter_tensor": (1, None, None, False),
    "all_to_all_single": (1, None, None, False), "barrier": (None, None, None, False),
    "gather": (0, "dst", 2, False), "scatter": (0, "src", 2, False),
    "send": (0, "dst", 1, True), "recv": (0, "src", 1, True),
}


def install(dist):
    """Wrap *dist*'s (``torch.distributed``'s) collectives and point-to-point calls (idempotent)."""
    global _done
    if _done or not dist.is_available():
        return
    _done = True
    for name, spec in _CALLS.items():
        function = getattr(dist, name, None)
        if function is not None:
            setattr(dist, name, _wrap(dist, function, name, spec))
    destroy = getattr(dist, "destroy_process_group", None)
    if destroy is not None:
        dist.destroy_process_group = _keeping_group_names(destroy)


def _keeping_group_names(destroy):
    """``destroy_process_group`` that leaves torch's count of process groups where it was.

    torch restarts the count when the default group is destroyed, so the next ``init_process_group`` names its
    group as the destroyed one was ("0"). When it meets at the same ``MASTER_ADDR:MASTER_PORT``, rank 0's
    rendezvous server from before is still serving (torch keeps it after the destroy) with the destroyed group's
    keys, and gloo's ranks read each other's old addresses: the PyTorch DDP tutorial's ``demo_basic`` then
    ``demo_checkpoint`` in one process hang in ``init_process_group`` or the first collective, under plain mpiexec
    too. Counting on gives each group new keys; every rank destroys and creates its groups together, so the names
    stay the same on every rank.
    """
    from torch.distributed import distributed_c10d

    @functools.wraps(destroy)
    def destroy_process_group(*args, **kwargs):
        world = getattr(distributed_c10d, "_world", None)
        count = getattr(world, "group_count", None)
        try:
            return destroy(*args, **kwargs)
        finally:
            if count and getattr(world, "group_count", None) == 0:
                world.group_count = count

    return destroy_process_group


def install_when_imported():
    """Wrap ``torch.distributed`` now if it is imported, else the moment it is (idempotent)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        install(dist)
    elif not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: lets the other finders find ``torch.distributed``, then wraps it once loaded."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch.distributed":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                install(module)

            spec.loader.exec_module = exec_module
        return spec


def _wrap(dist, function, name, spec):
    data_at, root_name, root_at, p2p = spec

    @functools.wraps(function)
    def call(*args, **kwargs):
        tensor = args[data_at] if data_at is not None and data_at < len(args) else None
        root = kwargs.get(root_name) if root_name else None
        if root is None and root_at is not None and root_at < len(args):
            root = args[root_at]
        group = kwargs.get("group")
        info = None
        start = _now()
        if not p2p and not kwargs.get("async_op"):
            info = _ledger(dist, group)
            count, dtype = _shape(tensor)
            signature = (name, root, count, dtype)
            info.count += 1
            seq = info.count
            info.recent.append((seq, signature))
            _state.enter(info, seq, signature, start)
        try:
            return function(*args, **kwargs)
        finally:
            end = _now()
            if info is not None:
                _state.leave()
            _state.comm_ns += end - start
            if _state.spans is not None:
                size = _bytes(tensor)
                sent, received = (size, 0) if name != "recv" else (0, size)
                count, dtype = _shape(tensor)
                detail = f"{count} x {dtype}" if count is not None else ""
                _state.spans.append((name, _group_name(dist, group), root, sent, received, start, end,
                                     info.count if info is not None else None, "torch", detail))
                _state.recorded += 1

    return call


def _ledger(dist, group):
    name = _group_name(dist, group)
    ledger = _state.ledgers.get(name)
    if ledger is None:
        try:
            members = tuple(dist.get_process_group_ranks(group)) if group is not None else \
                tuple(range(dist.get_world_size()))
        except Exception:  # noqa: BLE001 - a group torch cannot describe: compare it by name only
            members = ()
        ledger = _state.ledger(name, members)
    return ledger


def _group_name(dist, group):
    if group is None:
        return "torch:default"
    return f"torch:{getattr(group, 'group_name', None) or id(group)}"


def _shape(tensor):
    if tensor is None or not hasattr(tensor, "numel"):
        return None, None
    return tensor.numel(), str(tensor.dtype).replace("torch.", "")


def _bytes(tensor):
    if tensor is None or not hasattr(tensor, "numel"):
        return 0
    return tensor.numel() * tensor.element_size()
