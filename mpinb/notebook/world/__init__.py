"""One MPI world: its start, its processes and their liveness, its lifecycle, where its ranks run (launchers, a
Slurm job), the ranks' variables kept across its starts, and what it would leave behind.

The names other code uses are imported when first asked for, so that ``python -m`` of the reaper and of the
controller, both in this package, starts without the rest of it."""

import importlib

_WHERE = {
    "World": "cluster", "check_size": "cluster",
    "State": "lifecycle", "Lifecycle": "lifecycle",
    "LAUNCHERS": "launchers", "Placement": "launchers",
    "KeptState": "kept_state",
}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
