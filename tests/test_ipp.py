"""What mpinb uses of ipyparallel beyond its documented API (mpinb/notebook/world/ipp.py) is still there, in the major
version pyproject.toml pins: a failure names the part that changed, instead of a world failing later."""

import inspect
import re
from pathlib import Path

import ipyparallel
from ipyparallel import Cluster
from ipyparallel.cluster.launcher import BatchSystemLauncher, ControllerLauncher, LocalProcessLauncher

from mpinb.notebook.world import ipp

PYPROJECT = (Path(__file__).parent.parent / "pyproject.toml").read_text()


def test_the_installed_ipyparallel_is_the_major_version_pinned():
    low, high = map(int, re.search(r'"ipyparallel>=(\d+)[\d.]*,<(\d+)"', PYPROJECT).groups())
    major = int(ipyparallel.__version__.split(".")[0])
    assert low <= major < high, f"ipyparallel {ipyparallel.__version__} is not the {low}.x mpinb is tested with"


def test_the_batch_launchers_still_submit_and_cancel_through_run_command():
    assert "BatchSystemLauncher._run_command" in ipp.PRIVATE
    assert callable(getattr(BatchSystemLauncher, "_run_command", None)), "BatchSystemLauncher._run_command is gone"
    for method in (BatchSystemLauncher.start, BatchSystemLauncher.stop):
        assert "self._run_command(" in inspect.getsource(method), (
            f"BatchSystemLauncher.{method.__name__} no longer calls _run_command: a refused job's reason is lost")
    launcher = ipp.batch_launcher("slurm")
    assert launcher.config_section == launcher.__bases__[-1].__name__ == "SlurmEngineSetLauncher"


def test_a_clusters_event_loop_thread_is_still_where_mpinb_stops_it():
    assert "Cluster._async_thread, Cluster._thread_loop" in ipp.PRIVATE
    assert hasattr(Cluster, "_async_thread"), "Cluster._async_thread is gone: worlds would leave threads behind"
    source = inspect.getsource(inspect.getmodule(Cluster.__mro__[[c.__name__ for c in Cluster.__mro__].index(
        "AsyncFirst")]))
    assert "self._thread_loop = " in source, "Cluster._thread_loop is gone: worlds would leave event loops behind"


def test_the_launcher_attributes_mpinb_reads_are_where_it_reads_them():
    for cls, names in ((LocalProcessLauncher, ("process", "output_file", "pid")),
                       (BatchSystemLauncher, ("job_id", "output_file"))):
        for name in names:
            assert hasattr(cls, name) or name in cls.class_traits(), f"{cls.__name__}.{name} is gone"
    assert isinstance(inspect.getattr_static(ControllerLauncher, "connection_files"), property), (
        "ControllerLauncher.connection_files is gone: the world's key files would be left behind")


def test_the_controller_mpinb_runs_still_sleeps_only_where_it_skips_the_sleep():
    """``notebook/world/controller.py`` runs ``init_hub`` with ``time.sleep`` of ipyparallel's controller module a no-op:
    that sleep is still there (else the module is needed no more), and it is the only use of ``time`` there."""
    from ipyparallel.controller import app

    from mpinb.notebook.world import controller

    assert "IPController.init_hub's time.sleep" in ipp.PRIVATE
    assert "time.sleep(" in inspect.getsource(app.IPController.init_hub), "init_hub no longer sleeps"
    uses = re.findall(r"\btime\.(\w+)", inspect.getsource(app))
    assert uses == ["sleep"], f"ipyparallel's controller module now uses time.{uses}: check the shim still fits"
    with controller._without_sleep():
        assert app.time.sleep(60) is None  # returns at once (the suite has a timeout)
        assert app.time.monotonic() > 0  # the rest of the time module as it is
    assert app.time is __import__("time")
    assert controller.Controller.init_hub is not app.IPController.init_hub
