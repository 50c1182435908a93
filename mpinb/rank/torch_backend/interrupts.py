"""Stop (SIGINT) held while a collective of the process group makes its MPI calls, and raised once they are done:
raised between them, it would leave this rank out of a collective the others make."""

import _signal
import functools
import signal
import threading

import torch


def stop_after_backward(method):
    """*method*, whose Stop (SIGINT) on the main thread is held while it runs and raised once its MPI calls are
    done: raised between them, it would leave this rank out of a collective the others make (the check made, the
    data call not: the ranks that stand in for this one, ``rank/settle.py``, then send into the next call, and MPI
    ends the job). Inside ``backward()`` (a gradient bucket DDP's reducer hands the group) it is raised once the
    backward has ended, after DDP's own final callback: raised inside, it would leave the reducer half-way through
    its buckets, failing every later step."""
    main = threading.main_thread()

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if threading.current_thread() is not main:
            return method(self, *args, **kwargs)
        held = []
        # _signal's own calls: signal.signal's conversions to and from enums cost more than the rest of a small call
        previous = _signal.signal(signal.SIGINT, lambda number, frame: held.append(frame))
        try:
            return method(self, *args, **kwargs)
        finally:
            _signal.signal(signal.SIGINT, previous)
            if held and callable(previous):
                if torch._C._current_graph_task_id() == -1:
                    previous(signal.SIGINT, held[0])
                else:  # after DDP's own final callback, which it queues once this returns
                    queue = torch.autograd.Variable._execution_engine.queue_callback
                    queue(lambda: queue(lambda: previous(signal.SIGINT, held[0])))

    return call
