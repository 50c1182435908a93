"""``%%mpi --gather``, rank side: turn named values into one small pickle plus raw buffers, and per-leaf statistics.

Arrays and tensors travel out of band (pickle protocol 5): the pickle holds the structure (dicts, lists,
tuples, scalars) and each array's dtype, shape and memory order; the bytes go as separate buffers, written
straight into shared memory or sent as zero-copy frames. Every value comes back with its type, shape and dtype:
torch tensors as torch tensors, JAX and TensorFlow arrays as theirs (numpy arrays when the notebook cannot import
the framework), numpy arrays as numpy arrays (0-d ones too; Fortran order kept). Dtypes numpy would pickle
in band (datetimes, ``ml_dtypes``' bfloat16 and float8) or cannot hold (torch's bfloat16, float8, complex32)
travel as their raw bytes and are viewed back. Statistics (norm, min, max, mean, NaN/Inf counts, a histogram)
are computed here, on every rank in parallel, except for large float32 and float64 arrays: the notebook reads
those anyway to compare the ranks, and takes their statistics in that same pass.
"""

import collections
import pickle

import numpy as np

from ..errors import GatherError
from ..wire.array_stats import leaf_stats
from ..wire.framework_arrays import as_array, framework
from ..wire.gathered import Packed, Unsent, scannable

_RAW = {1: "u1", 2: "u2", 4: "u4", 8: "u8"}  # a dtype travelling as raw bytes is viewed as these


class TorchLeaf:
    """A torch tensor on its way to the notebook: its bytes as a numpy array, and where it lived.

    ``shape`` is set when *array* holds raw bytes (a dtype numpy lacks, such as bfloat16): the notebook views
    them as ``dtype`` and gives them that shape.
    """

    __slots__ = ("array", "dtype", "device", "shape")

    def __init__(self, array, dtype, device, shape=None):
        self.array, self.dtype, self.device, self.shape = array, dtype, device, shape

    def __reduce__(self):
        return _rebuild_tensor, (self.array, self.dtype, self.device, self.shape)


def _rebuild_tensor(array, dtype, device, shape=None):
    """In the notebook: a CPU tensor sharing *array*'s memory (``device`` says where it came from)."""
    import torch

    tensor = torch.from_numpy(array)
    if shape is not None:
        tensor = tensor.view(getattr(torch, dtype)).reshape(shape)
    return tensor


class ArrayLeaf:
    """A numpy array whose bytes travel as unsigned integers (``dtype`` set), or a JAX or TensorFlow array."""

    __slots__ = ("array", "dtype", "framework")

    def __init__(self, array, dtype, framework):
        self.array, self.dtype, self.framework = array, dtype, framework

    def __reduce__(self):
        return _rebuild_array, (self.array, self.dtype, self.framework)


def _rebuild_array(array, dtype, framework):
    """In the notebook: *array* viewed as *dtype*, as a CPU array of *framework* when it can be imported here."""
    if dtype is not None:
        array = array.view(dtype)
    if framework == "jax":
        try:
            import jax
        except ImportError:
            return array
        return jax.device_put(array, jax.devices("cpu")[0])
    if framework == "tensorflow":
        try:
            import tensorflow as tf
        except ImportError:
            return array
        with tf.device("CPU:0"):
            return tf.constant(array)
    return array


def collect(names, namespace, *, stats=True):
    """Pack ``namespace[name]`` for each of *names*.

    Returns ``(items, buffers)``: *items* maps each name to a :class:`~mpinb.wire.gathered.Packed` or an
    :class:`~mpinb.wire.gathered.Unsent`; *buffers* are the out-of-band buffers of every packed name, in order
    (``Packed.sizes`` says how many bytes each of a name's buffers holds).
    """
    items, buffers = {}, []
    for name in names:
        if name not in namespace:
            items[name] = Unsent(f"NameError: name {name!r} is not defined on this rank")
            continue
        try:
            leaves = {}
            prepared = _prepare(namespace[name], (), leaves)
            own = []
            data = pickle.dumps(prepared, protocol=5, buffer_callback=own.append)
        except GatherError as exc:
            items[name] = Unsent(f"{name}: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - whatever pickling raises means "cannot transfer"
            items[name] = Unsent(f"{name}: cannot transfer {type(exc).__name__}: {exc}")
            continue
        views = [buffer.raw() for buffer in own]  # bytes of C- and Fortran-ordered, empty and 0-d arrays alike
        items[name] = Packed(data, tuple(view.nbytes for view in views),
                             {path: _leaf_stats(*leaf) for path, leaf in leaves.items()} if stats else None)
        buffers.extend(views)
    return items, buffers


def _prepare(value, path, leaves):
    """*value* with every array-like leaf replaced by a numpy array, a TorchLeaf or an ArrayLeaf around one."""
    if isinstance(value, (dict, collections.OrderedDict)):
        prepared = {key: _prepare(item, (*path, key), leaves) for key, item in value.items()}
        return type(value)(prepared) if type(value) is not dict else prepared
    if type(value) in (list, tuple):
        return type(value)(_prepare(item, (*path, i), leaves) for i, item in enumerate(value))
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, np.generic)):
        return value
    if _is_tensor(value):
        return _torch_leaf(value, path, leaves)
    kind = framework(value)
    array = as_array(value, kind)
    if array is None:
        try:
            pickle.dumps(value, protocol=5)
        except Exception as exc:  # noqa: BLE001
            raise GatherError(f"cannot transfer a {type(value).__module__}.{type(value).__qualname__} "
                              f"({type(exc).__name__}: {exc}); gather the numbers or arrays it holds "
                              "instead") from None
        if isinstance(value, np.ndarray):  # a subclass (a masked array): itself, described by its data
            leaves[path] = (np.asarray(value), str(value.dtype), "cpu")
        return value
    if not (array.flags.c_contiguous or array.flags.f_contiguous):  # 0-d arrays are always contiguous
        array = np.ascontiguousarray(array)
    if kind is None:
        leaves[path] = (array, str(array.dtype), "cpu")
    else:
        leaves[path] = (array, _dtype_name(value.dtype), _device_of(value))
    raw = None
    if not array.dtype.hasobject and array.dtype.itemsize in _RAW and (
            array.dtype.kind in "mM" or array.dtype.type.__module__ == "ml_dtypes"):
        raw, array = array.dtype, array.view(_RAW[array.dtype.itemsize])  # else pickled in band, element by element
    if raw is None and kind is None:
        return array
    return ArrayLeaf(array, raw, kind)


def _torch_leaf(value, path, leaves):
    tensor = value.detach()
    device = str(tensor.device)
    tensor = tensor.cpu().contiguous().resolve_conj().resolve_neg()
    dtype = str(tensor.dtype).removeprefix("torch.")
    try:
        array = tensor.numpy()
    except TypeError:  # a dtype numpy lacks (bfloat16, float8, complex32): its raw bytes, described as float32
        import torch

        wide = tensor.to(torch.complex64 if tensor.is_complex() else torch.float32).numpy()
        leaves[path] = (wide, dtype, device)
        return TorchLeaf(tensor.reshape(-1).view(torch.uint8).numpy(), dtype, device, tuple(tensor.shape))
    leaves[path] = (array, dtype, device)
    return TorchLeaf(array, dtype, device)


def _is_tensor(value):
    return type(value).__module__.startswith("torch") and hasattr(value, "detach") and hasattr(value, "numel")


def _dtype_name(dtype):
    """``bfloat16``, ``string``, ``float32``: a framework's own name for its dtype."""
    name = getattr(dtype, "name", None)
    return name if isinstance(name, str) else str(dtype)


def _device_of(value):
    device = getattr(value, "device", None)
    if callable(device):
        device = device()
    if device is None:
        devices = getattr(value, "devices", None)
        device = next(iter(devices()), None) if callable(devices) else None
    if device is None:
        return "cpu"
    return str(device).rpartition("/device:")[2]  # TF's /job:localhost/replica:0/task:0/device:CPU:0 as CPU:0


def _leaf_stats(array, dtype, device):
    """:func:`leaf_stats`, or only shape and dtype when numpy cannot compute with the values: a value that can
    travel is never held back by its statistics. A large float32 or float64 array is only described, with
    ``scan`` set: the notebook reads it anyway to compare the ranks, and takes its statistics in the same pass
    (:mod:`mpinb.notebook.models.scan`)."""
    if dtype == str(array.dtype) and scannable(array):
        return {"shape": tuple(array.shape), "dtype": dtype, "device": device, "size": int(array.size), "scan": True}
    try:
        return leaf_stats(array, dtype, device)
    except Exception:  # noqa: BLE001
        return {"shape": tuple(array.shape), "dtype": dtype, "device": device, "size": int(array.size)}
