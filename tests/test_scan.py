"""The inspector's one pass (``mpinb/notebook/models/scan.py``) against numpy's own reductions, value by value."""

import math

import numpy as np
import pytest
from mpinb.notebook.models import scan as scanning


def expected(arrays):
    first = arrays[min(arrays)].astype(np.float64)
    out = {}
    for rank, array in arrays.items():
        values = array.astype(np.float64)
        sums = {"min": values.min(), "max": values.max(), "mean": values.mean(), "norm": np.linalg.norm(values)}
        out[rank] = (sums, float(np.abs(values - first).max()))
    return out


def assert_scanned(arrays):
    got, want = scanning.scan(arrays), expected(arrays)
    assert sorted(got) == sorted(want)
    for rank in want:
        (sums, difference), (want_sums, want_difference) = got[rank], want[rank]
        assert difference == pytest.approx(want_difference, rel=1e-6, abs=0)
        for key in ("min", "max"):
            assert sums[key] == want_sums[key]
        for key in ("mean", "norm"):
            assert sums[key] == pytest.approx(want_sums[key], rel=1e-5)
    return got


@pytest.fixture(params=[np.float32, np.float64])
def base(request):
    size = 3 * scanning.BLOCK + 1234  # blocks shared out to the threads, the last one short
    return np.random.default_rng(7).standard_normal(size).astype(request.param)


def test_replicas_in_sync_are_scanned_exactly_with_no_difference(base):
    got = assert_scanned({rank: base.copy() for rank in range(4)})
    assert all(difference == 0.0 for _, difference in got.values())
    assert len({tuple(sums.values()) for sums, _ in got.values()}) == 1


def test_a_rank_that_differs_in_one_block_only_has_its_own_sums(base):
    arrays = {rank: base.copy() for rank in range(3)}
    arrays[2][scanning.BLOCK + 5] += 3.0  # one value, in the second block: the others are the first rank's
    arrays[1][-1] = -0.0 if arrays[1][-1] == 0.0 else arrays[1][-1]
    got = assert_scanned(arrays)
    assert got[2][1] == pytest.approx(3.0, rel=1e-6) and got[1][1] == 0.0
    assert got[2][0]["max"] >= got[0][0]["max"] and got[2][0]["mean"] != got[0][0]["mean"]


def test_replicas_apart_everywhere(base):
    assert_scanned({rank: base + rank for rank in range(4)})


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_value_not_finite_in_any_block_of_any_rank_leaves_it_to_the_exact_path(base, bad):
    for rank in (0, 2):
        arrays = {r: base.copy() for r in range(3)}
        arrays[rank][2 * scanning.BLOCK + 7] = bad
        assert scanning.scan(arrays) is None


def test_fortran_order_is_read_as_it_lies(base):
    square = base[:700 * 1000].reshape(700, 1000)
    arrays = {0: np.asfortranarray(square), 1: np.asfortranarray(square * 2)}
    assert_scanned(arrays)


def test_sums_past_float32s_range_leave_it_to_the_exact_path():
    """A mask filled with float32's lowest value: its values are finite, their float32 sums are not."""
    lowest = np.full(2 * scanning.BLOCK, np.finfo(np.float32).min, dtype=np.float32)
    with np.errstate(all="raise"):  # nothing said about the overflow: it is found, not warned of
        assert scanning.scan({0: lowest, 1: lowest.copy()}) is None


def test_a_difference_past_float32s_range_is_taken_in_float64():
    """Finite float32 values of opposite signs near its largest: their difference (6.8e38) is not a float32. The
    scan leaves such a leaf to the exact path (a square past 1.8e19 overflows its float32 sums first), which takes
    that difference in float64, not as inf."""
    from mpinb.notebook.models.leaf_reports import _difference

    largest = np.finfo(np.float32).max
    arrays = {rank: np.zeros(2 * scanning.BLOCK, dtype=np.float32) for rank in (0, 1)}
    arrays[0][scanning.BLOCK + 3], arrays[1][scanning.BLOCK + 3] = largest, -largest
    assert scanning.scan(arrays) is None
    same, difference = _difference(arrays[1], arrays[0])
    assert not same and difference == 2 * float(largest)
    arrays[1][5] = np.inf  # a value not finite: inf is the difference there
    assert _difference(arrays[1], arrays[0]) == (False, math.inf)
