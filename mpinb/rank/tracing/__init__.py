"""MPI call tracing in a rank: every call through mpi4py noted in the rank's ledger of collectives, and recorded
as a span while a cell is traced.

What other modules use is here: the rank's tracing :data:`state` (``ledger.py``: its ledgers, what the main thread
waits in, the spans), :func:`install` of the traced communicators (``intercept.py``, the methods in
``collective_calls.py``, ``p2p_calls.py`` and ``calls.py``, the arguments they read in ``arguments.py``, the
communicators traced in ``comms.py``), :func:`api_call` and :func:`own_check` for mpinb's own calls, and :func:`script_trace` for a script under plain mpiexec
(``script.py``). The ledger is the lowest module and imports none of the others; the file it mirrors the
collective waited in to is read by the notebook through ``wire/mirror.py``.
"""

from .calls import api_call
from .collective_calls import own_check
from .intercept import install, traced, uninstall
from .ledger import BUFFER, RECENT, Ledger, State, main_frames, now_ns, state
from .p2p_calls import stuck_p2p
from .script import script_trace

__all__ = ["BUFFER", "RECENT", "Ledger", "State", "api_call", "install", "main_frames", "now_ns", "own_check",
           "script_trace", "state", "stuck_p2p", "traced", "uninstall"]
