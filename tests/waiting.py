"""Waiting for a condition in a test: every wait has a timeout, and a wait that runs out says what it waited for."""

import time


def wait_for(predicate, what, timeout=20.0, interval=0.05, *, required=True):
    """Call ``predicate`` every ``interval`` seconds until it returns something true, and return that. After
    ``timeout`` seconds: a RuntimeError naming ``what`` (a text, or a function that says it then, from what was
    last seen), or ``None`` where ``required`` is false (a wait whose running out is itself an answer, or after
    which the caller goes on either way)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            if required:
                raise RuntimeError(f"timed out after {timeout} s waiting for {what() if callable(what) else what}")
            return None
        time.sleep(interval)
