"""A breakpoint of the visual debugger's panel on a rank: its line, its condition and its hit condition (DAP's, as
debugpy reads them), decided each time its line runs."""

import operator
import re

from .panel_values import describe, evaluated


class Breakpoint:
    """One breakpoint's *line*, its *condition* (an expression of the frame's names) and *hit* condition (DAP's
    ``hitCondition``: ``3`` or ``== 3``, ``>= 3``, ``% 3``, as debugpy reads it, parsed, not evaluated), and how
    often it held."""

    def __init__(self, line, condition=None, hit=None):
        self.line, self.condition, self.hits = int(line), (condition or "").strip(), 0
        self.hit = (hit or "").strip()
        form = _HIT.match(self.hit)
        self.test = (_COMPARE[form[1] or "=="], int(form[2])) if form else None  # read, never evaluated

    def holds(self, frame):
        """Whether to stop at it in *frame*, and what to say: a condition that cannot be evaluated stops, and says
        why, as debugpy does (a typo in it must not go unseen)."""
        if self.condition:
            try:
                if not evaluated(self.condition, frame):
                    return False, ""
            except Exception as exc:  # noqa: BLE001 - the user's expression may raise anything
                return True, f"the condition {self.condition!r} raised {describe(exc)}"
        self.hits += 1
        if not self.hit:
            return True, ""
        if self.test is None or (self.test[0] is _every and self.test[1] == 0):
            return True, f"the hit condition {self.hit!r} is not N, == N, >= N, > N, <= N, < N or % N (N > 0 for %)"
        compare, count = self.test
        return compare(self.hits, count), ""


def _every(hits, count):
    return hits % count == 0


_HIT = re.compile(r"^(==|>=|<=|>|<|%)?\s*(\d+)$")
_COMPARE = {"==": operator.eq, ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "%": _every}
