"""What mpiexec starts on each rank: the ipyparallel engine as a child, so that how it ends can be told.

mpiexec reports only the first process it saw fail, often one it killed itself while cleaning up, so the rank
that died first and its exit code or signal would otherwise be lost. This parent waits for the engine, writes
``<pid> <returncode> <time>`` to ``$MPINB_STATUS_DIR/exit-<pid>`` (a negative returncode is a signal), and exits
the same way. The engine inherits everything MPI needs (environment and open descriptors) and dies with its
parent (``PR_SET_PDEATHSIG``), so killing this process never leaves the engine behind.

SIGINT, SIGTERM and SIGUSR2 are passed on to the engine. An engine busy in a cell never ends on SIGTERM
(ipyparallel stops it on its event loop, which the cell holds), so it is killed ``TERM_GRACE`` seconds later:
a batch system ending the job (``scancel``, a time limit) would otherwise wait its whole kill delay (Slurm's
``KillWait``, 30 s by default) with the job's nodes held.

    python -m mpinb.rank.launch [ipengine arguments...]
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from ..wire import files
from ..wire.rank_files import TRACER_ENV


PR_SET_PTRACER = 0x59616D61  # Yama's: which process (and its descendants) may ptrace this one


def _die_with_parent():
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        # under Yama's ptrace_scope 1 only a process's ancestors may read its stack: the notebook's kernel is one,
        # but py-spy, which it starts to read the engine's native frames (%mpi stacks), is not; named here, the
        # kernel and what it starts may (without Yama this fails, and nothing needs it)
        host, _, tracer = os.environ.get(TRACER_ENV, "").rpartition(":")
        if tracer.isdigit() and host == socket.gethostname():  # that pid means the kernel on its host only
            libc.prctl(PR_SET_PTRACER, int(tracer), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the engine may outlive a killed parent
        pass


TERM_GRACE = 3.0  # seconds an engine gets to end after SIGTERM before it is killed


def main(argv):
    child = subprocess.Popen([sys.executable, "-m", "ipyparallel.engine", *argv], close_fds=False,
                             preexec_fn=_die_with_parent)

    escalated = []

    def kill_if_running():
        if child.poll() is None:
            escalated.append(True)
            child.kill()

    def terminate(number, frame):
        child.send_signal(number)
        timer = threading.Timer(TERM_GRACE, kill_if_running)
        timer.daemon = True
        timer.start()

    for forwarded in (signal.SIGINT, signal.SIGUSR2):
        signal.signal(forwarded, lambda number, frame: child.send_signal(number))
    signal.signal(signal.SIGTERM, terminate)
    code = child.wait()  # retried by Python when a forwarded signal interrupts it (PEP 475)
    if escalated and code == -signal.SIGKILL:
        code = -signal.SIGTERM  # what ended it: the SIGKILL only made it happen
    directory = os.environ.get("MPINB_STATUS_DIR")
    if files.private_directory(directory):  # the world's, on the notebook's host (not a name another user took)
        try:
            with open(files.create(os.path.join(directory, f"exit-{child.pid}")), "w") as status:
                status.write(f"{child.pid} {code} {time.time()}\n")
        except OSError:  # written already, or the world is being removed: how the rank ended is lost, not more
            pass
    if code < 0:  # end as the engine did, so mpiexec reports the same signal
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # these two cannot be handled, nor given a handler
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
