"""``mpinb.report()``: per-rank metrics, buffered on the rank and shipped in batches, or summarised in a script.

Under ``%%mpi`` the rank's agent drains the buffer at most every ``report_interval`` seconds (0.1 s: about
10 Hz per rank) and once more before the cell's reply, so the notebook holds every value when the cell ends.

Under plain ``mpiexec python script.py`` (no notebook) ``report()`` costs about the same and:

- rank 0 prints ``[mpinb] rank 0 step 212: loss=0.3121 lr=0.01 (45.2 steps/s)`` to stdout at most every
  ``MPINB_REPORT_EVERY`` seconds (default 10; 0 turns it off) and once at exit;
- any rank prints ``[mpinb] rank 3: loss became NaN at step 212`` to stderr the first time a metric stops
  being finite;
- with ``MPINB_METRICS_FILE=metrics-{rank}.jsonl`` each rank appends one JSON object per call
  (``{"rank": 0, "run": "main", "step": 3, "time": 1763.2, "loss": 0.5}``); ``mpinb.read_metrics`` loads them.
"""

import atexit
import collections
import json
import math
import operator
import os
import sys
import time

from ..wire import files
from ..wire.kinds import DEFAULT_RUN
from ..wire.report_words import nonfinite_message
from .tracing import state as _trace



def report(step=None, *, run=None, **metrics):
    """Record *metrics* (numbers) for this rank at *step*.

    Parameters
    ----------
    step : int, optional
        The training step. Default: one more than this rank's previous step in the run (0 at first).
    run : str, optional
        Start or continue the named run; later calls without ``run`` stay in it. Runs are separate curves
        and separate step counters; the first run is called ``"main"``.
    **metrics : number
        ``name=value`` pairs: Python or numpy numbers, or one-element arrays — torch tensors (CPU tensors are
        read at once; tensors on an accelerator are read later, in one batch, so reporting does not synchronise
        the device every step), numpy, JAX or TensorFlow arrays (read at once).

    Example
    -------
    >>> for step in range(500):
    ...     loss = train_step()
    ...     mpinb.report(step=step, loss=loss, lr=opt.param_groups[0]["lr"])
    """
    return recorder.report(step, run, metrics)


class Recorder:
    """This rank's reporting state: the current run, its step counters, and where records go."""

    def __init__(self, *, sink=None):
        self.run = DEFAULT_RUN
        self.next_step = {}
        self.sink = sink

    def report(self, step, run, metrics):
        if not metrics:
            raise TypeError("mpinb.report() needs at least one metric, e.g. mpinb.report(loss=0.31)")
        if run is not None:
            if not isinstance(run, str) or not run:
                raise TypeError(f"mpinb.report(run=...) takes a non-empty name, not {run!r}")
            self.run = run
        run = self.run
        if step is None:
            step = self.next_step.get(run, 0)
        else:
            try:
                step = operator.index(step)
            except TypeError:
                raise TypeError(f"mpinb.report(step=...) takes an integer, not {type(step).__name__} "
                                f"({step!r})") from None
        self.next_step[run] = step + 1
        if self.sink is None:
            self.sink = ScriptSink()
        defer = self.sink.batches
        values = {name: _as_float(name, value, defer=defer) for name, value in metrics.items()}
        if _trace.spans is not None:
            _trace.mark_step(step)
        # the last item: seconds this rank has spent in communication so far (its wait time per step)
        self.sink.put((run, step, time.time(), values, _trace.comm_ns / 1e9))


class AgentSink:
    """Records wait in a deque until the rank's agent drains them (its ``notify`` wakes it once per batch)."""

    batches = True  # accelerator values are read when a batch is drained, not at every report()

    def __init__(self, notify):
        self.records = collections.deque()
        self.notify = notify
        self.armed = False

    def put(self, record):
        self.records.append(record)
        if not self.armed:
            self.armed = True
            self.notify()

    def drain(self):
        """Every record put so far, oldest first, with values read off accelerator tensors in one batch."""
        self.armed = False
        records = self.records
        batch = [records.popleft() for _ in range(len(records))]
        _read_deferred(batch)
        return batch


class ScriptSink:
    """No notebook: a periodic summary line on rank 0, non-finite warnings, optional JSON lines per rank."""

    batches = False  # every record is written as it comes, so its values are read at once

    def __init__(self, *, rank=None, every=None, path=None, stdout=None, stderr=None):
        self.rank = _world_rank() if rank is None else rank
        every = float(os.environ.get("MPINB_REPORT_EVERY", "10")) if every is None else every
        self.every = every if self.rank == 0 else 0
        path = os.environ.get("MPINB_METRICS_FILE") if path is None else path
        self.stdout, self.stderr = stdout or sys.stdout, stderr or sys.stderr
        self.file = self._open(path.format(rank=self.rank)) if path else None
        self.last = None
        self.first = None  # (time, step) of the run's first record, for steps/s
        self.warned = set()
        self.next_line = time.monotonic() + self.every
        atexit.register(self.close)

    def _open(self, path):
        """*path* to append to, never through a link nor into another user's file (``wire/files.py``); else
        ``None``, said in one line."""
        try:
            return open(files.open_own(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a", buffering=1 << 16)
        except OSError as exc:
            print(f"[mpinb] rank {self.rank}: cannot write metrics to {path} ({exc})", file=self.stderr)
            return None

    def put(self, record):
        run, step, when, values = record[:4]
        if self.last is None or self.last[0] != run:
            self.first = (when, step)
        self.last = record
        for name, value in values.items():
            if not math.isfinite(value) and (run, name) not in self.warned:
                self.warned.add((run, name))
                print(f"[mpinb] rank {self.rank}: {nonfinite_message(name, value, step)}", file=self.stderr,
                      flush=True)
        if self.file is not None:
            self.file.write(json.dumps({"rank": self.rank, "run": run, "step": step, "time": when, **values}))
            self.file.write("\n")
        if self.every and time.monotonic() >= self.next_line:
            self.next_line = time.monotonic() + self.every
            self.print_summary()

    def print_summary(self):
        run, step, when, values = self.last[:4]
        shown = " ".join(f"{name}={value:.4g}" for name, value in values.items())
        started, first_step = self.first
        rate = f" ({(step - first_step) / (when - started):.1f} steps/s)" if when > started else ""
        label = "" if run == DEFAULT_RUN else f" [{run}]"
        print(f"[mpinb] rank {self.rank}{label} step {step}: {shown}{rate}", file=self.stdout, flush=True)

    def close(self):
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.every and self.last is not None:
            self.print_summary()
            self.every = 0


def _as_float(name, value, *, defer=False):
    """*value* as a float, or (with *defer*) a detached copy of a one-element accelerator tensor to read later.

    Takes Python and numpy numbers and one-element arrays of any framework: torch, numpy, JAX, TensorFlow.
    """
    given = value
    if type(value) in (float, int):
        return float(value)
    if hasattr(value, "detach") and hasattr(value, "numel"):  # a torch tensor
        if value.numel() != 1:
            raise TypeError(f"mpinb.report({name}=...) takes one number, not a tensor of shape "
                            f"{tuple(value.shape)}; reduce it first (e.g. {name}.mean()) or report each element")
        if defer and not value.is_cpu:
            return _Deferred(value.detach().reshape(()).clone())
        return float(value.item())
    shape = getattr(value, "shape", None)
    if shape is not None and (hasattr(value, "__array__") or hasattr(value, "__dlpack__")):  # numpy, JAX, TF
        import numpy as np

        try:
            value = np.asarray(value)  # never __dlpack__ (TF's aborts on strings); bfloat16 comes as ml_dtypes
        except Exception:  # noqa: BLE001 - e.g. CuPy refuses an implicit copy: float() below says what it needs
            pass
        else:
            if value.size != 1:
                raise TypeError(f"mpinb.report({name}=...) takes one number, not an array of shape "
                                f"{tuple(value.shape)}; reduce it first (e.g. {name}.mean()) or report each element")
            value = value.reshape(())[()]
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"mpinb.report({name}=...) takes a number (int, float, numpy scalar or one-element "
                        f"tensor or array), not {type(given).__name__}") from None


class _Deferred:
    """A value still on an accelerator; read with its batch."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor


def _read_deferred(batch):
    """Replace every deferred tensor in *batch* by its float, one device-to-host copy per device."""
    deferred = [(record[3], name, value.tensor) for record in batch for name, value in record[3].items()
                if type(value) is _Deferred]
    if not deferred:
        return
    import torch

    by_device = collections.defaultdict(list)
    for item in deferred:
        by_device[item[2].device].append(item)
    for items in by_device.values():
        floats = torch.stack([tensor for _, _, tensor in items]).double().cpu().tolist()
        for (values, name, _), number in zip(items, floats):
            values[name] = number


def _world_rank():
    """This process's rank without initialising MPI: torchrun's ``RANK`` for its workers, the MPI launcher's
    environment, else mpi4py's if it is loaded."""
    if "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ:  # torchrun's (under srun too: not SLURM_PROCID)
        return int(os.environ["RANK"])
    for variable in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if variable in os.environ:
            return int(os.environ[variable])
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized():
        return mpi.COMM_WORLD.rank
    return 0


recorder = Recorder()
