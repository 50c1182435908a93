"""Rank sets as people write them: parse ``"0,2-4"`` safely and print ``[0, 1, 2, 3]`` as ``"0-3"``."""

import re

_ITEM = re.compile(r"^\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?$", re.ASCII)


def parse_ranks(text, size):
    """The sorted ranks named by *text* (``"0,2"``, ``"1-3"``, ``"all"``) in a world of *size* ranks.

    Raises ``ValueError`` with a message a user can act on; nothing is evaluated.
    """
    text = text.strip()
    if text in ("all", "*", ""):
        return list(range(size))
    ranks = set()
    for item in text.split(","):
        match = _ITEM.match(item)
        if not match:
            raise ValueError(f"cannot read rank {item.strip()!r} in {text!r}: use numbers and ranges, like 0,2-3")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise ValueError(f"rank range {item.strip()!r} runs backwards: write it low-high, like {high}-{low}")
        if high >= size:  # checked before the range is built: 0-3000000 must not build three million ranks
            outside = _span(max(low, size), high)
            raise ValueError(f"rank {outside} not in this world of {size} (ranks {_span(0, size - 1)})")
        ranks.update(range(low, high + 1))
    return sorted(ranks)


def format_ranks(ranks):
    """``[0, 1, 2, 5, 7, 8]`` → ``"0-2, 5, 7-8"``."""
    ranks = sorted(set(ranks))
    parts = []
    start = prev = None
    for r in ranks:
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            parts.append(_span(start, prev))
        start = prev = r
    if start is not None:
        parts.append(_span(start, prev))
    return ", ".join(parts)


def label_ranks(ranks):
    """``"rank 2"`` or ``"ranks 0-3"``."""
    ranks = list(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def _span(start, end):
    return str(start) if start == end else f"{start}-{end}"
