"""torch's values for ``%mpi who``: a tensor by its shape, dtype, first values and a digest of its bytes (a large
one on a GPU never copied to the host), a model by its parameter count and a digest of its ``state_dict()``, an
optimizer by its parameter groups. torch is imported by the user's code, never here."""

import sys

import numpy as np

from .arrays import values_text
from .digests import hasher, short
from .text import clip, size_text


def describe_tensor(tensor, entry, budget):
    """*entry* for *tensor*: shape, dtype, its first values (its device when not the CPU) and its digest."""
    entry["shape"] = tuple(tensor.shape)
    entry["dtype"] = str(tensor.dtype).replace("torch.", "")
    digest = hasher(entry["type"], entry["shape"], entry["dtype"])
    why = feed_tensor(digest, tensor, budget)
    where = "" if tensor.device.type == "cpu" else f"{tensor.device} "
    if why:
        entry["note"] = why
        entry["summary"] = clip(f"{where}{size_text(tensor_nbytes(tensor))}")
        return
    entry["hash"], entry["note"] = short(digest), budget.cut_note()
    if entry["note"] == "not hashed: who's total spent":
        entry["hash"] = None
    first = first_tensor_elements(tensor, 6)
    entry["summary"] = clip(where + values_text(first, tensor.numel() > 6, tensor.dim()))


def describe_module(module, entry, budget):
    """*entry* for a ``torch.nn.Module``: its parameter count, its devices, and a digest of its state."""
    parameters = sum(p.numel() for p in module.parameters())
    entry["parameters"] = parameters
    devices = sorted({str(t.device) for t in module.state_dict().values() if hasattr(t, "device")})
    where = "" if devices in ([], ["cpu"]) else f", {', '.join(devices)}"
    entry["summary"] = clip(f"{parameters:,} parameters{where}")
    digest, why = module_digest(module, budget)
    if why:
        entry["note"] = why
        return
    entry["hash"], entry["note"] = short(digest), budget.cut_note()
    if entry["note"] == "not hashed: who's total spent":
        entry["hash"] = None


def describe_optimizer(optimizer, entry):
    """*entry* for a ``torch.optim.Optimizer``: its parameter groups, no digest."""
    groups = len(optimizer.param_groups)
    entry["summary"] = f"{groups} parameter group{'s' if groups != 1 else ''}"


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
