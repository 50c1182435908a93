"""``%mpi who``, rank side: every user name on this rank with its type, shape, dtype, a short content hash and a
short summary, as plain picklable data the notebook compares across ranks.

The cost is bounded: an array, tensor or model is hashed over its first *limit* bytes at most (64 MB by
default, said in its ``note``), one call hashes *total* bytes at most, a container is hashed through a pickle
cut off after *pickle_limit* bytes, and a tensor on a GPU is copied to the host to be hashed only while the
call has copied less than *device_limit* (16 MB): a large one is left unhashed, never moved. The hash is
SHA-1 used as a fingerprint, not for security: through OpenSSL it runs at about 2 GB/s where blake2b runs at
0.35 GB/s (measured here), so a 100 MB array costs about 35 ms.

Here each value is handed to the module of its kind, which says it in words and hashes it: ``arrays.py``,
``tensors.py`` (tensors, models, optimizers), ``comms.py``, and ``objects.py`` for any other value (through its
pickle); the digest and the call's budget are in ``digests.py``.
"""

import sys
import types

import numpy as np

from .arrays import describe_array
from .comms import describe_comm, is_comm
from .digests import DEVICE_LIMIT, LIMIT, PICKLE_LIMIT, TOTAL, Budget
from .objects import describe_callable, describe_object, hash_object
from .tensors import describe_module, describe_optimizer, describe_tensor
from .text import clip

HIDDEN = frozenset({"In", "Out", "get_ipython", "exit", "quit", "MPI"})  # IPython's own names, and mpinb's MPI
_TYPE_ONLY = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)


def who(namespace=None, *, limit=LIMIT, total=TOTAL, pickle_limit=PICKLE_LIMIT, device_limit=DEVICE_LIMIT):
    """Describe the user's names in *namespace*: ``{name: {"type", "shape", "dtype", "hash", "summary", "note"}}``.

    Args:
        namespace (dict or None, default None): the names to describe; ``None`` means where cells run (the
            engine's IPython user namespace, else ``__main__``'s globals).
        limit (int, default 64 MB): bytes of one array, tensor or model's state hashed at most; the hash of a
            larger one covers its first *limit* bytes and its ``note`` says so: ``"first 64 MB"``.
        total (int, default 512 MB): bytes hashed in this call at most; names met after it is spent are hashed
            over what is left, or not at all.
        pickle_limit (int, default 4 MB): bytes of a pickled container or object hashed at most.
        device_limit (int, default 16 MB): bytes copied from GPUs to the host to be hashed in this call at
            most; a GPU tensor (or model) that does not fit is never copied: its hash is ``None``, its ``note``
            says why.

    Names starting with ``_``, modules, IPython's own names (``In``, ``Out``, ``get_ipython``, ``exit``,
    ``quit``, and whatever IPython put in the namespace itself) and mpinb's ``MPI`` are left out; ``comm``,
    ``rank`` and ``size`` stay (they show that ranks differ by design). ``"type"`` is the class name
    (``"Tensor"``, ``"ndarray"``, ``"Linear"``), ``"shape"`` a tuple or ``None``, ``"dtype"`` a name such as
    ``"float32"`` or ``None``, ``"hash"`` 8 hex digits or ``None`` (cannot be hashed cheaply: ``"note"`` says
    why), ``"summary"`` at most 40 characters. Functions, classes and optimizers get their type only (no hash);
    a ``torch.nn.Module`` its parameter count (``"parameters"``) and a hash over its ``state_dict()``.
    Never raises for a value: one that cannot be described says why in its ``note``.

    Example::

        >>> import numpy as np
        >>> who({"w": np.zeros(3, "float32"), "n": 5})["w"]["shape"]
        (3,)
    """
    hidden = {}
    if namespace is None:
        from ..runner import ipython_shell, user_namespace

        shell = ipython_shell()
        namespace = user_namespace(shell)
        hidden = getattr(shell, "user_ns_hidden", None) or {}
    budget = Budget(limit, total, pickle_limit, device_limit)
    described = {}
    for name, value in list(namespace.items()):
        if (not isinstance(name, str) or name.startswith("_") or name in HIDDEN
                or issubclass(type(value), types.ModuleType) or (name in hidden and hidden[name] is value)):
            continue
        described[name] = describe(value, budget)
    return described


def describe(value, budget=None):
    """One value's entry of :func:`who` (*budget*, shared by the values of one call, says what may be hashed)."""
    budget = budget or Budget()
    budget.start()
    entry = {"type": type(value).__name__, "shape": None, "dtype": None, "hash": None, "summary": "", "note": None}
    try:
        torch = sys.modules.get("torch")
        if is_comm(value):
            describe_comm(value, entry)
        elif torch is not None and isinstance(value, torch.nn.Module):
            describe_module(value, entry, budget)
        elif torch is not None and isinstance(value, torch.optim.Optimizer):
            describe_optimizer(value, entry)
        elif torch is not None and isinstance(value, torch.Tensor):
            describe_tensor(value, entry, budget)
        elif isinstance(value, np.ndarray):
            describe_array(value, entry, budget)
            if value.dtype.hasobject:  # pointers: hash the objects themselves, through their pickle
                hash_object(value, entry, budget)
        elif isinstance(value, _TYPE_ONLY):
            describe_callable(value, entry)
        else:
            describe_object(value, entry, budget)
    except Exception as exc:  # noqa: BLE001 - a user object may fail in any way: say so, describe the rest
        entry["hash"] = None
        try:
            why = clip(str(exc))
        except Exception:  # noqa: BLE001 - its message too
            why = "(no message)"
        entry["note"] = f"could not be described: {type(exc).__name__}: {why}"
    if not entry["summary"]:
        entry["summary"] = f"<{entry['type']}>"
    return entry
