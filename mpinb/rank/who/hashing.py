"""Content hashes for ``%mpi who``: what one call may still hash, and arrays, tensors, models and communicators
fed into SHA-1 within that budget, a large GPU tensor never copied to the host."""

import hashlib
import sys

import numpy as np

from .text import MB, clip, size_text

LIMIT = 64 * MB  # bytes of one array, tensor or model hashed at most
TOTAL = 512 * MB  # bytes hashed in one call at most
PICKLE_LIMIT = 4 * MB  # bytes of a pickled container hashed at most
DEVICE_LIMIT = 16 * MB  # a GPU tensor (or model) larger than this is not copied to the host to be hashed


class Budget:
    """What one call of :func:`who` may still hash and copy from GPUs; *partial*: the current hash was cut off."""

    def __init__(self, limit=LIMIT, total=TOTAL, pickle_limit=PICKLE_LIMIT, device_limit=DEVICE_LIMIT):
        self.limit, self.left, self.pickle_limit, self.device_left = limit, total, pickle_limit, device_limit
        self.start()

    def start(self):
        """A new name: it may hash its own limit, or what is left of the call's total."""
        self.allowed = self.room = min(self.limit, self.left)
        self.partial = False

    def take(self, nbytes):
        """How many of *nbytes* may be hashed now (the rest is cut off, and that is noted)."""
        taken = max(0, min(nbytes, self.room))
        self.room -= taken
        self.left -= taken
        if taken < nbytes:
            self.partial = True
        return taken

    def cut_note(self):
        if not self.partial:
            return None
        return f"first {size_text(self.allowed)}" if self.allowed else "not hashed: who's total spent"


def hasher(*header):
    """A hash that starts with *header* (type, shape, dtype): equal bytes of other shapes hash apart."""
    return hashlib.sha1(repr(header).encode(), usedforsecurity=False)


def short(digest):
    return digest.hexdigest()[:8]


# ---------------------------------------------------------------- numpy


def feed_array(digest, array, budget):
    """Hash *array*'s bytes in C order, as many as *budget* allows (a prefix copied when not contiguous)."""
    room = budget.take(array.nbytes)
    if room > 0:
        digest.update(_head(array, room).reshape(-1).view(np.uint8)[:room])


def _head(array, nbytes):
    """A C-contiguous array holding at least the first *nbytes* of *array* in C order (and not much more)."""
    if array.flags.c_contiguous:
        return array.reshape(-1)[: -(-nbytes // array.itemsize)]
    if array.nbytes <= nbytes or array.ndim == 0:
        return np.ascontiguousarray(array)
    row = array.nbytes // array.shape[0]
    if row <= nbytes:
        return np.ascontiguousarray(array[: -(-nbytes // row)])
    return _head(array[0], nbytes)


def first_elements(array, count):
    """The first *count* elements of *array* in C order, flat, without touching the rest."""
    if array.size == 0:
        return array.reshape(-1)
    while array.ndim > 1 and array[0].size >= count:
        array = array[0]
    if array.ndim > 1:
        array = array[: -(-count // array[0].size)]
    return array.reshape(-1)[:count]



# ---------------------------------------------------------------- torch


def feed_tensor(digest, tensor, budget):
    """Hash *tensor*'s bytes as *budget* allows; return why it cannot be hashed, or ``None``."""
    torch = sys.modules["torch"]
    tensor = tensor.detach()
    if tensor.layout != torch.strided or tensor.is_quantized:
        kind = "quantized" if tensor.is_quantized else str(tensor.layout).replace("torch.", "")
        return f"not hashed: {kind} tensor"
    if tensor.device.type == "meta":
        return "not hashed: no data (meta tensor)"
    nbytes = tensor_nbytes(tensor)
    on_device = tensor.device.type != "cpu"
    if on_device and budget.room > 0 and nbytes > budget.device_left:
        return f"not hashed: {size_text(nbytes)} on {tensor.device}, not copied to the host"
    room = budget.take(nbytes)
    if room <= 0:
        return None
    head = _head_tensor(tensor, room)
    if on_device:
        budget.device_left -= tensor_nbytes(head)
        head = head.cpu()
    raw = head.resolve_conj().resolve_neg().reshape(-1).view(torch.uint8)
    digest.update(raw.numpy()[:room])
    return None


def tensor_nbytes(tensor):
    return tensor.numel() * tensor.element_size()


def _head_tensor(tensor, nbytes):
    if tensor.is_contiguous():
        return tensor.reshape(-1)[: -(-nbytes // tensor.element_size())]
    if tensor_nbytes(tensor) <= nbytes or tensor.dim() == 0:
        return tensor.contiguous()
    row = tensor_nbytes(tensor) // tensor.shape[0]
    if row <= nbytes:
        return tensor[: -(-nbytes // row)].contiguous()
    return _head_tensor(tensor[0], nbytes)


def first_tensor_elements(tensor, count):
    tensor = tensor.detach()
    if tensor.numel() == 0:
        return np.zeros(0)
    while tensor.dim() > 1 and tensor[0].numel() >= count:
        tensor = tensor[0]
    if tensor.dim() > 1:
        tensor = tensor[: -(-count // tensor[0].numel())]
    flat = tensor.reshape(-1)[:count].cpu().resolve_conj().resolve_neg()
    if flat.dtype.is_floating_point and flat.element_size() < 4:
        flat = flat.float()  # bfloat16, float16 and float8 print through float32
    try:
        return flat.numpy()
    except (TypeError, RuntimeError):
        return np.array(flat.tolist())


def module_digest(module, budget):
    """A hash over *module*'s ``state_dict()`` (names, shapes, dtypes, bytes), and why not when it cannot be."""
    state = module.state_dict()
    on_device = [t for t in state.values() if hasattr(t, "device") and t.device.type != "cpu"]
    device_bytes = sum(tensor_nbytes(t) for t in on_device)
    if device_bytes > budget.device_left:
        where = ", ".join(sorted({str(t.device) for t in on_device}))
        return None, f"not hashed: {size_text(device_bytes)} of state on {where}, not copied to the host"
    digest = hasher(type(module).__name__)
    for key, tensor in state.items():
        if hasattr(tensor, "detach"):
            digest.update(repr((key, tuple(tensor.shape), str(tensor.dtype))).encode())
            why = feed_tensor(digest, tensor, budget)
            if why:
                return None, f"not hashed: {key} is {why.removeprefix('not hashed: ')}"
        else:
            digest.update(repr((key, tensor)).encode())  # extra state: whatever the module keeps
    return digest, None


# ---------------------------------------------------------------- mpi4py


def is_comm(value):
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and isinstance(value, mpi.Comm)


def describe_comm(comm, entry):
    """A communicator by its name and size (a handle does not pickle, and its address means nothing elsewhere)."""
    mpi = sys.modules["mpi4py.MPI"]
    if comm == mpi.COMM_NULL:
        entry["summary"], entry["hash"] = "COMM_NULL", short(hasher(entry["type"], "COMM_NULL"))
        return
    name, size = comm.Get_name(), comm.Get_size()
    entry["summary"] = clip(f"{name or 'unnamed'}, size {size}")
    entry["hash"] = short(hasher(entry["type"], name, size))
