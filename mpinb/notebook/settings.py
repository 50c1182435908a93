"""The settings of the magics, ``%config MPIMagics.<setting>``: each one's default and help, and the values a number
setting takes, refused with what it takes when ``%config`` sets another."""

import math

from traitlets import Bool, Enum, Float, Integer, List, TraitError, Unicode, validate
from traitlets.config import Configurable

from .world import LAUNCHERS


class MPISettings(Configurable):
    """What ``MPIMagics`` reads of its configuration; configured as ``MPIMagics.<setting>``, the class that has them."""

    default_ranks = Integer(2, config=True, help="Ranks started by %%mpi when no world runs and -n is not given.")
    default_mpi = Unicode(
        "", config=True,
        help="Which MPI %mpi start and %%mpi use without --mpi: mpich, openmpi, impi, or the path of an mpiexec. "
             "Empty: the MPI of `mpiexec`, else the one beside this Python (mpich wheel), else on PATH. The ranks "
             "load that MPI's library.",
    )
    mpiexec = Unicode(
        "", config=True,
        help="mpiexec to launch with (name or path); its MPI is read from `mpiexec --version`.",
    )
    mpi_library = Unicode("", config=True,
                          help="The libmpi the ranks load, when it is not installed beside the launcher.")
    mpiexec_args = List(Unicode(), config=True, help="Extra mpiexec arguments, e.g. ['--oversubscribe'].")
    ip = Unicode("127.0.0.1", config=True,
                 help="Address the controller listens on; loopback unless you ask (ranks on other hosts need one "
                      "they can reach, or 0.0.0.0).")
    launcher = Enum(list(LAUNCHERS), "mpi", config=True,
                    help="How ranks start: mpi (mpiexec here), ssh (mpiexec over ssh to the hosts of hostfile), or "
                         "a batch job running mpiexec: slurm, pbs, sge, lsf.")
    hostfile = Unicode("", config=True, help="Hosts file for mpiexec (mpi and ssh launchers).")
    partition = Unicode("", config=True, help="Batch launchers: the job's partition (queue).")
    time_limit = Unicode("", config=True, help="Batch launchers: the job's time limit, e.g. 01:00:00.")
    account = Unicode("", config=True, help="Batch launchers: the account the job is charged to.")
    scheduler_args = List(Unicode(), config=True,
                          help="Batch launchers: more job-script directives, e.g. ['--gres=gpu:1'].")
    threads_per_rank = Integer(
        0, config=True,
        help="Threads each rank's math libraries (OpenMP, BLAS, torch, TensorFlow) may use: 0 gives each rank an "
             "equal share of its host's cores, as torchrun does; negative leaves the libraries' defaults. Shown "
             "by %mpi status; OMP_NUM_THREADS and the like set in the environment win.")
    start_timeout = Float(60.0, config=True, help="Seconds to wait for all ranks to come up.")
    heartbeat_ms = Integer(0, config=True, help="Controller-engine heartbeat period in milliseconds; 0: 100 ms, "
                           "longer for worlds over 12 ranks (registration completes on a beat; a rank is given up "
                           "after 3.5 s without heartbeats whatever the period).")
    stream = Bool(True, config=True, help="Print rank output while the cell runs (else in rank order at the end).")
    interrupt_grace = Float(5.0, config=True,
                            help="Seconds ranks get to answer an interrupt; ranks stuck longer (in MPI or C) make "
                                 "mpinb restart the world.")
    timeout = Float(0.0, config=True, help="Default for %%mpi --timeout: seconds a cell may run (0: no limit).")
    status_after = Float(30.0, config=True,
                         help="Seconds after which a running cell shows, per rank, whether it finished and its "
                              "last reported step (0: never).")
    abort_grace = Float(2.0, config=True,
                        help="When a rank fails, seconds the other ranks get to finish before they are stopped "
                             "(they are usually waiting for it in a collective). Negative: wait for them.")
    collective_wait = Float(
        1.0, config=True,
        help="Seconds a rank may wait in one collective before mpinb asks every rank where it is, and stops the "
             "cell if ranks are in different collectives (0: never ask).")
    trace_buffer = Integer(100_000, config=True,
                           help="Spans each rank keeps under %%mpi --trace between sends at most (a ring: the "
                                "oldest go first).")
    report_interval = Float(0.1, config=True, help="Seconds each rank buffers mpinb.report() values between sends.")
    refresh_interval = Float(0.25, config=True, help="Seconds between redraws of the live metric charts at most.")
    max_points = Integer(1000, config=True, help="Points drawn per curve at most (the history keeps every value).")
    gather_transport = Enum(["auto", "shm", "mpi", "frames"], "auto", config=True,
                            help="How --gather moves values: auto (shm when the ranks share the notebook's host; "
                                 "mpi when some do and the cell runs on every rank; else frames), shm (shared "
                                 "memory), mpi (an MPI gather to a rank on the notebook's host, then one message), "
                                 "frames (each rank sends its own).")
    live_view = Enum(["auto", "widgets", "text", "off"], "auto", config=True,
                     help="How mpinb.report() values show while a cell runs: auto (widgets in a notebook, text in "
                          "a terminal), widgets, text, or off (only kept for mpinb.metrics()).")
    snapshots = Bool(
        True, config=True,
        help="Keep every rank's variables on its host after each cell every rank finished, so that every restart "
             "(%mpi restart after a rank died, a segfault, kill -9, MPI_Abort; mpinb's own) puts them back; "
             "%mpi restart --fresh starts empty.")
    snapshot_limit = Integer(1 << 30, config=True,
                             help="Bytes one name may take in a rank's snapshot; larger ones are listed as not kept.")
    snapshot_lag = Float(
        10.0, config=True,
        help="Seconds of a rank's work a crash may lose at most: a rank snapshots its variables when idle for 0.2 s "
             "after a cell, and a cell that comes sooner waits for that snapshot only when the last cell every rank "
             "kept is older (decided for every rank at once, from the next cell on).")
    keep_widgets = Bool(
        False, config=True,
        help="Keep each view's widget live after its cell ends (zoom, pickers) instead of replacing it by its static "
             "rendering. JupyterLab then needs Settings > Save Widget State Automatically, or a reopened notebook "
             "shows 'Error displaying widget' where the views were; nbconvert and GitHub show the static copy.")

    # what each number setting takes: (its least value, whether that value itself is allowed, in words); every
    # value is finite (NaN and infinity are refused); threads_per_rank takes any whole number
    _RANGES = {
        "default_ranks": (1, True, "a number of ranks >= 1"),
        "start_timeout": (0, False, "a finite number of seconds > 0"),
        "heartbeat_ms": (0, True, "a number of milliseconds >= 0 (0: 100 ms, longer for worlds over 12 ranks)"),
        "interrupt_grace": (0, True, "a finite number of seconds >= 0"),
        "timeout": (0, True, "a finite number of seconds >= 0 (0: no limit)"),
        "status_after": (0, True, "a finite number of seconds >= 0 (0: never)"),
        "abort_grace": (-math.inf, False, "a finite number of seconds (negative: wait for them)"),
        "collective_wait": (0, True, "a finite number of seconds >= 0 (0: never ask)"),
        "trace_buffer": (1, True, "a number of spans >= 1"),
        "report_interval": (0, True, "a finite number of seconds >= 0"),
        "refresh_interval": (0, True, "a finite number of seconds >= 0"),
        "max_points": (2, True, "a number of points per curve >= 2"),
        "snapshot_limit": (0, True, "a number of bytes >= 0"),
        "snapshot_lag": (0, True, "a finite number of seconds >= 0 (0: each cell waits for the last snapshot)"),
    }

    @validate(*_RANGES)
    def _in_range(self, proposal):
        """A number setting's value if it is one the setting takes; else a ``TraitError`` (what ``%config``
        shows) saying what it takes."""
        name, value = proposal["trait"].name, proposal["value"]
        least, inclusive, what = self._RANGES[name]
        if not (math.isfinite(value) and (value >= least if inclusive else value > least)):
            raise TraitError(f"MPIMagics.{name} takes {what}, not {value!r}")
        return value
