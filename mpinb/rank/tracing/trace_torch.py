"""``torch.distributed``'s collectives, seen like MPI's: each call is noted in the rank's ledger and, while
traced, as a span (kind ``"torch"``). The module's functions are wrapped in place once it is imported.

Calls with ``async_op=True`` are noted when launched and kept as outstanding until their work completes
(``tracing.State.launched``): what a rank waits for then is the oldest one not complete, whichever thread
waits. DistributedDataParallel's steps are noted from its forward (``rank/tracing/trace_ddp.py``), its parameter and
buffer broadcasts through ``_broadcast_coalesced``. Every group is
one ledger, whichever way it is named (``None``, ``dist.group.WORLD``, the group object).
"""

import functools
import os
import threading

from .. import faults, tracing

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
            original[name] = function
            setattr(dist, name, _wrap(dist, function, name, spec))
    coalesced = getattr(dist, "_broadcast_coalesced", None)
    if coalesced is not None:
        original["broadcast_coalesced"] = coalesced
        dist._broadcast_coalesced = _wrap_coalesced(dist, coalesced)
    destroy = getattr(dist, "destroy_process_group", None)
    if destroy is not None:
        dist.destroy_process_group = _keeping_group_names(destroy)


original = {}  # name -> torch's own function, before wrapping
_groups = {}  # ledger name -> the group it counts (None: the default group), for stand-ins

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
        _retire(world, args[0] if args else kwargs.get("group"))
        try:
            return destroy(*args, **kwargs)
        finally:
            _groups.clear()  # the groups are gone: nothing to stand in for
            if count and getattr(world, "group_count", None) == 0:
                world.group_count = count

    return destroy_process_group


_retired = []  # groups destroyed in this cell, held until it ends (release_retired)


def _retire(world, group):
    """Hold the groups *group* destroys (``None``: all of them) until the cell ends.

    A DDP model's Reducer keeps its group alive after ``destroy_process_group``; when the model is freed, the
    Reducer's destructor ends the group's gloo worker threads and waits for them while it holds the GIL. A worker
    still letting go of the last gradient allreduce needs the GIL for it (the work keeps the backward pass's
    Python context), so the rank hangs where the model is freed, deaf to Stop: the PyTorch DDP tutorial's
    ``demo_checkpoint`` returning. Holding the group here makes the Reducer's release not the last one; the
    group is then ended from Python at the end of the cell, where torch lets the GIL go while it waits.
    """
    pg_map = getattr(world, "pg_map", None) or {}
    groups = list(pg_map) if group is None else [group]
    _retired.extend(g for g in groups if g is not None)


def release_retired():
    """End the groups destroyed in the cell that just ended (their last holder is this list, unless the user's
    variables still hold a model of theirs), on a thread of their own: a group whose collective never ended waits
    for it as it ends, and the rank must answer the next cell meanwhile."""
    if _retired:
        groups = list(_retired)
        _retired.clear()
        threading.Thread(target=groups.clear, name="mpinb-end-groups", daemon=True).start()


def _wrap(dist, function, name, spec):
    data_at, root_name, root_at, p2p = spec

    @functools.wraps(function)
    def call(*args, **kwargs):
        tensor = args[data_at] if data_at is not None and data_at < len(args) else None
        root = kwargs.get(root_name) if root_name else None
        if root is None and root_at is not None and root_at < len(args):
            root = args[root_at]
        group = kwargs.get("group")
        launched = kwargs.get("async_op")
        info = None
        start = _now()
        if not p2p:
            info = _ledger(dist, group)
            count, dtype = _shape(tensor)
            signature = (name, root, count, dtype)
            info.count += 1
            seq = info.count
            info.recent.append((seq, signature))
            if not launched:
                _state.enter(info, seq, signature, start)
        if faults.active and not p2p:  # %mpi inject planted one on this rank
            faults.before()
        work, done = None, False
        try:
            work = function(*args, **kwargs)
            done = True
            if faults.active and not p2p and not launched:
                faults.after(tensor)
            return work
        finally:
            end = _now()
            if info is not None:
                if launched:
                    if work is not None:
                        _state.launched(info, seq, signature, start, work)
                else:
                    _state.leave(done)  # one that raised stays in the mirror, marked: its last words
            if not launched:
                _state.comm_ns += end - start
            if _state.spans is not None:
                _span(dist, name, group, root, tensor, start, end, info.count if info is not None else None)

    return call


def _span(dist, name, group, root, tensor, start, end, seq):
    size = _bytes(tensor)
    sent, received = (size, 0) if name != "recv" else (0, size)
    count, dtype = _shape(tensor)
    detail = f"{count} x {dtype}" if count is not None else ""
    _state.spans.append((name, group_name(dist, group), root, sent, received, start, end, seq, "torch", detail))
    _state.recorded += 1


def _wrap_coalesced(dist, function):
    """``dist._broadcast_coalesced(group, tensors, buffer_size, src)``, which DDP broadcasts its parameters (at
    construction) and buffers (each forward) with, as one collective of the group's ledger."""

    @functools.wraps(function)
    def broadcast_coalesced(group, tensors, buffer_size, src=0):
        count = sum(tensor.numel() for tensor in tensors)
        dtypes = {tensor.dtype for tensor in tensors}
        dtype = str(next(iter(dtypes))).replace("torch.", "") if len(dtypes) == 1 else None
        info, seq, signature, start = note(dist, group, "broadcast_coalesced", src, count, dtype)
        _state.enter(info, seq, signature, start)
        done = False
        try:
            result = function(group, tensors, buffer_size, src)
            done = True
            return result
        finally:
            _state.leave(done)

    return broadcast_coalesced


def note(dist, group, op, root, count, dtype, *, name=None):
    """Count collective *op* of *group* in its ledger (the one named *name*, when given): ``(ledger, seq,
    signature, start_ns)``."""
    info = _ledger(dist, group, name)
    signature = (op, root, count, dtype)
    info.count += 1
    info.recent.append((info.count, signature))
    return info, info.count, signature, _now()


def retract(dist, group):
    """Take the call just noted on *group*'s ledger out again: every rank refused it before any data moved (the
    ``"mpi4py"`` backend's check that the ranks agree), so no rank's count of collectives includes it."""
    ledger = _state.ledgers.get(group_name(dist, group))
    if ledger is not None and ledger.count and ledger.recent and ledger.recent[-1][0] == ledger.count:
        ledger.recent.pop()
        ledger.count -= 1


def _ledger(dist, group, name=None):
    name = name or group_name(dist, group)
    ledger = _state.ledgers.get(name)
    if ledger is None:
        try:
            members = tuple(dist.get_process_group_ranks(group)) if group is not None else \
                tuple(range(dist.get_world_size()))
        except Exception:  # noqa: BLE001 - a group torch cannot describe: compare it by name only
            members = ()
        ledger = _state.ledger(name, members)
    if name not in _groups:  # a new ledger, or a group made again after destroy_process_group cleared them
        # the default group by None (the one current when a stand-in runs): holding the object would keep a
        # destroyed group's gloo pairs and store alive into the next init_process_group
        _groups[name] = None if name == "torch:default" else group
    return ledger


def group_name(dist, group):
    """The name of *group*'s ledger: ``torch:default`` for the default group, else ``torch:<its name>``."""
    if group is None:
        return "torch:default"
    name = getattr(group, "group_name", None)
    default = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    default = getattr(default, "default_pg", None)
    if group is default or (name is not None and name == getattr(default, "group_name", False)):
        return "torch:default"
    return f"torch:{name or id(group)}"


def stand_in(name, signature):
    """Enter collective *signature* of ledger *name* with zeros of its count and type, so that the ranks waiting
    in it complete it (``rank/settle.py``); it is counted as theirs was, signature and all."""
    import torch

    if name not in _groups:
        raise LookupError(f"process group {name} is not known on this rank")
    group = _groups[name]
    op, root, count, dtype = signature
    size = _size(group)
    kind = getattr(torch, dtype) if dtype else torch.float32
    device = _device(group)

    def zeros(n):
        return torch.zeros(n, dtype=kind, device=device)

    calls = {
        "all_reduce": lambda: original["all_reduce"](zeros(count), group=group),
        "broadcast": lambda: original["broadcast"](zeros(count), src=root, group=group),
        "reduce": lambda: original["reduce"](zeros(count), dst=root, group=group),
        "barrier": lambda: original["barrier"](group=group),
        "all_gather": lambda: original["all_gather"]([zeros(count) for _ in range(size)], zeros(count),
                                                     group=group),
        "all_gather_into_tensor": lambda: original["all_gather_into_tensor"](zeros(count * size), zeros(count),
                                                                             group=group),
        # DDP's parameter broadcast as it is made (its models' states, one dtype, under 250 MB: one broadcast), for
        # the rank a model of other shapes made fail in DDP's own check while the others went on to broadcast
        "broadcast_coalesced": lambda: original["broadcast_coalesced"](
            group if group is not None else _default_group(), [zeros(count)], 250 * 1024 * 1024, root),
    }
    call = calls.get(op)
    if call is None or (count is None and op != "barrier"):
        raise ValueError(f"cannot stand in for {op} on {name}")
    info = _state.ledgers[name]
    info.count += 1
    info.recent.append((info.count, tuple(signature)))
    call()


def _default_group():
    import torch.distributed as dist

    return dist.group.WORLD


def _size(group):
    import torch.distributed as dist

    return dist.get_world_size(group)


def _device(group):
    """Where a stand-in's tensors must be: the rank's GPU for NCCL (this thread's current device is not the
    main thread's, so it is asked of ``mpinb.torch``'s record, else taken as the local rank's), else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.get_backend(group) != "nccl":
        return torch.device("cpu")
    from ..group_record import bound_device

    if bound_device() not in (None, "cpu"):
        return torch.device(bound_device())
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))


def _shape(tensor):
    if tensor is None or not hasattr(tensor, "numel"):
        return None, None
    dtype = tensor.dtype
    try:
        return tensor.numel(), _DTYPE_NAMES[dtype]
    except KeyError:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
        return tensor.numel(), name


_DTYPE_NAMES = {}  # torch.float32 -> "float32": a training step's calls ask for the same few


def _bytes(tensor):
    if tensor is None or not hasattr(tensor, "numel"):
        return 0
    return tensor.numel() * tensor.element_size()
