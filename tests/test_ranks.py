import pytest

from mpinb.wire.ranks import format_ranks, label_ranks, parse_ranks


@pytest.mark.parametrize(
    "text, size, expected",
    [("0,2", 4, [0, 2]), ("1-3", 4, [1, 2, 3]), (" 3 , 0-1 ", 4, [0, 1, 3]), ("all", 3, [0, 1, 2]), ("0", 1, [0])],
)
def test_parse_ranks(text, size, expected):
    assert parse_ranks(text, size) == expected


@pytest.mark.parametrize(
    "text, message",
    [("4", "not in this world of 4"), ("__import__('os')", "cannot read rank"), ("3-1", "runs backwards"),
     ("1,,2", "cannot read rank")],
)
def test_parse_ranks_rejects_with_a_hint(text, message):
    with pytest.raises(ValueError, match=message):
        parse_ranks(text, 4)


def test_format_ranks_compresses_runs():
    assert format_ranks([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"
    assert label_ranks([3]) == "rank 3"
    assert label_ranks([0, 1, 2, 3]) == "ranks 0-3"


@pytest.mark.parametrize("text", ["\uff10", "\u0660-\u0661", "1\uff0d2", "\u00b2"])
def test_parse_ranks_reads_ascii_digits_only(text):
    with pytest.raises(ValueError, match="cannot read rank"):
        parse_ranks(text, 4)


def test_a_huge_range_is_refused_before_it_is_built():
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"rank 4-3000000 not in this world of 4 \(ranks 0-3\)"):
            parse_ranks("0-3000000", 4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # three million ranks in a set would take over 100 MB
