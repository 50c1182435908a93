"""A world's lifecycle in one place: its states, the moves between them, and why it last ended.

- stopped -> starting (``%mpi start``, ``%mpi restart``, a first ``%%mpi``)
- starting -> idle (every rank registered and connected), or -> stopping (the start failed or a Stop rolled it back)
- idle -> running (a cell) -> idle (it ended, failed or not)
- running -> recovering (a Stop, ``--timeout``, a failed rank, mismatched collectives) -> idle (every rank answered,
  or was let out of MPI, its variables kept)
- running or recovering -> stopping (ranks stuck in MPI, a world MPI left inconsistent, a third Stop) -> stopped,
  then -> starting when mpinb restarts it
- any state with processes -> dead (a rank died) -> stopping (``%mpi restart``, ``%mpi stop``)
- stopping -> stopped (every process ended; a Stop meanwhile waits for it)

What a Stop does in each state is said in ``STOP_DOES`` and shown by ``%mpi status``'s docs.
"""

import enum
import logging

log = logging.getLogger("mpinb")


class State(str, enum.Enum):
    STOPPED = "stopped"  # no processes (before the first start, after a stop or a rolled-back start)
    STARTING = "starting"  # controller and mpiexec launched, ranks registering and connecting
    IDLE = "idle"  # every rank waits for a cell
    RUNNING = "running"  # a cell runs on the ranks
    RECOVERING = "recovering"  # a cell was stopped; its ranks are answering the interrupt or being let out of MPI
    STOPPING = "stopping"  # every process of the world is being ended
    DEAD = "dead"  # a rank died: the world cannot run cells until it is restarted

    def __str__(self):
        return self.value


MOVES = {
    State.STOPPED: {State.STARTING, State.STOPPING},  # stopping a stopped world does nothing
    State.STARTING: {State.IDLE, State.STOPPING},
    State.IDLE: {State.RUNNING, State.STOPPING, State.DEAD},
    State.RUNNING: {State.IDLE, State.RECOVERING, State.DEAD, State.STOPPING},
    State.RECOVERING: {State.IDLE, State.DEAD, State.STOPPING},
    State.STOPPING: {State.STOPPED},
    State.DEAD: {State.STOPPING},
}

STOP_DOES = {
    State.STARTING: "the start rolls back at its next safe point: everything it launched is stopped",
    State.RUNNING: "first Stop: interrupt the cell; second: say what is awaited and for how long; "
                   "third: end the world",
    State.RECOVERING: "second Stop: say what is awaited and for how long; third: end the world",
    State.STOPPING: "waits for the stop to finish (every process ends within seconds), then says so",
    State.IDLE: "nothing to stop",
    State.STOPPED: "nothing to stop",
    State.DEAD: "nothing to stop: %mpi restart starts fresh ranks",
}


class Lifecycle:
    """The state of one world and the last reason it ended; a move the table does not allow is logged (a bug in
    mpinb), and made anyway, so that the state shown is always the true one."""

    def __init__(self):
        self.state = State.STOPPED
        self.ended = None  # why the world last stopped when the user did not ask (shown by %mpi status)
        self.died_in = None  # the In[N] a rank of the world died during, once one did

    def move(self, state):
        state = State(state)
        if state != self.state and state not in MOVES[self.state]:
            log.warning("mpinb: world moved from %s to %s, which its lifecycle does not foresee", self.state, state)
        self.state = state

    def dead(self, cell=None):
        """A rank died (during the cell ``In[cell]``, when it is known): the world runs no cell until it is
        restarted."""
        self.move(State.DEAD)
        if cell is not None:
            self.died_in = cell

    def end(self, why):
        """The world was stopped, or could not be started again, without the user asking: *why*, for
        ``%mpi status`` and the next start."""
        self.ended = why

    def __str__(self):
        return str(self.state)
