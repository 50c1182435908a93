"""Tensors as mpi4py buffers: a CPU tensor's own memory as a numpy array (no copy), the MPI reduction for each of
torch's ``ReduceOp``\\ s and dtypes, and the host copy a CUDA or non-contiguous tensor travels through."""

import torch
from mpi4py import MPI
from torch.distributed import ReduceOp

# 16-bit floats: MPI has no bfloat16, and MPICH sums its FLOAT16_T element by element in generic code (55 ms for
# 10 MB between 2 ranks, against 3 ms with torch's vectorised add). Both travel as int16 (their bits) and are
# reduced by user ops that view the bits as the float type again and combine them with torch's own kernels, which
# compute each element in float32 and round once: what gloo's float16 arithmetic gives.
HALF = (torch.float16, torch.bfloat16)

_R = ReduceOp.RedOpType
# torch's reductions as the integers their enum holds: comparing and hashing pybind's enum members costs a
# microsecond each, on every call of a training step
SUM, AVG, PRODUCT, MIN, MAX = (_R.SUM.value, _R.AVG.value, _R.PRODUCT.value, _R.MIN.value, _R.MAX.value)
BAND, BOR, BXOR, PREMUL_SUM = (_R.BAND.value, _R.BOR.value, _R.BXOR.value, _R.PREMUL_SUM.value)
NAMES = {member.value: name for name, member in _R.__members__.items()}

_BOOL_OPS = {  # bool: what gloo's sum, product, min and max give for booleans
    SUM: MPI.LOR, MAX: MPI.LOR, BOR: MPI.LOR, PRODUCT: MPI.LAND, MIN: MPI.LAND, BAND: MPI.LAND, BXOR: MPI.LXOR,
    AVG: MPI.LOR,
}
_OPS = {SUM: MPI.SUM, AVG: MPI.SUM, PRODUCT: MPI.PROD, MIN: MPI.MIN, MAX: MPI.MAX, BAND: MPI.BAND, BOR: MPI.BOR,
        BXOR: MPI.BXOR}
_HALF_KERNELS = {
    SUM: lambda a, b: a.add_(b), AVG: lambda a, b: a.add_(b), PRODUCT: lambda a, b: a.mul_(b),
    MIN: lambda a, b: torch.minimum(a, b, out=a), MAX: lambda a, b: torch.maximum(a, b, out=a),
}
_half_ops = {}  # (dtype, op) -> MPI user op


def op_code(op):
    """The integer of torch's reduction *op* (a ``ReduceOp``, a ``RedOpType`` or its integer)."""
    op = getattr(op, "op", op)
    return getattr(op, "value", op)


def mpi_op(op, dtype):
    """The MPI op that reduces tensors of *dtype* as torch's *op* (an :func:`op_code`); ``AVG`` is a sum here,
    divided afterwards by :func:`finish`. Each (op, dtype) is worked out once: a training step asks again and
    again."""
    try:
        return _known_ops[(op, dtype)]
    except KeyError:
        found = _known_ops[(op, dtype)] = _mpi_op(op, dtype)
        return found


_known_ops = {}  # (op, dtype) -> its MPI op


def _mpi_op(op, dtype):
    if op == PREMUL_SUM:
        raise ValueError("ReduceOp.PREMUL_SUM is NCCL's (a factor applied before the sum): multiply the tensor by "
                         "the factor and use ReduceOp.SUM")
    if dtype == torch.bool:
        return _BOOL_OPS[op]
    if dtype in HALF:
        key = (dtype, op)
        if key not in _half_ops:
            kernel = _HALF_KERNELS.get(op)
            if kernel is None:
                raise ValueError(f"ReduceOp.{NAMES[op]} is for integers and booleans, not {dtype}")

            def combine(incoming, inout, datatype, dtype=dtype, kernel=kernel):
                kernel(torch.frombuffer(inout, dtype=dtype), torch.frombuffer(incoming, dtype=dtype))

            _half_ops[key] = MPI.Op.Create(combine, commute=True)
        return _half_ops[key]
    if op in (BAND, BOR, BXOR) and dtype.is_floating_point:
        raise ValueError(f"ReduceOp.{NAMES[op]} is for integers and booleans, not {dtype}")
    return _OPS[op]


def finish(tensor, op, size):
    """What is left of *op* after MPI's reduction: ``AVG`` divides by *size* (integers by floor division, as
    ``torch.div(..., rounding_mode="floor")``)."""
    if op == AVG and tensor.dtype != torch.bool:
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
            tensor.div_(size)
        else:
            tensor.div_(size, rounding_mode="floor")


def array(tensor):
    """A contiguous CPU tensor's memory as a numpy array of its shape (no copy; mpi4py reads any contiguous array
    as its elements in order); 16-bit floats, which numpy lacks or MPI reduces slowly, as their bits (int16), with
    :func:`mpi_op` knowing what they are."""
    if tensor.dtype in HALF:
        return tensor.detach().view(torch.int16).numpy()
    return tensor.detach().numpy()


def on_host(tensor):
    """``(host, write_back)``: *tensor* as a contiguous CPU tensor (itself when it is one), and whether results
    written into the host copy must be copied back (a CUDA tensor, a non-contiguous one)."""
    if tensor.is_cpu and tensor.is_contiguous():
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
