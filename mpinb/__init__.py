"""mpinb: a Jupyter notebook as the driver of a real MPI job (``%load_ext mpinb``, then ``%%mpi``).

On ranks (and in scripts run with plain ``mpiexec``): :func:`report`. In the notebook: :func:`metrics`,
:func:`read_metrics`. Importing mpinb imports neither IPython nor ipywidgets.
"""

import os as _os

from .rank.report import report

#: mpinb's version, as ``pip show mpinb`` gives it.
__version__ = "0.1.0"
__all__ = ["__version__", "load_ipython_extension", "metrics", "read_metrics", "report",
           "trace", "unload_ipython_extension", "view"]


def metrics(run=None):
    """Everything ``mpinb.report()`` sent in the current world (or its last one) as a pandas DataFrame.

    Columns: ``run, rank, step, name, value, time`` (one row per rank, step and metric; ``time`` is when the
    rank reported it), sorted by run, rank and step. Nothing is decimated: every reported value is here.
    *run* keeps one run only. A cell that reports into a run again from a step the run already passed (a re-run
    of the training cell) starts a run of its own, named ``"main #2"`` and so on; a cell that goes on counting
    steps continues the run. Call it in the notebook, after ``%load_ext mpinb`` (elsewhere it raises
    ``RuntimeError``; under plain mpiexec, :func:`read_metrics` reads what the ranks wrote).
    """
    return _magics("mpinb.metrics() reads the notebook's copy of what ranks reported: call it in the notebook "
                   "after %load_ext mpinb (on a rank, mpinb.report() is what sends values)").history.to_frame(run)


def view():
    """The running world's ipyparallel ``DirectView``, one target per rank in rank order (blocking).

    For ipyparallel's own tools on mpinb's ranks: ``mpinb.view().scatter("a", range(8))``,
    ``.push``, ``.pull``, ``.apply``; ``%mpi view`` makes it the view ``%px`` and ``%%px`` run on. Names are
    shared with ``%%mpi`` cells (one namespace per rank). Call it in the notebook after ``%load_ext mpinb``
    (elsewhere it raises ``RuntimeError``), with a world running (else a ``UsageError`` says how to start one).
    """
    return _magics("mpinb.view() is for the notebook: call it after %load_ext mpinb").world_view()


def trace():
    """The last ``%%mpi --trace`` cell's MPI calls as a pandas DataFrame, one row per call.

    Columns: ``rank, op, comm, peer, bytes, start, end, seq`` (and ``kind, sent, received, detail``); ``start``
    and ``end`` are seconds from the first call, ``seq`` the collective's number on its communicator. It is a
    :class:`~mpinb.notebook.models.traces.Trace`: ``.to_chrome("cell.json")`` writes it for Perfetto or
    chrome://tracing. Call it in the notebook; ``RuntimeError`` before the first traced cell, or elsewhere.
    """
    trace = _magics("mpinb.trace() reads the notebook's copy of a traced cell: call it in the notebook after "
                    "%load_ext mpinb; under plain mpiexec set MPINB_TRACE=trace-{rank}.json").last_trace
    if trace is None:
        raise RuntimeError("no traced cell yet: run one with %%mpi --trace")
    return trace


def _magics(elsewhere):
    """The notebook's ``MPIMagics``; a ``RuntimeError`` saying *elsewhere* where there is none."""
    from IPython import get_ipython

    shell = get_ipython()
    magics = shell.magics_manager.registry.get("MPIMagics") if shell is not None else None
    if magics is None:
        raise RuntimeError(elsewhere)
    return magics


def read_metrics(pattern):
    """The JSON lines ranks wrote under plain mpiexec with ``MPINB_METRICS_FILE`` set, as :func:`metrics` gives.

    *pattern* is a glob of their files (``"metrics-*.jsonl"`` for ``MPINB_METRICS_FILE=metrics-{rank}.jsonl``);
    none matching is a ``FileNotFoundError``. Works anywhere: no notebook, no world.
    """
    from .notebook.models.history import read_metrics

    return read_metrics(pattern)


def _trace_script():
    """Under plain mpiexec with ``MPINB_TRACE=trace-{rank}.json``: every rank writes its MPI calls as a
    Chrome trace (Perfetto, chrome://tracing) at exit. Import mpinb before taking ``MPI.COMM_WORLD``."""
    launched = any(name in _os.environ for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"))
    if _os.environ.get("MPINB_TRACE") and launched:
        from .rank.tracing import script_trace

        script_trace(_os.environ["MPINB_TRACE"])


_trace_script()


def load_ipython_extension(ipython):
    """Register ``%mpi`` and ``%%mpi``; the magic machinery is imported only now, never on ranks."""
    from .notebook.debug import visual_debugger
    from .notebook import panel, stops
    from .notebook.magics import MPIMagics

    ipython.register_magics(MPIMagics(shell=ipython))
    visual_debugger.install(ipython)
    stops.guard(ipython)  # a Stop once the cell's code is over (its views sealed, its reply sent) is let go
    panel.install(ipython)  # JupyterLab's MPI panel: the kernel's world, written for the Jupyter server


def unload_ipython_extension(ipython):
    """Stop the world this shell started."""
    magics = ipython.magics_manager.registry.get("MPIMagics")
    if magics is not None and magics.world is not None:
        magics.stop()
    from .notebook import stops
    from .widgets import views

    if views.seal_all in ipython.events.callbacks["post_run_cell"]:
        ipython.events.unregister("post_run_cell", views.seal_all)
    stops.unguard(ipython)
