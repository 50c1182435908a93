"""The process group: each of ``torch.distributed``'s calls as buffer-based mpi4py calls on the group's own MPI
communicator, on the tensors' memory. Collectives run to their end inside the call (``async_op=True`` gets a
``Work`` that is already done); ``isend`` and ``irecv`` return MPI requests to wait on."""

import numpy
import torch
import torch.distributed as dist

from . import work
from .agreement import agree
from .buffers import SUM, Hosted, array, finish, mpi_op, op_code
from .spans import spanned
from .splits import split_counts, spread


class MPIProcessGroup(dist.ProcessGroup):
    """``torch.distributed``'s calls on the ranks of *comm* (an mpi4py intracommunicator this group owns), with
    the rank and size MPI gives it.

    Under ``%%mpi`` *comm* is a traced communicator, so every call is in the rank's ledger of collectives and, in
    a traced cell, on the timeline: DistributedDataParallel's gradient buckets included, which torch's C++
    reducer hands to :meth:`allreduce` one by one during ``backward()``.
    """

    def __init__(self, comm, name):
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm, self.label = comm, name
        self._rank, self._size = comm.Get_rank(), comm.Get_size()
        self.alone = self._size == 1  # no other rank to agree with (agreement.agree)
        self.every = numpy.zeros((self._size, 4), dtype=numpy.int64)  # every rank's call, as agree checks them
        self.said = {}  # the calls this rank made: what it sent agree, and what every rank's agreeing make
        self.spans = 0  # calls recorded as spans, which numbers them alike on every rank

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
        op = op_code(opts.reduceOp) if opts is not None else SUM
        hosted = Hosted()
        for tensor in tensors:
            agree(self, "all_reduce", tensor, op=op)
            host = hosted(tensor)
            self.comm.Allreduce(_IN_PLACE, array(host), mpi_op(op, host.dtype))
            finish(host, op, self._size)
        hosted.done()
        return work.Done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts):
        op = op_code(opts.reduceOp)
        root = opts.rootRank
        hosted = Hosted()
        for tensor in tensors:
            agree(self, "reduce", tensor, root=root, op=op)
            host = hosted(tensor, back=self._rank == root)
            memory = array(host)
            self.comm.Reduce(_IN_PLACE if self._rank == root else memory, memory if self._rank == root else None,
                             mpi_op(op, host.dtype), root)
            if self._rank == root:
                finish(host, op, self._size)
        hosted.done()
        return work.Done(tensors)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = op_code(opts.reduceOp) if opts is not None else SUM
        for output, inputs in zip(outputs, input_lists):
            agree(self, "reduce_scatter", output, op=op)
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
        return work.Done(outputs)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = op_code(opts.reduceOp) if opts is not None else SUM
        agree(self, "reduce_scatter_tensor", input, op=op)
        hosted = Hosted()
        out, source = hosted(output), hosted(input, back=False)
        if source.numel() != out.numel() * self._size:
            raise ValueError(f"reduce_scatter_tensor: the input has {source.numel()} elements, not the output's "
                             f"{out.numel()} times the group's {self._size} ranks")
        self.comm.Reduce_scatter_block(array(source), array(out), mpi_op(op, out.dtype))
        finish(out, op, self._size)
        hosted.done()
        return work.Done([output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            self._reduce_scatter_base(output, input, opts)
        return work.Done(outputs)

    # --- data movement ---

    def broadcast(self, tensors, opts):
        root = opts.rootRank
        hosted = Hosted()
        for tensor in tensors:
            agree(self, "broadcast", tensor, root=root)
            host = hosted(tensor, back=self._rank != root)
            self.comm.Bcast(array(host), root)
        hosted.done()
        return work.Done(tensors)

    def allgather(self, output_lists, inputs, opts=None):
        for outputs, input in zip(output_lists, inputs):
            agree(self, "all_gather", input, count=-1)
            source = Hosted()(input, back=False)
            if all(t.numel() == source.numel() and t.dtype == source.dtype for t in outputs):
                joined = torch.empty(source.numel() * self._size, dtype=source.dtype)
                self.comm.Allgather(array(source), array(joined))
            else:
                counts = [t.numel() for t in outputs]
                joined = torch.empty(sum(counts), dtype=source.dtype)
                self.comm.Allgatherv(array(source), [array(joined), counts])
            spread(joined, outputs)
        return work.Done(output_lists)

    def _allgather_base(self, output, input, opts=None):
        agree(self, "all_gather_into_tensor", input)
        hosted = Hosted()
        out, source = hosted(output), hosted(input, back=False)
        if out.numel() != source.numel() * self._size:
            raise ValueError(f"all_gather_into_tensor: the output has {out.numel()} elements, not the input's "
                             f"{source.numel()} times the group's {self._size} ranks")
        self.comm.Allgather(array(source), array(out))
        hosted.done()
        return work.Done([output])

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        """*output_lists*: one list per rank, holding that rank's part of each of *inputs*."""
        for index, input in enumerate(inputs):
            self.allgather([[outputs[index] for outputs in output_lists]], [input], opts)
        return work.Done(output_lists)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            self._allgather_base(output, input, opts)
        return work.Done(outputs)

    def gather(self, output_lists, inputs, opts):
        root = opts.rootRank
        agree(self, "gather", inputs[0], root=root)
        source = Hosted()(inputs[0], back=False)
        if self._rank == root:
            outputs = output_lists[0]
            joined = torch.empty(source.numel() * self._size, dtype=source.dtype)
            self.comm.Gather(array(source), array(joined), root)
            spread(joined, outputs)
        else:
            self.comm.Gather(array(source), None, root)
        return work.Done(output_lists)

    def scatter(self, outputs, input_lists, opts):
        root = opts.rootRank
        agree(self, "scatter", outputs[0], root=root)
        hosted = Hosted()
        out = hosted(outputs[0])
        joined = None
        if self._rank == root:
            joined = torch.cat([t.detach().reshape(-1).cpu() for t in input_lists[0]])
        self.comm.Scatter(array(joined) if joined is not None else None, array(out), root)
        hosted.done()
        return work.Done(outputs)

    def alltoall_base(self, output, input, output_splits, input_splits, opts=None):
        agree(self, "all_to_all_single", input, count=-1 if output_splits or input_splits else None)
        hosted = Hosted()
        out, source = hosted(output), hosted(input, back=False)
        if not output_splits and not input_splits:
            self.comm.Alltoall(array(source), array(out))
        else:
            per_row_out = out[0].numel() if out.dim() and out.shape[0] else 1
            per_row_in = source[0].numel() if source.dim() and source.shape[0] else 1
            send = split_counts(input_splits, source, self._size, per_row_in)
            receive = split_counts(output_splits, out, self._size, per_row_out)
            self.comm.Alltoallv([array(source), send], [array(out), receive])
        hosted.done()
        return work.Done([output])

    def alltoall(self, outputs, inputs, opts=None):
        agree(self, "all_to_all", outputs[0], count=-1)
        sources = [t.detach().reshape(-1).cpu() for t in inputs]
        send_counts = [t.numel() for t in sources]
        receive_counts = [t.numel() for t in outputs]
        joined = torch.empty(sum(receive_counts), dtype=outputs[0].dtype)
        self.comm.Alltoallv([array(torch.cat(sources)), send_counts], [array(joined), receive_counts])
        spread(joined, outputs)
        return work.Done(outputs)

    def barrier(self, opts=None):
        agree(self, "barrier")
        self.comm.Barrier()
        return work.Done([])

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

    def shutdown(self):
        """torch calls this on ``destroy_process_group`` (of this group, or of the default one, which ends every
        group). The communicator is retired, not freed yet: a rank that destroyed its group after its last DDP step
        still stands in, on this group, for the steps the other ranks are in (``rank/settle.py``); it is freed when
        the next group is made (:func:`free_retired`), so a notebook that makes and destroys groups cell after cell
        does not pile up communicators in MPI, whose number is limited."""
        if self.comm is not None and all(comm is not self.comm for comm in RETIRED):
            RETIRED.append(self.comm)


for _name, _call in (("allreduce", "all_reduce"), ("reduce", "reduce"), ("broadcast", "broadcast"),
                     ("allgather", "all_gather"), ("_allgather_base", "all_gather_into_tensor"),
                     ("gather", "gather"), ("scatter", "scatter"), ("reduce_scatter", "reduce_scatter"),
                     ("_reduce_scatter_base", "reduce_scatter_tensor"), ("alltoall_base", "all_to_all_single"),
                     ("alltoall", "all_to_all"), ("barrier", "barrier")):
    setattr(MPIProcessGroup, _name, spanned(getattr(MPIProcessGroup, _name), _call))


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


RETIRED = []  # the communicators of destroyed groups, freed when the next group is made


def free_retired():
    """Free the communicators of the groups destroyed so far (each rank frees its own; freeing is local in MPI's
    implementations, and a communicator freed is ``COMM_NULL`` to a group that still holds it)."""
    while RETIRED:
        comm = RETIRED.pop()
        try:
            comm.Free()
        except Exception:  # noqa: BLE001 - MPI already finalised at exit: nothing to free
            pass
