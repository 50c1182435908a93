"""What the tensor inspector shows after ``%%mpi --gather``, computed: per gathered leaf, per rank statistics, each
rank's largest difference to the first rank's copy, and one verdict.

:func:`inspect_gathered` builds plain reports (tests assert on them), which ``widgets/inspector.py`` draws.
Statistics come from the ranks, except for large float arrays, whose statistics are taken here in the pass that
compares each rank with the first (:mod:`mpinb.notebook.models.scan`).
"""

import math
from dataclasses import dataclass, field

import numpy as np

from ...widgets.text import number
from ...wire.array_stats import HISTOGRAM_SAMPLE, computable, histogram, leaf_stats
from ...wire.framework_arrays import framework_array
from ...wire.gathered import scannable
from ...wire.ranks import label_ranks
from .scan import scan



@dataclass
class LeafReport:
    """One array (or scalar) inside a gathered name, across ranks."""

    name: str
    path: tuple
    stats: dict = field(default_factory=dict)  # rank -> statistics from the rank (arrays) or {"value": v}
    diff: dict = field(default_factory=dict)  # rank -> max |x_rank - x_first| (0.0 identical, nan with NaNs)
    differing: list = field(default_factory=list)
    missing: list = field(default_factory=list)
    verdict: str = ""

    @property
    def label(self):
        return self.name + "".join(f"[{key!r}]" for key in self.path)

    @property
    def identical(self):
        return not self.differing and not self.missing

    def all_nan(self, rank):
        """Whether every value of *rank*'s (non-empty) array is NaN."""
        return all_nan(self.stats[rank])


def inspect_gathered(gathered, stats):
    """Reports for every leaf of every gathered name: ``gathered`` name → PerRank, ``stats`` name → rank → path."""
    reports = []
    for name, per_rank in gathered.items():
        ranks = sorted(per_rank)
        paths = {}
        for rank in ranks:
            for path, leaf in _leaves(per_rank[rank]):
                paths.setdefault(path, {})[rank] = leaf
        for path, leaves in paths.items():
            report = LeafReport(name, path, missing=[r for r in ranks if r not in leaves])
            for rank, leaf in leaves.items():
                rank_stats = (stats.get(name) or {}).get(rank) or {}
                report.stats[rank] = rank_stats.get(path) or _describe(leaf)
            if not _scan(report, leaves):
                _complete(report, leaves)
                _compare(report, leaves)
            report.verdict = verdict(report)
            reports.append(report)
    return reports


def _scan(report, leaves):
    """Statistics the ranks left to the notebook, and the comparison, in one pass (:mod:`mpinb.notebook.models.scan`) when
    every rank's copy is a large float array like the first's; False (nothing changed) when it cannot."""
    if not all(report.stats[rank].get("scan") for rank in leaves):
        return False
    arrays = {rank: _as_numpy(leaf) for rank, leaf in leaves.items()}
    first = arrays[min(arrays)]
    if not all(scannable(a) and a.shape == first.shape and a.dtype == first.dtype
               and a.flags.c_contiguous == first.flags.c_contiguous for a in arrays.values()):
        return False
    scanned = scan(arrays)
    if scanned is None:  # some value is not finite: the exact path counts and places them
        return False
    for rank, (sums, difference) in scanned.items():
        stats = report.stats[rank] = {key: v for key, v in report.stats[rank].items() if key != "scan"}
        stats.update(sums, nan=0, inf=0)
        flat = arrays[rank].ravel(order="K")
        stride = -(-flat.size // HISTOGRAM_SAMPLE)
        stats["histogram"], stats["histogram_stride"] = histogram(flat[::stride], sums["min"], sums["max"]), stride
        report.diff[rank] = difference
        if difference != 0.0:
            report.differing.append(rank)
    return True


def _complete(report, leaves):
    """Statistics the ranks left to the notebook (``scan`` set) computed here, one leaf at a time."""
    for rank, leaf in leaves.items():
        stats = report.stats[rank]
        if stats.get("scan"):
            array = _as_numpy(leaf)
            report.stats[rank] = leaf_stats(array, stats["dtype"], stats["device"]) if array is not None \
                else {key: v for key, v in stats.items() if key != "scan"}


def _leaves(value, path=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif type(value) in (list, tuple):
        for i, item in enumerate(value):
            yield from _leaves(item, (*path, i))
    else:
        yield path, value


def _as_numpy(leaf):
    """A numpy array of a tensor's or array's values (dtypes numpy lacks as float32), None for scalars."""
    if isinstance(leaf, np.ndarray):
        return leaf
    module = type(leaf).__module__
    if module.startswith("torch") and hasattr(leaf, "numpy"):
        tensor = leaf.detach().resolve_conj()
        try:
            return tensor.numpy()
        except TypeError:  # bfloat16, float8, complex32
            import torch

            return tensor.to(torch.complex64 if tensor.is_complex() else torch.float32).numpy()
    return framework_array(leaf)  # JAX, TensorFlow; None for anything else


def _describe(leaf):
    """Statistics for a leaf the rank sent none for (a scalar, or stats turned off)."""
    array = _as_numpy(leaf)
    if array is None:
        return {"value": leaf}
    dtype = getattr(leaf, "dtype", array.dtype)
    name = str(dtype) if isinstance(dtype, np.dtype) else getattr(dtype, "name", None)  # TF: "bfloat16"
    return leaf_stats(array, name if isinstance(name, str) else str(dtype).removeprefix("torch."), "cpu")


def _compare(report, leaves):
    ranks = sorted(leaves)
    first = leaves[ranks[0]]
    reference = _as_numpy(first)
    report.diff[ranks[0]] = 0.0
    outcomes = {}
    for rank in ranks[1:]:
        leaf = leaves[rank]
        array = _as_numpy(leaf)
        if reference is None or array is None:
            same = _same_scalar(leaf, first)
            outcomes[rank] = (same, 0.0 if same else _scalar_diff(leaf, first))
        elif array.shape != reference.shape or array.dtype != reference.dtype:
            outcomes[rank] = (False, math.inf)
        elif array.nbytes >= PARALLEL_BYTES:  # numpy releases the GIL: compare ranks on every core
            outcomes[rank] = _pool().submit(_difference, array, reference)
        else:
            outcomes[rank] = _difference(array, reference)
    for rank, outcome in outcomes.items():
        same, report.diff[rank] = outcome.result() if hasattr(outcome, "result") else outcome
        if not same:
            report.differing.append(rank)


PARALLEL_BYTES = 4 << 20
_threads = None


def _pool():
    global _threads
    if _threads is None:
        import os
        from concurrent.futures import ThreadPoolExecutor

        _threads = ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="mpinb-compare")
    return _threads


def _same_scalar(a, b):
    try:
        return bool(a == b) or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    except Exception:  # noqa: BLE001 - incomparable objects are different
        return False


def _scalar_diff(a, b):
    try:
        return float(abs(complex(a) - complex(b)))
    except (TypeError, ValueError):
        return math.inf


CHUNK = 1 << 16  # elements compared at a time: both chunks and their difference stay in the CPU's cache


def _difference(array, reference):
    """``(identical, max |array - reference|)``; NaNs at the same places count as identical, elsewhere as nan.

    One pass over both arrays, a chunk at a time (a whole-array temporary, or ``array_equal`` first, read
    the memory two or three times: 8.6x slower on 32 MB of float32, measured). Compared in the arrays' own
    precision, or in float32 where numpy cannot compute in it (bfloat16, float8) or would overflow (float16)."""
    array, reference = computable(array), computable(reference)
    if array.dtype.kind not in "biufc":
        return (True, 0.0) if np.array_equal(array, reference) else (False, math.inf)
    a, b = array.reshape(-1), reference.reshape(-1)
    work = np.empty(min(CHUNK, a.size), dtype=a.dtype if a.dtype.kind == "f" else np.float64)
    largest = 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, a.size, CHUNK):
            x, y = a[start:start + CHUNK], b[start:start + CHUNK]
            if a.dtype.kind == "c":
                difference = np.abs(x - y)
            else:
                difference = np.subtract(x, y, out=work[:x.size], dtype=work.dtype)
                np.abs(difference, out=difference)
            chunk = difference.max()
            if math.isinf(chunk) and a.dtype.kind == "f" and a.dtype.itemsize < 8:  # finite values whose
                # difference is past the dtype's range (float32: 3e38 and -3e38), or values not finite
                difference = np.abs(np.subtract(x, y, dtype=np.float64))
                chunk = difference.max()
            if math.isnan(chunk):
                if not np.array_equal(x, y, equal_nan=True):
                    return False, math.nan
                chunk = np.nanmax(difference) if not np.isnan(difference).all() else 0.0
            largest = max(largest, float(chunk))
    return largest == 0.0, largest


def verdict(report):
    """"identical on all ranks", or which ranks differ from the first (and by how much), or lack the leaf."""
    parts = []
    nan_ranks = [r for r, s in sorted(report.stats.items()) if all_nan(s)]
    bad = [r for r, s in sorted(report.stats.items()) if (s.get("nan") or s.get("inf")) and r not in nan_ranks]
    differing = report.differing
    if nan_ranks or bad:  # a difference that is NaN comes from those NaN or Inf, which are said below, and only them
        differing = [r for r in differing if not math.isnan(report.diff.get(r, 0.0))]
    if differing:
        worst = max(report.diff[r] for r in differing)
        parts.append(f"differs on {label_ranks(differing)} (max |Δ| {number(worst)})")
    if report.missing:
        parts.append(f"missing on {label_ranks(report.missing)}")
    if nan_ranks:
        everywhere = len(nan_ranks) == len(report.stats) and not report.differing and not report.missing
        parts.append("all NaN on every rank" if everywhere else f"all NaN on {label_ranks(nan_ranks)}")
    if bad:
        parts.append(f"NaN/Inf on {label_ranks(bad)}")
    return "; ".join(parts) if parts else "identical on all ranks"


def all_nan(stats):
    """Whether every value of a (non-empty) array is NaN."""
    size = stats.get("size")
    if size is None and "shape" in stats:
        size = math.prod(stats["shape"])
    return bool(size) and stats.get("nan") == size
