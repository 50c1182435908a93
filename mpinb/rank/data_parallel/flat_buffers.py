"""Tensors as MPI buffers for the data-parallel functions: buckets of one dtype, fused into flat CPU buffers that
are kept and reused, cut into pieces of the size MPI reduces fastest, each with its MPI datatype."""

import torch

_MPI_TYPES = {  # torch dtype -> name of the MPI datatype for its elements
    torch.float32: "FLOAT", torch.float64: "DOUBLE", torch.float16: "FLOAT16_T", torch.bfloat16: "BFLOAT16_T",
    torch.int32: "INT32_T", torch.int64: "INT64_T", torch.uint8: "UINT8_T", torch.int8: "INT8_T",
    torch.bool: "C_BOOL",
}

IN_PLACE_BYTES = 1 << 20  # a gradient this big is reduced in its own memory: fusing it would only add copies
CHUNK_BYTES = 2 << 20  # Allreduce piece size (measured fastest for 2-4 MB on MPICH over shared memory)


def wire_buffer(grads, compression, *, slot, divide_by=1, in_place=True):
    """The flat buffer a bucket's *grads* are reduced in: the gradient itself when it is big enough and already
    in the wire dtype, else a fused copy converted to it. Compressed values are divided before the sum (an fp16
    sum of undivided gradients can overflow); uncompressed ones after it, piece by piece."""
    wire = _wire_dtype(grads[0].dtype, compression)
    if in_place and _reducible_in_place(grads, wire):
        return grads[0].view(-1)
    flat = flatten(grads, dtype=wire, slot=slot)
    if compression and divide_by != 1:
        flat.div_(divide_by)
    return flat


def _reducible_in_place(tensors, wire_dtype):
    (tensor, *more) = tensors
    return (not more and tensor.is_contiguous() and tensor.device.type == "cpu" and tensor.dtype == wire_dtype
            and tensor.numel() * tensor.element_size() >= IN_PLACE_BYTES)


def chunks(flat):
    """``(piece, [memory, count, datatype])`` for pieces of a flat tensor of at most :data:`CHUNK_BYTES`."""
    step = max(1, CHUNK_BYTES // flat.element_size())
    pieces = [flat[start:start + step] for start in range(0, flat.numel(), step)]
    return [(piece, mpi_buffer(piece)) for piece in pieces]


def buckets_of(named, *, bucket_bytes):
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


def flatten(tensors, dtype=None, *, slot=0):
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


def unflatten(flat, tensors, sizes=None):
    """Copy *flat* back into *tensors* (``None`` entries are skipped; *sizes* then says how much each took)."""
    offset = 0
    for i, tensor in enumerate(tensors):
        n = sizes[i] if sizes is not None else tensor.numel()
        if tensor is not None:
            tensor.copy_(flat[offset:offset + n].view(tensor.shape))
        offset += n


def mpi_buffer(flat, *, moving_only=False):
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
