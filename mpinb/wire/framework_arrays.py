"""Arrays of other frameworks as numpy arrays, the same on the ranks (which gather them) and in the notebook (which
compares and describes them): JAX's and TensorFlow's arrays, anything with ``__array__``, and DLPack exporters."""

import sys

import numpy as np


def framework(value):
    """``"jax"`` or ``"tensorflow"`` for their arrays (only when the rank has imported them), else None."""
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(value, getattr(jax, "Array", ())):
        return "jax"
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(value, (getattr(tf, "Tensor", ()), getattr(tf, "Variable", ()))):
        return "tensorflow"
    return None


def framework_array(value):
    """A numpy array of a JAX array's or TensorFlow tensor's values (TF strings as bytes objects), else None."""
    kind = framework(value)
    return None if kind is None else as_array(value, kind)


def as_array(value, kind=None):
    """A numpy array for numpy arrays, JAX and TF arrays, anything with ``__array__``, and DLPack exporters
    (CuPy); None for anything else, ndarray subclasses included (they travel as themselves). *kind*: what
    :func:`framework` said of it."""
    if type(value) is np.ndarray or isinstance(value, np.memmap):
        return np.asarray(value)
    if isinstance(value, np.ndarray):
        return None
    if kind == "tensorflow":  # never TF's __dlpack__: it aborts the process on a string tensor
        array = value.numpy()  # strings as bytes objects
        if not isinstance(array, np.ndarray):  # 0-d: a numpy (or ml_dtypes) scalar, or bytes
            array = np.array(array, dtype=object if isinstance(array, bytes) else None)
        return array
    if kind == "jax":
        return np.asarray(value)
    if hasattr(value, "__array__"):
        try:
            return np.asarray(value)
        except Exception:  # noqa: BLE001 - CuPy refuses an implicit copy off the device: DLPack below
            if not hasattr(value, "__dlpack__"):
                raise
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except (BufferError, TypeError, RuntimeError):  # on a device numpy cannot read: go through torch
            try:
                import torch

                return torch.from_dlpack(value).cpu().numpy()
            except Exception:  # noqa: BLE001
                pass
    return None
