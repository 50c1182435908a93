"""``%%mpi --gather``, rank side: turn named values into one small pickle plus raw buffers, and per-leaf statistics.

Arrays and tensors travel out of band (pickle protocol 5): the pickle holds the structure (dicts, lists,
tuples, scalars) and each array's dtype and shape; the bytes go as separate buffers, written straight into
shared memory or sent as zero-copy frames. Statistics (norm, min, max, mean, NaN/Inf counts, a histogram) are
computed here, on every rank in parallel, so the notebook never scans the values to describe them.
"""

import collections
import math
import pickle

import numpy as np

HISTOGRAM_BINS = 30
HISTOGRAM_SAMPLE = 1 << 18  # values a histogram is drawn from at most (an evenly strided sample)


class TorchLeaf:
    """A torch tensor on its way to the notebook: its bytes as a numpy array, and where it lived."""

    __slots__ = ("array", "dtype", "device")

    def __init__(self, array, dtype, device):
        self.array, self.dtype, self.device = array, dtype, device

    def __reduce__(self):
        return _rebuild_tensor, (self.array, self.dtype, self.device)


def _rebuild_tensor(array, dtype, device):
    """In the notebook: a CPU tensor sharing *array*'s memory (``device`` says where it came from)."""
    import torch

    tensor = torch.from_numpy(array)
    if dtype == "bfloat16":
        tensor = tensor.view(torch.bfloat16)
    return tensor


class GatherError(Exception):
    """A value that cannot be gathered; its message names the type and what to do."""


def collect(names, namespace, *, stats=True):
    """Pack ``namespace[name]`` for each of *names*.

    Returns ``(items, buffers)``: *items* maps each name to ``{"pickle": bytes, "sizes": [...], "stats": {...}}``
    or ``{"error": "..."}``; *buffers* are the out-of-band buffers of every packed name, in order (``sizes``
    says how many bytes each of a name's buffers holds).
    """
    items, buffers = {}, []
    for name in names:
        if name not in namespace:
            items[name] = {"error": f"NameError: name {name!r} is not defined on this rank"}
            continue
        try:
            leaves = {}
            prepared = _prepare(namespace[name], (), leaves)
            own = []
            data = pickle.dumps(prepared, protocol=5, buffer_callback=own.append)
        except GatherError as exc:
            items[name] = {"error": f"{name}: {exc}"}
            continue
        except Exception as exc:  # noqa: BLE001 - whatever pickling raises means "cannot transfer"
            items[name] = {"error": f"{name}: cannot transfer {type(exc).__name__}: {exc}"}
            continue
        views = [memoryview(buffer).cast("B") for buffer in own]
        items[name] = {"pickle": data, "sizes": [view.nbytes for view in views],
                       "stats": {path: leaf_stats(*leaf) for path, leaf in leaves.items()} if stats else None}
        buffers.extend(views)
    return items, buffers


def _prepare(value, path, leaves):
    """*value* with every array-like leaf replaced by a contiguous numpy array (or a TorchLeaf around one)."""
    if isinstance(value, (dict, collections.OrderedDict)):
        prepared = {key: _prepare(item, (*path, key), leaves) for key, item in value.items()}
        return type(value)(prepared) if type(value) is not dict else prepared
    if type(value) in (list, tuple):
        return type(value)(_prepare(item, (*path, i), leaves) for i, item in enumerate(value))
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return value
    if _is_tensor(value):
        tensor = value.detach()
        device = str(tensor.device)
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype == "bfloat16":
            import torch

            array = tensor.contiguous().view(torch.int16).numpy()
            leaves[path] = (tensor.float().numpy(), dtype, device)
        else:
            array = tensor.contiguous().numpy()
            leaves[path] = (array, dtype, device)
        return TorchLeaf(array, dtype, device)
    if isinstance(value, np.generic):
        return value
    array = _as_array(value)
    if array is not None:
        array = np.ascontiguousarray(array)
        if array.dtype.hasobject:
            raise GatherError(f"an array of Python objects ({type(value).__name__}) has no raw bytes to send; "
                              "gather a numeric array, or a list of the objects")
        leaves[path] = (array, str(array.dtype), "cpu" if type(value) is np.ndarray else _device_of(value))
        return array
    try:
        pickle.dumps(value, protocol=5)
    except Exception as exc:  # noqa: BLE001
        raise GatherError(f"cannot transfer a {type(value).__module__}.{type(value).__qualname__} "
                          f"({type(exc).__name__}: {exc}); gather the numbers or arrays it holds instead") from None
    return value


def _is_tensor(value):
    return type(value).__module__.startswith("torch") and hasattr(value, "detach") and hasattr(value, "numel")


def _as_array(value):
    """A numpy array for numpy arrays, DLPack exporters (JAX, CuPy, TF) and anything with ``__array__``."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except (BufferError, TypeError, RuntimeError):  # on a device numpy cannot read: go through torch
            try:
                import torch

                return torch.from_dlpack(value).cpu().numpy()
            except Exception:  # noqa: BLE001
                pass
    if hasattr(value, "__array__"):
        return np.asarray(value)
    return None


def _device_of(value):
    device = getattr(value, "device", None)
    if callable(device):
        device = device()
    if device is None:
        devices = getattr(value, "devices", None)
        device = next(iter(devices()), None) if callable(devices) else None
    return str(device) if device is not None else "cpu"


def leaf_stats(array, dtype, device):
    """Shape, dtype, device, norm, min, max, mean, NaN and Inf counts and a histogram of one array.

    The histogram is of every value up to :data:`HISTOGRAM_SAMPLE` values, of an evenly strided sample beyond
    (``histogram_stride`` says which); everything else is exact.
    """
    stats = {"shape": tuple(array.shape), "dtype": dtype, "device": device, "size": int(array.size)}
    if array.size == 0 or array.dtype.kind not in "biuf":
        return stats
    values = array.astype(np.float64, copy=False) if array.dtype.kind in "biu" else array
    finite = np.isfinite(values)
    all_finite = bool(finite.all())
    stats["nan"] = 0 if all_finite else int(np.isnan(values).sum())
    stats["inf"] = 0 if all_finite else int(np.isinf(values).sum())
    if not all_finite:
        values = values[finite]
    if values.size == 0:
        return stats
    low, high = float(values.min()), float(values.max())
    with np.errstate(over="ignore"):
        stats.update(min=low, max=high, mean=float(values.mean()), norm=float(np.linalg.norm(values.ravel())))
    if math.isfinite(low) and math.isfinite(high):
        flat = values.ravel()
        stride = -(-flat.size // HISTOGRAM_SAMPLE)
        counts, edges = np.histogram(flat[::stride], bins=HISTOGRAM_BINS, range=(low, high) if high > low else None)
        stats["histogram"] = (counts.tolist(), edges.tolist())
        stats["histogram_stride"] = stride
    return stats
