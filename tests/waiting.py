"""Waiting for a condition in a test: every wait has a timeout, and a wait that runs out says what it waited for."""

import time


def wait_for(predicate, what, timeout=20.0, interval=0.05):
    """Poll ``predicate`` until it is true; RuntimeError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
