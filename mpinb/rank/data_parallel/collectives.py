"""Horovod-style data parallelism over mpi4py: parameters and optimizer state broadcast from one rank, gradients
averaged in fused buckets with buffer-based MPI (the tensors' memory, no pickling), optionally compressed to fp16
or overlapped with the backward pass. Every function is collective over *comm* (default ``MPI.COMM_WORLD``) and
checks first that every rank holds the same parameters with gradients in the same places, so a mismatch (or bad
input on any rank) is an error on every rank instead of a deadlock (``agreement.py``), with what each rank was
given checked in ``arguments.py``. Tensors travel as flat buffers (``flat_buffers.py``); an optimizer's state as in
``optimizer_state.py``.
"""

import torch

from .. import replicas
from ..tracing import api_call, own_check
from .agreement import agree, parameter_signature, signature_digest
from .arguments import ROOT, named_tensors, not_an_optimizer, parameters_of, root_of, world
from .flat_buffers import buckets_of, chunks, flatten, mpi_buffer, unflatten, wire_buffer
from .optimizer_state import optimizer_signature, share_skeleton, with_tensors


def broadcast_parameters(params, root=ROOT, *, root_rank=None, comm=None):
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

    Raises:
        TypeError: *params* on some rank is none of the above; the message says which entry and what to pass.
        ValueError: ranks hold different names, shapes or dtypes (named, with the ranks), pass different roots,
            or the root is not a rank of *comm*.

    Either is raised on every rank, so none is left waiting in a collective.

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
    comm = world(comm)
    root, problem = root_of(root, root_rank, comm)
    named, bad_params = named_tensors(params)
    with api_call("broadcast_parameters", comm):
        agree(comm, "broadcast_parameters", parameter_signature(named, grads=False), problem=problem or bad_params,
               same={"root": root})
        _broadcast(comm, named, root, slot="broadcast")
    if isinstance(params, torch.nn.Module):
        replicas.watch(params)


def broadcast_optimizer_state(optimizer, root=ROOT, *, root_rank=None, comm=None):
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

    Raises:
        TypeError: *optimizer* is not a ``torch.optim.Optimizer`` on some rank, or root's state cannot be pickled.
        ValueError: ranks hold different optimizers or parameters (named, with the ranks), pass different roots,
            or the root is not a rank of *comm*.

    Either is raised on every rank, so none is left waiting in a collective.

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
    comm = world(comm)
    root, problem = root_of(root, root_rank, comm)
    inner = optimizer.optimizer if isinstance(optimizer, DistributedOptimizer) else optimizer
    if isinstance(inner, torch.optim.Optimizer):
        signature = optimizer_signature(inner)
    else:
        signature = []
        problem = problem or not_an_optimizer(optimizer)
    what = "broadcast_optimizer_state"
    with api_call(what, comm):
        agree(comm, what, signature, problem=problem, same={"root": root, "optimizer": type(inner).__name__})
        skeleton, tensors = share_skeleton(comm, inner, root, what)
        _broadcast(comm, [(str(i), t) for i, t in enumerate(tensors)], root, slot="optimizer")
    if comm.rank != root:
        inner.load_state_dict(with_tensors(skeleton, tensors))


def allreduce_gradients(model, average=True, bucket_mb=25, *, compression=None, comm=None):
    """Sum (or average) every gradient across ranks, in place. Collective over *comm*: call it after
    ``backward()`` on every rank.

    Small gradients are fused: copied into one flat buffer per bucket of up to *bucket_mb* MB and dtype,
    reduced, and copied back. Gradients of 1 MB or more (``IN_PLACE_BYTES``) are reduced where they are, with no
    copy. Every ``Allreduce`` goes in pieces of 2 MB (``CHUNK_BYTES``: MPICH reduces 2–4 MB pieces twice as fast
    as one 46 MB message here). ``compression="fp16"`` halves the bytes on the wire (values are pre-divided by
    the size when averaging, so the fp16 sum does not overflow). Parameters without a gradient on every rank
    are skipped; one with a gradient on some ranks only is an error naming it and the ranks.

    Args:
        model (torch.nn.Module or iterable): whose gradients to reduce: a module (its parameters that require
            grad), or an iterable of tensors or of ``(name, tensor)`` pairs such as ``model.named_parameters()``.
        average (bool, default True): divide the sum by the number of ranks; ``False`` leaves the sum.
        bucket_mb (int, default 25): the most megabytes of gradients fused into one buffer.
        compression (str or None, default None): ``"fp16"`` sends the gradients as 16-bit floats; ``None`` (or
            ``"none"``) in their own dtype.
        comm (mpi4py.MPI.Comm or None, default None): the ranks taking part; ``None`` means ``MPI.COMM_WORLD``.

    Example::

        loss.backward()
        mt.allreduce_gradients(model)      # every rank now holds the average gradient
        opt.step()
    """
    comm = world(comm)
    replicas.watch(model)
    named = [(name, p) for name, p in parameters_of(model) if p.requires_grad]
    with api_call("allreduce_gradients", comm):
        agree(comm, "allreduce_gradients", parameter_signature(named))
        _allreduce_buckets(comm, named, average, bucket_mb, compression)


def _allreduce_buckets(comm, named, average, bucket_mb, compression):
    with torch.no_grad():
        buckets = buckets_of([(n, p) for n, p in named if p.grad is not None], bucket_bytes=bucket_mb << 20)
        for index, bucket in enumerate(buckets):
            grads = [p.grad for _, p in bucket]
            flat = wire_buffer(grads, compression, slot=index, divide_by=comm.size if average else 1)
            for piece, memory in chunks(flat):
                comm.Allreduce(_IN_PLACE(), memory, op=_SUM(flat.dtype))
                if average and not compression:
                    piece.div_(comm.size)  # while the piece is still in cache
            if flat.data_ptr() != grads[0].data_ptr():
                unflatten(flat, grads)


class GradientAllreducer:
    """Non-blocking :func:`allreduce_gradients`: each bucket's ``Iallreduce`` starts from backward hooks as soon
    as its last gradient is accumulated, so communication overlaps the rest of the backward pass.

    Call :meth:`synchronize` after ``backward()`` (``DistributedOptimizer(..., overlap=True)`` does): it waits,
    averages, and writes the results into ``.grad``. Buckets start in the same order on every rank. If a rank
    lacks a gradient others have, every bucket is still completed (with zeros) before the error is raised on
    every rank, so the world stays usable.

    Collective over *comm*: every rank creates one, for the same parameters.

    Args:
        model (torch.nn.Module or iterable): whose gradients to reduce, as for :func:`allreduce_gradients`.
        average (bool, default True): divide the sum by the number of ranks; ``False`` leaves the sum.
        bucket_mb (int, default 25): the most megabytes of gradients fused into one bucket.
        compression (str or None, default None): ``"fp16"`` sends the gradients as 16-bit floats.
        comm (mpi4py.MPI.Comm or None, default None): the ranks taking part; ``None`` means ``MPI.COMM_WORLD``.

    Example::

        reducer = mt.GradientAllreducer(model)
        loss.backward()                    # buckets start reducing as their gradients are ready
        reducer.synchronize()              # every rank now holds the average gradient
        opt.step()
    """

    def __init__(self, model, average=True, bucket_mb=25, *, compression=None, comm=None):
        self.comm = world(comm)
        self.check = self.comm.Dup()  # agreement checks must not interleave with the pending Iallreduces
        self.average, self.compression = average, compression
        self.named = [(name, p) for name, p in parameters_of(model) if p.requires_grad]
        agree(self.check, "GradientAllreducer", parameter_signature(self.named, grads=False))
        replicas.watch(model)
        self.buckets = buckets_of(self.named, bucket_bytes=bucket_mb << 20)
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
            flat = wire_buffer(grads, self.compression, slot=("overlap", index), in_place=grads[0] is params[0].grad,
                                divide_by=self.comm.size if self.average else 1)
        self.flats[index] = flat
        self.requests.extend(self.comm.Iallreduce(_IN_PLACE(), memory, op=_SUM(flat.dtype))
                             for _, memory in chunks(flat))
        self.started += 1

    def synchronize(self):
        """Wait for every bucket and write the averaged gradients back; raise if ranks disagreed."""
        with api_call("synchronize", self.check):
            self._synchronize()

    def _synchronize(self):
        signature = parameter_signature(self.named)
        with own_check("synchronize"):
            everyone = self.check.allgather((signature_digest(signature), self.started == len(self.buckets)))
        agreed = len({digest for digest, _ in everyone}) == 1
        if not all(complete for _, complete in everyone):
            # a bucket did not fill on some rank (a parameter without gradient): start what is left everywhere,
            # in order, with zeros for missing gradients, so every rank's collectives still match
            while self.started < len(self.buckets):
                self._start(self.started, fill_missing=True)
        _Request().Waitall(self.requests)
        if not agreed:
            self._reset()
            agree(self.check, "GradientAllreducer", signature)
        with torch.no_grad():
            for flat, bucket in zip(self.flats, self.buckets):
                if self.average and not self.compression:
                    flat.div_(self.comm.size)
                grads = [p.grad for _, p in bucket]
                if grads[0] is None or flat.data_ptr() != grads[0].data_ptr():
                    unflatten(flat, grads, sizes=[p.numel() for _, p in bucket])
        self._reset()

    def remove(self):
        """Take the backward hooks off the parameters and free the reducer's communicator (collective over
        *comm*). Gradients are no longer reduced during backward; the reducer is not used again."""
        for hook in self.hooks:
            hook.remove()
        self.check.Free()


class DistributedOptimizer:
    """Horovod's ``DistributedOptimizer``: ``step()`` averages the gradients across ranks, then steps *optimizer*.

    With ``overlap=True`` the reduction runs during backward (:class:`GradientAllreducer`). Everything else
    (``zero_grad``, ``param_groups``, ``state_dict``...) is the wrapped optimizer's.

    Args:
        optimizer (torch.optim.Optimizer): the optimizer to step, over *model*'s parameters.
        model (torch.nn.Module or iterable): whose gradients are reduced, as for :func:`allreduce_gradients`.
        average (bool, default True): divide the sum by the number of ranks; ``False`` leaves the sum.
        bucket_mb (int, default 25): the most megabytes of gradients fused into one bucket.
        compression (str or None, default None): ``"fp16"`` sends the gradients as 16-bit floats.
        overlap (bool, default False): reduce during backward (a :class:`GradientAllreducer` made now, so every
            rank must create the optimizer) instead of at ``step()``.
        comm (mpi4py.MPI.Comm or None, default None): the ranks taking part; ``None`` means ``MPI.COMM_WORLD``.

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
        """Average (or sum) the gradients across ranks, then step the wrapped optimizer with *closure* and return
        what it returns. Collective over *comm*: every rank calls it after ``backward()``."""
        if self.reducer is not None:
            self.reducer.synchronize()
        else:
            allreduce_gradients(self.model, **self.options)
        return self.optimizer.step(closure)

    def __getattr__(self, name):
        return getattr(self.optimizer, name)


# ---------------------------------------------------------------------------------------------- helpers


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


def _broadcast(comm, named, root, *, slot):
    """Copy root's tensors into every rank's *named* tensors, in buckets of one dtype (buffer-based Bcast)."""
    with torch.no_grad():
        for index, bucket in enumerate(buckets_of(named, bucket_bytes=64 << 20)):
            tensors = [t for _, t in bucket]
            flat = flatten(tensors, slot=(slot, index))
            comm.Bcast(mpi_buffer(flat, moving_only=True), root=root)
            if comm.rank != root:
                unflatten(flat, tensors)
