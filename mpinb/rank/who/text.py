"""What ``%mpi who`` says of a value in words: its shape, dtype and a short summary (at most 40 characters), and
sizes as ``64 MB``."""

import reprlib

import numpy as np

MB = 1 << 20
SUMMARY = 40  # characters of a summary at most


def values_text(flat, more, ndim=1):
    if ndim == 0:
        return str(flat[0])
    with np.printoptions(precision=4, threshold=100, linewidth=10_000):
        text = np.array2string(np.asarray(flat), separator=" ")
    return text[:-1] + " …]" if more else text


def shape_of(value):
    try:
        shape = getattr(value, "shape", None)
    except Exception:  # noqa: BLE001 - a property of a user object may raise
        return None
    if isinstance(shape, tuple) and all(isinstance(n, (int, np.integer)) for n in shape):
        return tuple(int(n) for n in shape)
    return None


def dtype_of(value):
    if isinstance(value, (np.generic,)):
        return str(value.dtype)
    try:
        dtype = getattr(value, "dtype", None)
    except Exception:  # noqa: BLE001
        return None
    if dtype is None or not isinstance(dtype, (np.dtype, type)) and type(dtype).__module__.split(".")[0] not in (
            "torch", "numpy", "jax", "jaxlib", "tensorflow", "pandas", "ml_dtypes"):
        return None
    return str(dtype).replace("torch.", "")


class _Repr(reprlib.Repr):
    def repr_instance(self, value, level):
        try:
            return repr(value)
        except Exception as exc:  # noqa: BLE001 - a user type's __repr__ may raise
            return f"<{type(value).__name__}: repr() raised {type(exc).__name__}>"


_repr = _Repr()
_repr.maxstring = _repr.maxother = SUMMARY
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = _repr.maxfrozenset = 6


def summary_of(value):
    if isinstance(value, (bytes, bytearray)) and len(value) > SUMMARY:
        return clip(f"{len(value):,} bytes: {value[:SUMMARY]!r}")
    try:
        text = _repr.repr(value)
    except Exception as exc:  # noqa: BLE001 - a user type's __repr__ may raise
        return f"<{type(value).__name__}: repr() raised {type(exc).__name__}>"
    if isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > 6:
        text = f"{len(value):,} items: {text}"
    return clip(" ".join(text.split()))


def signature_of(value):
    if isinstance(value, type):
        return clip(f"class {value.__qualname__}")
    try:
        import inspect

        return clip(f"def {value.__name__}{inspect.signature(value)}")
    except (TypeError, ValueError, AttributeError):
        return clip(f"def {getattr(value, '__name__', type(value).__name__)}(…)")


def clip(text, width=SUMMARY):
    return text if len(text) <= width else text[: width - 1] + "…"


def size_text(nbytes):
    for unit, scale in (("GB", 1 << 30), ("MB", MB), ("kB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} bytes"
