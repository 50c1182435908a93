"""A rank that MPI_Abort let live on: ended as MPI_Abort should have ended it, once MPI wrote its abort notice."""

import os
import threading
import time

from ..wire.abort_notices import aborts
from . import stacks


class AbortWatch(threading.Thread):
    """Ends this process as MPI_Abort should have, when MPI wrote its abort notice but the process lives on.

    MPICH has been seen, now and then on a busy machine, to let ``MPI_Abort`` return to its caller, which then
    went on (or hung in the next collective) as if nothing had happened (in JupyterLab, in 2 runs of 2 of one
    notebook here). The notice is in the rank's own stderr file at once (``rank/stacks.py``): a cell that wrote one
    ends its rank instead of replying, and a second after one, a rank still running exits with the code.
    """

    def __init__(self, outbox, every=0.1, grace=1.0):
        super().__init__(name="mpinb-abort-watch", daemon=True)
        self.outbox, self.every, self.grace = outbox, every, grace
        self.seen = stacks.native_stderr_size()
        self.start()

    def run(self):
        while True:
            time.sleep(self.every)
            size = stacks.native_stderr_size()
            if size != self.seen:
                notices = aborts(stacks.native_stderr_since(self.seen))
                self.seen = size
                if notices:
                    time.sleep(self.grace)  # MPI's own abort normally ends the process first
                    self._exit(notices)

    def end_if_aborted(self, since):
        """Exit now if MPI wrote an abort notice after *since* bytes (the cell that called it has returned)."""
        if stacks.native_stderr_size() <= since:  # nothing written: no file to open and read
            return
        notices = aborts(stacks.native_stderr_since(since))
        if notices:
            self._exit(notices)

    def _exit(self, notices):
        self.outbox.close()  # what the cell printed still reaches the notebook
        os._exit(notices[0][2] or 1)
