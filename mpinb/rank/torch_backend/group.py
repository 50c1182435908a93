"""The process group: each of ``torch.distributed``'s calls as buffer-based mpi4py calls on the group's own MPI
communicator, on the tensors' memory. Collectives run to their end inside the call (``async_op=True`` gets a
``Work`` that is already done); ``isend`` and ``irecv`` return MPI requests to wait on."""

import functools
import signal
import threading

import numpy
import torch
import torch.distributed as dist

from . import work
from .buffers import Hosted, array, finish, mpi_op, op_type

_RED = torch.distributed.ReduceOp.RedOpType


class MPIProcessGroup(dist.ProcessGroup):
    """``torch.distributed``'s calls on the ranks of *comm* (an mpi4py intracommunicator this group owns), with
    the rank and size MPI gives it.

    Under ``%%mpi`` *comm* is a traced communicator, so every call is in the rank's ledger of collectives and, in
    a traced cell, on the timeline: DistributedDataParallel's gradient buckets included, which torch's C++
    reducer hands to :meth:`allreduce` one by one during ``backward()``.
    """

    notes_its_calls = True  # its MPI calls are in the ledger: the wrappers of torch.distributed leave them be

    def __init__(self, comm, name):
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm, self.label = comm, name
        self._rank, self._size = comm.Get_rank(), comm.Get_size()
        self._mine = numpy.zeros(4, dtype=numpy.int64)
        self._every = numpy.zeros((self._size, 4), dtype=numpy.int64)
        self._spans = 0  # calls recorded as spans, which numbers them alike on every rank

    def _agree(self, call, tensor=None, *, root=-1, op=None, count=None):
        """Check that every rank makes the same *call* (with *tensor*'s count and dtype, *root*, *op*) before its
        data moves: one ``Allgather`` of 4 numbers. MPICH ends the job when ranks pass different sizes to one
        collective ("message truncated"), and a different call waits for ever; instead every rank raises
        ``RuntimeError`` naming what each rank called, and the group stays usable. *count* ``-1``: the call's
        sizes may differ by rank (``all_to_all`` with splits)."""
        if not checked or self._size == 1:
            return
        mine = self._mine
        mine[0] = _CALL_CODES[call]
        mine[1] = root
        mine[2] = (tensor.numel() if tensor is not None else 0) if count is None else count
        mine[3] = (_DTYPE_CODES.get(tensor.dtype, 99) if tensor is not None else 0) * 16 + \
            (int(op.value) + 1 if op is not None else 0)
        self.comm.Allgather(mine, self._every)
        every = self._every
        if (every == mine).all():
            return
        stood_in = every[:, 0] == 0  # zeros: a rank that stood in for this call (rank/settle.py), not a call of its
        if stood_in.any() and (stood_in | (every == mine).all(axis=1)).all():
            return
        calls = [_said(row) for row in every.tolist()]
        from ..tracing import trace_torch

        trace_torch.retract(dist, self)  # no rank made the call: the ranks' ledgers agree again
        raise RuntimeError(f"ranks of process group {self.label!r} called different collectives: "
                           + "; ".join(_grouped(calls)) + _why(calls))

    def getBackendName(self):
        from . import NAME

        return NAME

    @property
    def group_name(self):
        """torch's name for the group (``"0"`` for the default one), as its registry of groups holds it (a
        Python group's own name is not kept by ``_set_group_name``)."""
        world = dist.distributed_c10d._world
        return world.pg_names.get(self, self.label)

    def __repr__(self):
        return f"MPIProcessGroup(name={self.label!r}, rank={self._rank}, size={self._size})"

    # --- reductions ---

    def allreduce(self, tensors, opts=None):
        op = op_type(opts.reduceOp) if opts is not None else _RED.SUM
        hosted = Hosted()
        for tensor in tensors:
            self._agree("all_reduce", tensor, op=op)
            host = hosted(tensor)
            self.comm.Allreduce(_IN_PLACE, array(host), mpi_op(op, host.dtype))
            finish(host, op, self._size)
        hosted.done()
        return work.done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts):
        op = op_type(opts.reduceOp)
        root = opts.rootRank
        hosted = Hosted()
        for tensor in tensors:
            self._agree("reduce", tensor, root=root, op=op)
            host = hosted(tensor, back=self._rank == root)
            memory = array(host)
            self.comm.Reduce(_IN_PLACE if self._rank == root else memory, memory if self._rank == root else None,
                             mpi_op(op, host.dtype), root)
            if self._rank == root:
                finish(host, op, self._size)
        hosted.done()
        return work.done(tensors)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = op_type(opts.reduceOp) if opts is not None else _RED.SUM
        for output, inputs in zip(outputs, input_lists):
            self._agree("reduce_scatter", output, op=op)
            hosted = Hosted()
            out = hosted(output)
            if all(t.numel() == out.numel() for t in inputs):
                joined = torch.cat([t.detach().reshape(-1).cpu() for t in inputs])
                self.comm.Reduce_scatter_block(array(joined), array(out), mpi_op(op, out.dtype))
            else:  # torch's list form allows one part per rank of any size
                joined = torch.cat([t.detach().reshape(-1).cpu() for t in inputs])
                counts = [t.numel() for t in inputs]
                self.comm.Reduce_scatter(array(joined), array(out), counts, mpi_op(op, out.dtype))
            finish(out, op, self._size)
            hosted.done()
        return work.done(outputs)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = op_type(opts.reduceOp) if opts is not None else _RED.SUM
        self._agree("reduce_scatter_tensor", input, op=op)
        hosted = Hosted()
        out, source = hosted(output), hosted(input, back=False)
        if source.numel() != out.numel() * self._size:
            raise ValueError(f"reduce_scatter_tensor: the input has {source.numel()} elements, not the output's "
                             f"{out.numel()} times the group's {self._size} ranks")
        self.comm.Reduce_scatter_block(array(source), array(out), mpi_op(op, out.dtype))
        finish(out, op, self._size)
        hosted.done()
        return work.done([output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            self._reduce_scatter_base(output, input, opts)
        return work.done(outputs)

    # --- data movement ---

    def broadcast(self, tensors, opts):
        root = opts.rootRank
        hosted = Hosted()
        for tensor in tensors:
            self._agree("broadcast", tensor, root=root)
            host = hosted(tensor, back=self._rank != root)
            self.comm.Bcast(array(host), root)
        hosted.done()
        return work.done(tensors)

    def allgather(self, output_lists, inputs, opts=None):
        for outputs, input in zip(output_lists, inputs):
            self._agree("all_gather", input, count=-1)
            source = Hosted()(input, back=False)
            if all(t.numel() == source.numel() and t.dtype == source.dtype for t in outputs):
                joined = torch.empty(source.numel() * self._size, dtype=source.dtype)
                self.comm.Allgather(array(source), array(joined))
            else:
                counts = [t.numel() for t in outputs]
                joined = torch.empty(sum(counts), dtype=source.dtype)
                self.comm.Allgatherv(array(source), [array(joined), counts])
            _spread(joined, outputs)
        return work.done(output_lists)

    def _allgather_base(self, output, input, opts=None):
        self._agree("all_gather_into_tensor", input)
        hosted = Hosted()
        out, source = hosted(output), hosted(input, back=False)
        if out.numel() != source.numel() * self._size:
            raise ValueError(f"all_gather_into_tensor: the output has {out.numel()} elements, not the input's "
                             f"{source.numel()} times the group's {self._size} ranks")
        self.comm.Allgather(array(source), array(out))
        hosted.done()
        return work.done([output])

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        """*output_lists*: one list per rank, holding that rank's part of each of *inputs*."""
        for index, input in enumerate(inputs):
            self.allgather([[outputs[index] for outputs in output_lists]], [input], opts)
        return work.done(output_lists)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            self._allgather_base(output, input, opts)
        return work.done(outputs)

    def gather(self, output_lists, inputs, opts):
        root = opts.rootRank
        self._agree("gather", inputs[0], root=root)
        source = Hosted()(inputs[0], back=False)
        if self._rank == root:
            outputs = output_lists[0]
            joined = torch.empty(source.numel() * self._size, dtype=source.dtype)
            self.comm.Gather(array(source), array(joined), root)
            _spread(joined, outputs)
        else:
            self.comm.Gather(array(source), None, root)
        return work.done(output_lists)

    def scatter(self, outputs, input_lists, opts):
        root = opts.rootRank
        self._agree("scatter", outputs[0], root=root)
        hosted = Hosted()
        out = hosted(outputs[0])
        joined = None
        if self._rank == root:
            joined = torch.cat([t.detach().reshape(-1).cpu() for t in input_lists[0]])
        self.comm.Scatter(array(joined) if joined is not None else None, array(out), root)
        hosted.done()
        return work.done(outputs)

    def alltoall_base(self, output, input, output_splits, input_splits, opts=None):
        self._agree("all_to_all_single", input, count=-1 if output_splits or input_splits else None)
        hosted = Hosted()
        out, source = hosted(output), hosted(input, back=False)
        if not output_splits and not input_splits:
            self.comm.Alltoall(array(source), array(out))
        else:
            per_row_out = out[0].numel() if out.dim() and out.shape[0] else 1
            per_row_in = source[0].numel() if source.dim() and source.shape[0] else 1
            send = _counts(input_splits, source, self._size, per_row_in)
            receive = _counts(output_splits, out, self._size, per_row_out)
            self.comm.Alltoallv([array(source), send], [array(out), receive])
        hosted.done()
        return work.done([output])

    def alltoall(self, outputs, inputs, opts=None):
        self._agree("all_to_all", outputs[0], count=-1)
        sources = [t.detach().reshape(-1).cpu() for t in inputs]
        send_counts = [t.numel() for t in sources]
        receive_counts = [t.numel() for t in outputs]
        joined = torch.empty(sum(receive_counts), dtype=outputs[0].dtype)
        self.comm.Alltoallv([array(torch.cat(sources)), send_counts], [array(joined), receive_counts])
        _spread(joined, outputs)
        return work.done(outputs)

    def barrier(self, opts=None):
        self._agree("barrier")
        self.comm.Barrier()
        return work.done([])

    # --- point to point ---

    def send(self, tensors, dst, tag):
        source = Hosted()(tensors[0], back=False)
        request = self.comm.Isend(array(source), dst, tag)
        return work.Pending([request], tensors, keep=source)

    def recv(self, tensors, src, tag):
        return self._receive(tensors, src, tag)

    def recv_anysource(self, tensors, tag):
        from mpi4py import MPI

        return self._receive(tensors, MPI.ANY_SOURCE, tag)

    def _receive(self, tensors, src, tag):
        hosted = Hosted()
        host = hosted(tensors[0])
        request = self.comm.Irecv(array(host), src, tag)
        return work.Pending([request], tensors, then=hosted.done if hosted.pairs else None, keep=host)

    def free(self):
        """Let the communicator go (``destroy_process_group``)."""
        comm, self.comm = self.comm, None
        if comm is not None:
            try:
                comm.Free()
            except Exception:  # noqa: BLE001 - MPI already finalised at exit: nothing to free
                pass


checked = True  # every collective checks that the ranks agree first (group.MPIProcessGroup._agree)

_CALLS = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "gather", "scatter",
          "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single", "all_to_all", "barrier")
_CALL_CODES = {name: index + 1 for index, name in enumerate(_CALLS)}
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
_DTYPE_CODES = {dtype: index + 1 for index, dtype in enumerate(_DTYPES)}
_OP_NAMES = {int(op.value) + 1: name for name, op in _RED.__members__.items()}


def _said(row):
    """A rank's call as its 4 numbers say it: ``all_reduce(4 x float32, SUM)``."""
    call, root, count, code = row
    if call == 0:
        return "nothing (it stood in)"
    dtype, op = divmod(code, 16)
    parts = []
    if root >= 0:
        parts.append(f"root={root}")
    if dtype:
        kind = str(_DTYPES[dtype - 1]).replace("torch.", "") if dtype <= len(_DTYPES) else "another dtype"
        parts.append(f"{count} x {kind}" if count >= 0 else kind)
    if op:
        parts.append(_OP_NAMES.get(op, "?"))
    return f"{_CALLS[call - 1]}({', '.join(parts)})"


def _grouped(calls):
    """``rank 0 all_reduce(...); ranks 1-3 all_reduce(...)``."""
    from ...wire.ranks import label_ranks

    by_call = {}
    for rank, call in enumerate(calls):
        by_call.setdefault(call, []).append(rank)
    return [f"{label_ranks(ranks)} in {call}" for call, ranks in by_call.items()]


def _why(calls):
    names = {call.split("(")[0] for call in calls}
    if len(names) > 1:
        return (". Likely the ranks call collectives in a different order (a rank-dependent branch): every rank "
                "must make the same calls in the same order")
    return (". Likely the ranks passed tensors of different sizes or types (pad, or all_gather the sizes first)"
            if len({call for call in calls}) > 1 else "")


def _spread(joined, outputs):
    """Copy the parts of the flat *joined* into *outputs*, one after another."""
    offset = 0
    for output in outputs:
        n = output.numel()
        output.detach().copy_(joined[offset:offset + n].view(output.shape))
        offset += n


def _counts(splits, tensor, size, per_row):
    """Elements to or from each rank for ``all_to_all_single``: *splits* are rows (first-dimension slices); none
    means equal parts."""
    if not splits:
        return [tensor.numel() // size] * size
    return [int(rows) * per_row for rows in splits]


def _stop_after_backward(method):
    """*method*, whose Stop (SIGINT) on the main thread is held while it runs and raised once its MPI calls are
    done: raised between them, it would leave this rank out of a collective the others make (the check made, the
    data call not: the ranks that stand in for this one, ``rank/settle.py``, then send into the next call, and MPI
    ends the job). Inside ``backward()`` (a gradient bucket DDP's reducer hands the group) it is raised once the
    backward has ended, after DDP's own final callback: raised inside, it would leave the reducer half-way through
    its buckets, failing every later step."""
    main = threading.main_thread()

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if threading.current_thread() is not main:
            return method(self, *args, **kwargs)
        held = []
        previous = signal.signal(signal.SIGINT, lambda number, frame: held.append(frame))
        try:
            return method(self, *args, **kwargs)
        finally:
            signal.signal(signal.SIGINT, previous)
            if held and callable(previous):
                if torch._C._current_graph_task_id() == -1:
                    previous(signal.SIGINT, held[0])
                else:  # after DDP's own final callback, which it queues once this returns
                    queue = torch.autograd.Variable._execution_engine.queue_callback
                    queue(lambda: queue(lambda: previous(signal.SIGINT, held[0])))

    return call


def _spanned(method, name):
    """*method*, recorded as one span (kind ``"collective"``, on ``torch.mpi:<group>``) while a cell is traced:
    DDP's gradient buckets, which torch's reducer hands to the group from C++, show on the timeline one by one."""
    from ..tracing import ledger
    from ..tracing.calls import record_span

    state, now = ledger.state, ledger.now_ns

    method = _stop_after_backward(method)

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if state.spans is None:
            return method(self, *args, **kwargs)
        start = now()
        try:
            return method(self, *args, **kwargs)
        finally:
            self._spans += 1
            first = args[0] if args else None
            tensor = first[0] if isinstance(first, list) and first and isinstance(first[0], torch.Tensor) else \
                first if isinstance(first, torch.Tensor) else None
            size = tensor.numel() * tensor.element_size() if tensor is not None else 0
            detail = f"{tensor.numel()} x {str(tensor.dtype).replace('torch.', '')}" if tensor is not None else ""
            record_span(name, f"torch.mpi:{self.label}", None, size, size, start, now(), self._spans, "collective",
                        detail)

    return call


for _name, _call in (("allreduce", "all_reduce"), ("reduce", "reduce"), ("broadcast", "broadcast"),
                     ("allgather", "all_gather"), ("_allgather_base", "all_gather_into_tensor"),
                     ("gather", "gather"), ("scatter", "scatter"), ("reduce_scatter", "reduce_scatter"),
                     ("_reduce_scatter_base", "reduce_scatter_tensor"), ("alltoall_base", "all_to_all_single"),
                     ("alltoall", "all_to_all"), ("barrier", "barrier")):
    setattr(MPIProcessGroup, _name, _spanned(getattr(MPIProcessGroup, _name), _call))


def _in_place():
    from mpi4py import MPI

    return MPI.IN_PLACE


_IN_PLACE = _in_place()


# the names torch.distributed calls them by in this torch (its C++ code calls the ones above), spans and all
MPIProcessGroup.all_gather_single = MPIProcessGroup._allgather_base
MPIProcessGroup.reduce_scatter_single = MPIProcessGroup._reduce_scatter_base
MPIProcessGroup.all_to_all_single = MPIProcessGroup.alltoall_base
MPIProcessGroup.all_gather_single_coalesced = MPIProcessGroup.allgather_into_tensor_coalesced
MPIProcessGroup.reduce_scatter_single_coalesced = MPIProcessGroup.reduce_scatter_tensor_coalesced
