"""Tensors as mpi4py buffers: a CPU tensor's own memory as a numpy array (no copy), the MPI reduction for each of
torch's ``ReduceOp``\\ s and dtypes, and the host copy a CUDA or non-contiguous tensor travels through."""

import numpy as np
import torch
from mpi4py import MPI
from torch.distributed import ReduceOp

# 16-bit floats: MPI has no bfloat16, and MPICH sums its FLOAT16_T element by element in generic code (55 ms for
# 10 MB between 2 ranks, against 3 ms with torch's vectorised add). Both travel as int16 (their bits) and are
# reduced by user ops that view the bits as the float type again and combine them with torch's own kernels, which
# compute each element in float32 and round once: what gloo's float16 arithmetic gives.
HALF = (torch.float16, torch.bfloat16)

_BOOL_OPS = {  # bool: what gloo's sum, product, min and max give for booleans
    ReduceOp.RedOpType.SUM: MPI.LOR, ReduceOp.RedOpType.MAX: MPI.LOR, ReduceOp.RedOpType.BOR: MPI.LOR,
    ReduceOp.RedOpType.PRODUCT: MPI.LAND, ReduceOp.RedOpType.MIN: MPI.LAND, ReduceOp.RedOpType.BAND: MPI.LAND,
    ReduceOp.RedOpType.BXOR: MPI.LXOR, ReduceOp.RedOpType.AVG: MPI.LOR,
}
_OPS = {
    ReduceOp.RedOpType.SUM: MPI.SUM, ReduceOp.RedOpType.AVG: MPI.SUM, ReduceOp.RedOpType.PRODUCT: MPI.PROD,
    ReduceOp.RedOpType.MIN: MPI.MIN, ReduceOp.RedOpType.MAX: MPI.MAX, ReduceOp.RedOpType.BAND: MPI.BAND,
    ReduceOp.RedOpType.BOR: MPI.BOR, ReduceOp.RedOpType.BXOR: MPI.BXOR,
}
_HALF_KERNELS = {
    ReduceOp.RedOpType.SUM: lambda a, b: a.add_(b), ReduceOp.RedOpType.AVG: lambda a, b: a.add_(b),
    ReduceOp.RedOpType.PRODUCT: lambda a, b: a.mul_(b),
    ReduceOp.RedOpType.MIN: lambda a, b: torch.minimum(a, b, out=a),
    ReduceOp.RedOpType.MAX: lambda a, b: torch.maximum(a, b, out=a),
}
_half_ops = {}  # (dtype, op type) -> MPI user op


def op_type(op):
    """The ``RedOpType`` of a ``ReduceOp`` (or of a ``RedOpType``)."""
    return getattr(op, "op", op)


def mpi_op(op, dtype):
    """The MPI op that reduces tensors of *dtype* as torch's *op* (a ``RedOpType``); ``AVG`` is a sum here, divided
    afterwards by :func:`finish`. Each (op, dtype) is worked out once: a training step asks again and again."""
    try:
        return _known_ops[(op, dtype)]
    except KeyError:
        found = _known_ops[(op, dtype)] = _mpi_op(op, dtype)
        return found


_known_ops = {}  # (op, dtype) -> its MPI op


def _mpi_op(op, dtype):
    if op == ReduceOp.RedOpType.PREMUL_SUM:
        raise ValueError("ReduceOp.PREMUL_SUM is NCCL's (a factor applied before the sum): multiply the tensor by "
                         "the factor and use ReduceOp.SUM")
    if dtype == torch.bool:
        return _BOOL_OPS[op]
    if dtype in HALF:
        key = (dtype, op)
        if key not in _half_ops:
            kernel = _HALF_KERNELS.get(op)
            if kernel is None:
                raise ValueError(f"ReduceOp.{op.name} is for integers and booleans, not {dtype}")

            def combine(incoming, inout, datatype, dtype=dtype, kernel=kernel):
                kernel(torch.frombuffer(inout, dtype=dtype), torch.frombuffer(incoming, dtype=dtype))

            _half_ops[key] = MPI.Op.Create(combine, commute=True)
        return _half_ops[key]
    if op in (ReduceOp.RedOpType.BAND, ReduceOp.RedOpType.BOR, ReduceOp.RedOpType.BXOR) and \
            dtype.is_floating_point:
        raise ValueError(f"ReduceOp.{op.name} is for integers and booleans, not {dtype}")
    return _OPS[op]


def finish(tensor, op, size):
    """What is left of *op* after MPI's reduction: ``AVG`` divides by *size* (integers by floor division, as
    ``torch.div(..., rounding_mode="floor")``)."""
    if op == ReduceOp.RedOpType.AVG and tensor.dtype != torch.bool:
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
            tensor.div_(size)
        else:
            tensor.div_(size, rounding_mode="floor")


def array(tensor):
    """A contiguous CPU tensor's memory as a flat numpy array of its elements (no copy); 16-bit floats, which
    numpy lacks or MPI reduces slowly, as their bits (int16), with :func:`mpi_op` knowing what they are."""
    flat = tensor.detach().reshape(-1)
    if tensor.dtype in HALF:
        flat = flat.view(torch.int16)
    elif tensor.dtype == torch.bool:
        return flat.numpy().view(np.bool_)
    return flat.numpy()


def on_host(tensor):
    """``(host, write_back)``: *tensor* as a contiguous CPU tensor (itself when it is one), and whether results
    written into the host copy must be copied back (a CUDA tensor, a non-contiguous one)."""
    if tensor.device.type == "cpu" and tensor.is_contiguous():
        return tensor, False
    return tensor.detach().to("cpu", memory_format=torch.contiguous_format).contiguous(), True


class Hosted:
    """The host copies of some tensors for one call, and the copy back of the results (``done``)."""

    __slots__ = ("pairs",)

    def __init__(self):
        self.pairs = []

    def __call__(self, tensor, *, back=True):
        host, copy = on_host(tensor)
        if copy and back:
            self.pairs.append((tensor, host))
        return host

    def done(self):
        for tensor, host in self.pairs:
            tensor.detach().copy_(host)
