"""Horovod-style data parallelism over mpi4py: parameters and optimizer state broadcast from one rank, gradients
averaged in fused buckets with buffer-based MPI (the tensors' memory, no pickling), optionally compressed to fp16
or overlapped with the backward pass. Every function is collective over *comm* (default ``MPI.COMM_WORLD``) and
checks first that every rank holds the same parameters with gradients in the same places, so a mismatch (or bad
input on any rank) is an error on every rank instead of a deadlock.
"""

import operator
import pickle
import zlib
from collections import OrderedDict
from collections.abc import Mapping

import torch

_MPI_TYPES = {  # torch dtype -> name of the MPI datatype for its elements
    torch.float32: "FLOAT", torch.float64: "DOUBLE", torch.float16: "FLOAT16_T", torch.bfloat16: "BFLOAT16_T",
    torch.int32: "INT32_T", torch.int64: "INT64_T", torch.uint8: "UINT8_T", torch.int8: "INT8_T",
    torch.bool: "C_BOOL",
}


class _DefaultRoot(int):
    """The default ``root=0`` (shown as 0), told apart from an explicit one so that ``root_rank=1`` can replace it
    while ``root=0, root_rank=1`` is an error."""


_ROOT = _DefaultRoot(0)


def broadcast_parameters(params, root=_ROOT, *, root_rank=None, comm=None):
    """Give every rank rank *root*'s tensors, copied into each rank's own tensors in place (Horovod's
    ``broadcast_parameters``). Collective over *comm*: every rank calls it with the same names, shapes and dtypes.

    Args:
        params: what to broadcast, one of

            - a ``torch.nn.Module``: its parameters and buffers;
            - a dict of tensors such as ``model.state_dict()`` (its tensors share the model's memory, so the model
              gets the values), taken in key order as Horovod does, so ranks' insertion orders need not agree.
              Every value must be a tensor: anything else cannot be updated in place and is an error;
            - an iterable of ``(name, tensor)`` pairs such as ``model.named_parameters()``;
            - an iterable of tensors such as ``model.parameters()``, or a single tensor.
        root (int, default 0): the rank whose values every rank gets.
        root_rank (int or None, default None): Horovod's name for *root*; give one or the other (both with
            different values is an error).
        comm (mpi4py.MPI.Comm or None, default None): the ranks taking part; ``None`` means ``MPI.COMM_WORLD``.

    Raises (on every rank, so none is left waiting in a collective):
        TypeError: *params* on some rank is none of the above; the message says which entry and what to pass.
        ValueError: ranks hold different names, shapes or dtypes (named, with the ranks), pass different roots,
            or the root is not a rank of *comm*.

    Tensors travel with buffer-based ``Bcast`` in flat buckets of up to 64 MB per dtype, not pickled.

    Example (``mpiexec -n 2 python example.py``)::

        import torch
        import mpinb.torch as mt
        from mpi4py import MPI

        torch.manual_seed(MPI.COMM_WORLD.rank)                 # different weights on every rank
        model = torch.nn.Linear(4, 2)
        mt.broadcast_parameters(model.state_dict(), root_rank=0)
        print(model.weight.sum())                              # the same on every rank
    """
    comm = _world(comm)
    root, problem = _root(root, root_rank, comm)
    named, bad_params = _named_tensors(params)
    _agree(comm, "broadcast_parameters", _signature(named, grads=False), problem=problem or bad_params,
           same={"root": root})
    _broadcast(comm, named, root, slot="broadcast")


def broadcast_optimizer_state(optimizer, root=_ROOT, *, root_rank=None, comm=None):
    """Give every rank's *optimizer* rank *root*'s state (Horovod's ``broadcast_optimizer_state``): the
    per-parameter state (Adam's ``step``, ``exp_avg``, ``exp_avg_sq``, SGD's momentum buffers, ...) and every
    param group's hyperparameters (``lr``, ``betas``, ``weight_decay``, ...), as ``load_state_dict`` of root's
    ``state_dict()`` would. Collective over *comm*.

    Ranks that have not stepped yet (empty state) get root's state as it is, without a step of their own: unlike
    Horovod, no rank's parameters are touched. If root has not stepped, every rank's state ends up empty like
    root's. Each rank keeps its own parameters; their state follows them in ``param_groups`` order.

    Args:
        optimizer (torch.optim.Optimizer or mpinb.torch.DistributedOptimizer): the same kind of optimizer over
            parameters of the same shapes and dtypes on every rank (any optimizer, LBFGS included).
        root (int, default 0): the rank whose state every rank gets.
        root_rank (int or None, default None): Horovod's name for *root*; give one or the other.
        comm (mpi4py.MPI.Comm or None, default None): the ranks taking part; ``None`` means ``MPI.COMM_WORLD``.

    Raises (on every rank):
        TypeError: *optimizer* is not a ``torch.optim.Optimizer`` on some rank, or root's state cannot be pickled.
        ValueError: ranks hold different optimizers or parameters (named, with the ranks), pass different roots,
            or the root is not a rank of *comm*.

    The state's tensors travel with buffer-based ``Bcast`` in flat buckets; the rest of the ``state_dict``
    (hyperparameters, numbers kept as Python objects) is pickled once, with placeholders for the tensors.
    Non-root ranks' state tensors are then moved to their parameters' devices and dtypes by ``load_state_dict``.

    Example (``mpiexec -n 2 python example.py``)::

        import torch
        import mpinb.torch as mt
        from mpi4py import MPI

        model = torch.nn.Linear(4, 1)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        if MPI.COMM_WORLD.rank == 0:                           # say rank 0 resumed from a checkpoint
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
        mt.broadcast_parameters(model, root_rank=0)
        mt.broadcast_optimizer_state(opt, root_rank=0)
        print(opt.state_dict()["state"][0]["step"])            # tensor(1.) on every rank
    """
    comm = _world(comm)
    root, problem = _root(root, root_rank, comm)
    inner = optimizer.optimizer if isinstance(optimizer, DistributedOptimizer) else optimizer
    if isinstance(inner, torch.optim.Optimizer):
        signature = [(f"param_groups[{g}][{i}]", tuple(p.shape), str(p.dtype), True)
                     for g, group in enumerate(inner.param_groups) for i, p in enumerate(group["params"])]
    else:
        signature = []
        problem = problem or TypeError(
            f"optimizer must be a torch.optim.Optimizer (or an mpinb.torch.DistributedOptimizer), not "
            f"{_a(optimizer)}; pass the optimizer itself, e.g. torch.optim.Adam(model.parameters())"
            + ("; for a model's weights use broadcast_parameters(model)" if isinstance(optimizer, torch.nn.Module)
               else ""))
    what = "broadcast_optimizer_state"
    _agree(comm, what, signature, problem=problem, same={"root": root, "optimizer": type(inner).__name__})

    if comm.rank == root:
        tensors = []
        skeleton = _without_tensors(inner.state_dict(), tensors)
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
    _broadcast(comm, [(str(i), t) for i, t in enumerate(tensors)], root, slot="optimizer")
    if comm.rank != root:
        inner.load_state_dict(_with_tensors(skeleton, tensors))


def allreduce_gradients(model, average=True, bucket_mb=25, *, compression=None, comm=None):
    """Sum (or average) every gradient across ranks, in place.

    Small gradients are fused: copied into one flat buffer per bucket of up to *bucket_mb* MB and dtype,
    reduced, and copied back. Gradients of :data:`IN_PLACE_BYTES` or more are reduced where they are, with no
    copy. Every ``Allreduce`` goes in pieces of :data:`CHUNK_BYTES` (MPICH reduces 2–4 MB pieces twice as fast
    as one 46 MB message here). ``compression="fp16"`` halves the bytes on the wire (values are pre-divided by
    the size when averaging, so the fp16 sum does not overflow). Parameters without a gradient on every rank
    are skipped; one with a gradient on some ranks only is an error naming it and the ranks.
    """
    comm = _world(comm)
    named = [(name, p) for name, p in _named(model) if p.requires_grad]
    _agree(comm, "allreduce_gradients", _signature(named))
    with torch.no_grad():
        buckets = _buckets([(n, p) for n, p in named if p.grad is not None], bucket_bytes=bucket_mb << 20)
        for index, bucket in enumerate(buckets):
            grads = [p.grad for _, p in bucket]
            flat = _wire_buffer(grads, compression, slot=index, divide_by=comm.size if average else 1)
            for piece, memory in _chunks(flat):
                comm.Allreduce(_IN_PLACE(), memory, op=_SUM(flat.dtype))
                if average and not compression:
                    piece.div_(comm.size)  # while the piece is still in cache
            if flat.data_ptr() != grads[0].data_ptr():
                _unflatten(flat, grads)


class GradientAllreducer:
    """Non-blocking :func:`allreduce_gradients`: each bucket's ``Iallreduce`` starts from backward hooks as soon
    as its last gradient is accumulated, so communication overlaps the rest of the backward pass.

    Call :meth:`synchronize` after ``backward()`` (``DistributedOptimizer(..., overlap=True)`` does): it waits,
    averages, and writes the results into ``.grad``. Buckets start in the same order on every rank. If a rank
    lacks a gradient others have, every bucket is still completed (with zeros) before the error is raised on
    every rank, so the world stays usable.
    """

    def __init__(self, model, average=True, bucket_mb=25, *, compression=None, comm=None):
        self.comm = _world(comm)
        self.check = self.comm.Dup()  # agreement checks must not interleave with the pending Iallreduces
        self.average, self.compression = average, compression
        self.named = [(name, p) for name, p in _named(model) if p.requires_grad]
        _agree(self.check, "GradientAllreducer", _signature(self.named, grads=False))
        self.buckets = _buckets(self.named, bucket_bytes=bucket_mb << 20)
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for _, p in bucket}
        self._reset()
        self.hooks = [p.register_post_accumulate_grad_hook(self._ready) for _, p in self.named]

    def _reset(self):
        self.waiting = [len(bucket) for bucket in self.buckets]
        self.flats = [None] * len(self.buckets)
        self.requests = []
        self.started = 0

    def _ready(self, param):
        index = self.bucket_of[id(param)]
        self.waiting[index] -= 1
        while self.started < len(self.buckets) and self.waiting[self.started] == 0:
            self._start(self.started)
        if self.requests:
            _Request().Testall(self.requests)  # let MPI make progress while backward goes on

    def _start(self, index, fill_missing=False):
        params = [p for _, p in self.buckets[index]]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params] if fill_missing \
            else [p.grad for p in params]
        with torch.no_grad():  # (a zero-filled stand-in is never reduced in place: nothing would see the result)
            flat = _wire_buffer(grads, self.compression, slot=("overlap", index), in_place=grads[0] is params[0].grad,
                                divide_by=self.comm.size if self.average else 1)
        self.flats[index] = flat
        self.requests.extend(self.comm.Iallreduce(_IN_PLACE(), memory, op=_SUM(flat.dtype))
                             for _, memory in _chunks(flat))
        self.started += 1

    def synchronize(self):
        """Wait for every bucket and write the averaged gradients back; raise if ranks disagreed."""
        signature = _signature(self.named)
        everyone = self.check.allgather((_digest(signature), self.started == len(self.buckets)))
        agreed = len({digest for digest, _ in everyone}) == 1
        if not all(complete for _, complete in everyone):
            # a bucket did not fill on some rank (a parameter without gradient): start what is left everywhere,
            # in order, with zeros for missing gradients, so every rank's collectives still match
            while self.started < len(self.buckets):
                self._start(self.started, fill_missing=True)
        _Request().Waitall(self.requests)
        if not agreed:
            self._reset()
            _agree(self.check, "GradientAllreducer", signature)
        with torch.no_grad():
            for flat, bucket in zip(self.flats, self.buckets):
                if self.average and not self.compression:
                    flat.div_(self.comm.size)
                grads = [p.grad for _, p in bucket]
                if grads[0] is None or flat.data_ptr() != grads[0].data_ptr():
                    _unflatten(flat, grads, sizes=[p.numel() for _, p in bucket])
        self._reset()

    def remove(self):
        for hook in self.hooks:
            hook.remove()
        self.check.Free()


class DistributedOptimizer:
    """Horovod's ``DistributedOptimizer``: ``step()`` averages the gradients across ranks, then steps *optimizer*.

    With ``overlap=True`` the reduction runs during backward (:class:`GradientAllreducer`). Everything else
    (``zero_grad``, ``param_groups``, ``state_dict``...) is the wrapped optimizer's.

    Example::

        opt = mpinb.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        loss.backward()
        opt.step()
    """

    def __init__(self, optimizer, model, *, average=True, bucket_mb=25, compression=None, overlap=False,
                 comm=None):
        self.optimizer, self.model = optimizer, model
        self.options = dict(average=average, bucket_mb=bucket_mb, compression=compression, comm=comm)
        self.reducer = GradientAllreducer(model, **self.options) if overlap else None

    def step(self, closure=None):
        if self.reducer is not None:
            self.reducer.synchronize()
        else:
            allreduce_gradients(self.model, **self.options)
        return self.optimizer.step(closure)

    def __getattr__(self, name):
        return getattr(self.optimizer, name)


# ---------------------------------------------------------------------------------------------- helpers


def _world(comm):
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    return comm


def _IN_PLACE():
    from mpi4py import MPI

    return MPI.IN_PLACE


_half_sums = {}


def _SUM(dtype=None):
    """``MPI.SUM``, except for 16-bit floats: MPICH sums ``FLOAT16_T`` element by element in generic code, 55 ms
    for 10 MB between 2 ranks here against 3 ms for the same sum as a user op that adds with torch's vectorised
    kernels (and 5.5 ms for the float32 values), which would make compression cost time instead of saving it."""
    from mpi4py import MPI

    if dtype not in (torch.float16, torch.bfloat16):
        return MPI.SUM
    if dtype not in _half_sums:
        def add(incoming, inout, datatype, dtype=dtype):
            torch.frombuffer(inout, dtype=dtype).add_(torch.frombuffer(incoming, dtype=dtype))

        _half_sums[dtype] = MPI.Op.Create(add, commute=True)
    return _half_sums[dtype]


def _Request():
    from mpi4py import MPI

    return MPI.Request


def _root(root, root_rank, comm):
    """``(root, None)`` from :func:`broadcast_parameters`' *root* and *root_rank*, or ``(None, problem)``."""
    name = "root"
    if root_rank is not None:
        if root is not _ROOT and root != root_rank:
            return None, ValueError(f"root={root!r} and root_rank={root_rank!r} disagree: give one of them "
                                    "(root_rank is Horovod's name for root)")
        root, name = root_rank, "root_rank"
    try:
        root = operator.index(root)
    except TypeError:
        return None, TypeError(f"{name} must be a rank (an int), not {_a(root)}")
    if not 0 <= root < comm.size:
        from ..wire.ranks import label_ranks

        return None, ValueError(f"{name}={root} is not a rank of comm ({label_ranks(range(comm.size))})")
    return root, None


_PARAMS = ("a torch.nn.Module, a dict of tensors (a state_dict), or an iterable of tensors or of (name, tensor) "
           "pairs such as model.named_parameters()")


def _named_tensors(params):
    """``([(name, tensor)], None)`` for what :func:`broadcast_parameters` takes, or ``([], problem)``."""
    if isinstance(params, torch.Tensor):
        return [("tensor", params)], None
    if isinstance(params, torch.nn.Module):
        return list(params.named_parameters()) + list(params.named_buffers()), None
    if isinstance(params, (torch.optim.Optimizer, DistributedOptimizer)):
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


def _a(value):
    """``"an int"``, ``"a str"``: what *value* is, for messages."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _broadcast(comm, named, root, *, slot):
    """Copy root's tensors into every rank's *named* tensors, in buckets of one dtype (buffer-based Bcast)."""
    with torch.no_grad():
        for index, bucket in enumerate(_buckets(named, bucket_bytes=64 << 20)):
            tensors = [t for _, t in bucket]
            flat = _flatten(tensors, slot=(slot, index))
            comm.Bcast(_mpi_buffer(flat, moving_only=True), root=root)
            if comm.rank != root:
                _unflatten(flat, tensors)


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


def _with_tensors(value, tensors):
    if isinstance(value, _Slot):
        return tensors[value]
    if type(value) in (dict, OrderedDict):
        return type(value)((key, _with_tensors(item, tensors)) for key, item in value.items())
    if type(value) in (list, tuple):
        return type(value)(_with_tensors(item, tensors) for item in value)
    return value


def _named(model):
    if hasattr(model, "named_parameters"):
        return list(model.named_parameters())
    items = list(model)
    if items and isinstance(items[0], tuple):
        return items
    return [(str(i), tensor) for i, tensor in enumerate(items)]


def _signature(named, *, grads=True):
    """What every rank must agree on: name, shape, dtype and (with *grads*) whether it holds a gradient."""
    return [(name, tuple(p.shape), str(p.dtype), p.grad is not None if grads else True) for name, p in named]


def _digest(signature):
    return zlib.crc32(repr(signature).encode())


def _agree(comm, what, signature, *, problem=None, same=None):
    """Raise on every rank, naming parameters and ranks, unless every rank has this *signature*, no rank found a
    *problem* (an exception to raise) with its input, and every rank has the same values in *same*
    (``{"root": 0}``). One small allgather when all is well."""
    from ..wire.ranks import label_ranks

    everyone = comm.allgather((_digest(signature), None if problem is None else (type(problem), str(problem)),
                               same or {}))
    problems = {}
    for rank, (_, found, _) in enumerate(everyone):
        if found is not None:
            problems.setdefault(found, []).append(rank)
    if problems:
        kind = next(iter(problems))[0]
        if len(problems) == 1 and len(next(iter(problems.values()))) == comm.size:
            raise kind(f"{what}: {next(iter(problems))[1]}")
        raise kind(f"{what}: " + "; ".join(f"on {label_ranks(ranks)}: {message}"
                                          for (_, message), ranks in problems.items()))
    for key in everyone[0][2]:
        values = {}
        for rank, (_, _, held) in enumerate(everyone):
            values.setdefault(repr(held[key]), []).append(rank)
        if len(values) > 1:
            raise ValueError(f"{what}: ranks disagree on the {key}: "
                             + "; ".join(f"{value} on {label_ranks(ranks)}" for value, ranks in values.items()))
    if len({digest for digest, _, _ in everyone}) == 1:
        return
    everyone = comm.allgather(signature)
    by_name = [{name: rest for name, *rest in rank_signature} for rank_signature in everyone]
    names = list(dict.fromkeys(name for rank_signature in everyone for name, *_ in rank_signature))
    problems = []
    for name in names:
        variants = {}
        for rank, held in enumerate(by_name):
            variants.setdefault(tuple(held[name]) if name in held else None, []).append(rank)
        if len(variants) == 1:
            continue
        grads_differ = len({v[2] for v in variants if v is not None}) > 1
        described = []
        for variant, ranks in variants.items():
            if variant is None:
                described.append(f"missing on {label_ranks(ranks)}")
            else:
                shape, dtype, has_grad = variant
                grad = (", gradient" if has_grad else ", no gradient") if grads_differ else ""
                described.append(f"{tuple(shape)} {dtype.removeprefix('torch.')}{grad} on {label_ranks(ranks)}")
        hint = " (not used in that rank's forward pass?)" if grads_differ else ""
        problems.append(f"parameter {name!r}: " + "; ".join(described) + hint)
    raise ValueError(f"{what}: ranks disagree on {len(problems)} parameter(s): " + " | ".join(problems))


IN_PLACE_BYTES = 1 << 20  # a gradient this big is reduced in its own memory: fusing it would only add copies
CHUNK_BYTES = 2 << 20  # Allreduce piece size (measured fastest for 2-4 MB on MPICH over shared memory)


def _wire_buffer(grads, compression, *, slot, divide_by=1, in_place=True):
    """The flat buffer a bucket's *grads* are reduced in: the gradient itself when it is big enough and already
    in the wire dtype, else a fused copy converted to it. Compressed values are divided before the sum (an fp16
    sum of undivided gradients can overflow); uncompressed ones after it, piece by piece."""
    wire = _wire_dtype(grads[0].dtype, compression)
    if in_place and _reducible_in_place(grads, wire):
        return grads[0].view(-1)
    flat = _flatten(grads, dtype=wire, slot=slot)
    if compression and divide_by != 1:
        flat.div_(divide_by)
    return flat


def _reducible_in_place(tensors, wire_dtype):
    (tensor, *more) = tensors
    return (not more and tensor.is_contiguous() and tensor.device.type == "cpu" and tensor.dtype == wire_dtype
            and tensor.numel() * tensor.element_size() >= IN_PLACE_BYTES)


def _chunks(flat):
    """``(piece, [memory, count, datatype])`` for pieces of a flat tensor of at most :data:`CHUNK_BYTES`."""
    step = max(1, CHUNK_BYTES // flat.element_size())
    pieces = [flat[start:start + step] for start in range(0, flat.numel(), step)]
    return [(piece, _mpi_buffer(piece)) for piece in pieces]


def _buckets(named, *, bucket_bytes):
    """Groups of one dtype and at most about *bucket_bytes*, in reverse order (backward produces the last
    layers' gradients first); a tensor of :data:`IN_PLACE_BYTES` or more is a bucket of its own."""
    buckets, current, size = [], [], 0
    for name, tensor in reversed(named):
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes >= IN_PLACE_BYTES:
            if current:
                buckets.append(current)
                current, size = [], 0
            buckets.append([(name, tensor)])
            continue
        if current and (tensor.dtype != current[0][1].dtype or size + nbytes > bucket_bytes):
            buckets.append(current)
            current, size = [], 0
        current.append((name, tensor))
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def _wire_dtype(dtype, compression):
    if compression in (None, "none"):
        return dtype
    if compression == "fp16":
        return torch.float16 if dtype.is_floating_point else dtype
    raise ValueError(f"compression must be None or 'fp16', not {compression!r}")


_flats = {}  # (elements, dtype, slot) -> a reusable flat buffer
_FLAT_SLOTS = 64


def _flatten(tensors, dtype=None, *, slot=0):
    """One contiguous CPU buffer holding *tensors* one after another (converted to *dtype*).

    Buffers are kept and reused by size, dtype and *slot* (a bucket's index): fresh memory costs a page
    fault per 4 KB, which made a 45 MB reduction 2.5× slower than the copies and the reduction themselves.
    """
    dtype = dtype or tensors[0].dtype
    total = sum(t.numel() for t in tensors)
    key = (total, dtype, slot)
    flat = _flats.get(key)
    if flat is None:
        if len(_flats) >= _FLAT_SLOTS:
            _flats.clear()
        flat = _flats[key] = torch.empty(total, dtype=dtype)
    offset = 0
    for tensor in tensors:
        n = tensor.numel()
        flat[offset:offset + n].copy_(tensor.reshape(-1))
        offset += n
    return flat


def _unflatten(flat, tensors, sizes=None):
    """Copy *flat* back into *tensors* (``None`` entries are skipped; *sizes* then says how much each took)."""
    offset = 0
    for i, tensor in enumerate(tensors):
        n = sizes[i] if sizes is not None else tensor.numel()
        if tensor is not None:
            tensor.copy_(flat[offset:offset + n].view(tensor.shape))
        offset += n


def _mpi_buffer(flat, *, moving_only=False):
    """``[memory, count, datatype]`` of a flat CPU tensor for buffer-based MPI calls. *moving_only* (``Bcast``,
    no arithmetic): a dtype MPI has no type for goes as its bytes."""
    from mpi4py import MPI

    if moving_only and flat.dtype not in _MPI_TYPES:
        return [flat.view(torch.uint8).numpy(), flat.numel() * flat.element_size(), MPI.BYTE]
    datatype = getattr(MPI, _MPI_TYPES[flat.dtype])
    if datatype == MPI.DATATYPE_NULL and flat.dtype in (torch.float16, torch.bfloat16):
        datatype = MPI.UINT16_T  # a 2-byte carrier: MPI only moves the bytes, and mpinb's own op sums them
    if datatype == MPI.DATATYPE_NULL:
        raise ValueError(f"this MPI has no datatype for {flat.dtype}; use compression=None")
    return [flat.view(torch.uint8).numpy(), flat.numel(), datatype]
