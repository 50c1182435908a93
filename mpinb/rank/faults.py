"""Faults on demand, for teaching: what ``%mpi inject`` plants on a rank, acted on at the rank's collectives (the
MPI calls and ``torch.distributed`` calls mpinb traces), so that a student's own training loop shows a straggler,
a dead rank, a stalled rank, drifting replicas or a NaN without a line of it changed.

Each fault counts the rank's collectives from the moment it was planted; ``at`` is the one it acts at:

``straggler``  sleeps ``delay`` seconds before each collective from the ``at``-th on
``kill``       ends the rank's process (SIGKILL) as it enters its ``at``-th collective
``stall``      stops the rank for good before its ``at``-th collective: the others wait in it (Stop lets it go)
``nan``        writes NaN into what the ``at``-th collective gave this rank (its receive buffer, or the object)
``perturb``    adds ``scale`` times normal noise to what each collective from the ``at``-th on gave this rank

Nothing here runs while no fault is planted: the traced calls read :data:`active` first.
"""

import math
import numbers
import os
import signal
import time
from dataclasses import dataclass

KINDS = ("straggler", "kill", "stall", "nan", "perturb")
MAX_DELAY = 3600.0  # a straggler's sleep before each collective, at most (a stall stops a rank for good)
active = False  # whether any fault is planted on this rank: the traced calls look here first
nested = 0  # calls of mpinb's API collectives under way (tracing.calls.api_call): the collectives inside pass


@dataclass
class Fault:
    kind: str
    at: int = 1
    delay: float = 0.0
    scale: float = 0.0
    seen: int = 0  # collectives since it was planted

    def describe(self):
        what = {"straggler": f"sleeps {self.delay:g} s before each collective from its {_nth(self.at)} on",
                "kill": f"is killed (SIGKILL) at its {_nth(self.at)} collective",
                "stall": f"stalls for good before its {_nth(self.at)} collective",
                "nan": f"gets NaN from its {_nth(self.at)} collective",
                "perturb": f"gets noise of scale {self.scale:g} added to what each collective gives it, from its "
                           f"{_nth(self.at)} on"}[self.kind]
        return f"{self.kind}: {what} ({self.seen} collective{'s' if self.seen != 1 else ''} so far)"


_planted = []


def _nth(n):
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def checked_at(at, name="at"):
    """*at* as an int if it is a collective a fault can act at (1: the next one); else ``ValueError`` saying what
    *name* takes."""
    if isinstance(at, bool) or not isinstance(at, numbers.Integral) or at < 1:
        raise ValueError(f"{name} takes the collective it acts at, counted from 1 (the next one), not {at!r}")
    return int(at)


def checked_delay(delay, name="delay"):
    """*delay* as a float if a straggler can sleep that long before each collective; else ``ValueError``."""
    if isinstance(delay, bool) or not isinstance(delay, numbers.Real) or not 0 <= delay <= MAX_DELAY:
        raise ValueError(f"{name} takes a number of seconds from 0 to {MAX_DELAY:g}, not {delay!r}")
    return float(delay)


def checked_scale(scale, name="scale"):
    """*scale* as a float if it is a standard deviation of noise (finite, at least 0); else ``ValueError``."""
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not (math.isfinite(scale) and scale >= 0):
        raise ValueError(f"{name} takes a standard deviation, a finite number >= 0, not {scale!r}")
    return float(scale)


def plant(kind, at=1, delay=0.0, scale=0.0):
    """Plant a fault of *kind* on this rank; what it does, in words. ``ValueError`` where *at* is not a
    collective from 1 on, *delay* not seconds from 0 to :data:`MAX_DELAY`, or *scale* not finite and >= 0
    (checked here, so that nothing planted can raise inside a collective later)."""
    global active
    if kind not in KINDS:
        raise ValueError(f"no fault called {kind!r}: one of {', '.join(KINDS)}")
    fault = Fault(kind, checked_at(at), checked_delay(delay), checked_scale(scale))
    _planted.append(fault)
    active = True
    return fault.describe()


def clear():
    """Remove every fault planted on this rank; how many there were."""
    global active
    count = len(_planted)
    _planted.clear()
    active = False
    return count


def planted():
    """What is planted on this rank, in words."""
    return [fault.describe() for fault in _planted]


def before():
    """A traced collective is about to be entered (one inside a call of mpinb's API collectives, which counted
    as one already, is passed over)."""
    if nested:
        return
    for fault in list(_planted):
        fault.seen += 1
        if fault.seen < fault.at:
            continue
        if fault.kind == "straggler":
            time.sleep(fault.delay)
        elif fault.kind == "kill" and fault.seen == fault.at:
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.kind == "stall" and fault.seen == fault.at:
            while True:  # a Stop (SIGINT) raises KeyboardInterrupt here, as anywhere in the cell
                time.sleep(0.5)


def after(received, value=None):
    """A traced collective returned: spoil what it gave this rank where a fault says so. *received* is its
    receive buffer (an array, a tensor, ``[buffer, datatype]``), *value* what the call returned (an object
    collective's result); the value to hand the caller."""
    for fault in _planted:
        if fault.kind == "nan" and fault.seen == fault.at or fault.kind == "perturb" and fault.seen >= fault.at:
            value = _spoil(received, value, fault)
    return value


def _spoil(received, value, fault):
    import numpy as np

    def spoiled(array):
        if fault.kind == "nan":
            return np.full_like(array, np.nan)
        with np.errstate(over="ignore"):  # noise too large for the dtype is infinite, without a warning to raise
            return array + np.random.default_rng().normal(0.0, fault.scale, array.shape).astype(array.dtype)

    target = received[0] if isinstance(received, (list, tuple)) and received else received
    if target is not None:
        try:
            array = np.asarray(target)
        except Exception:  # noqa: BLE001 - not an array in memory (a device tensor): left as it is
            array = None
        if array is not None and array.dtype.kind in "fc" and array.flags.writeable:
            array[...] = spoiled(array)
            return value
    if isinstance(value, float):
        return float(spoiled(np.asarray(value)))
    if isinstance(value, np.ndarray) and value.dtype.kind in "fc":
        return spoiled(value)
    return value
