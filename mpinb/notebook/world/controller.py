"""ipyparallel's controller as ``python -m ipyparallel.controller`` runs it, without the quarter second it sleeps
before writing its connection files.

``IPController.init_hub`` sleeps 0.25 s once it has made its database backend, before it makes the hub and writes
the connection files. mpinb's worlds use ``NoDB``, a dict, and every rank of a start waits for those files: on 2
cores the start's processes sat idle for that quarter second (``benchmarks/profile.py``, cores sampled from
``/proc/stat``). Here ``init_hub`` runs with that module's ``time.sleep`` a no-op; the controller is otherwise
ipyparallel's own, its options and configuration included.

    python -m mpinb.notebook.world.controller [ipcontroller options]
"""

import contextlib
import time
import types

from ipyparallel.controller import app


class _NoSleep(types.ModuleType):
    """The ``time`` module, less its ``sleep``."""

    def __getattr__(self, name):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds):
        pass


@contextlib.contextmanager
def _without_sleep():
    kept, app.time = app.time, _NoSleep("time")
    try:
        yield
    finally:
        app.time = kept


class Controller(app.IPController):
    """``IPController`` whose ``init_hub`` does not sleep."""

    def init_hub(self):
        with _without_sleep():
            super().init_hub()


if __name__ == "__main__":
    Controller.launch_instance()
