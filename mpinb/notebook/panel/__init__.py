"""JupyterLab's MPI panel, the kernel's end: ``model.py`` holds what the panel shows of the world (fed by the running
cell's messages), ``publisher.py`` writes it a few times a second for the Jupyter server (``mpinb/server/``).
Outside a Jupyter kernel these do nothing."""

import atexit
import logging

from .publisher import EVERY, Publisher, kernel_id

__all__ = ["cell_ended", "cell_started", "feed", "install", "publisher", "start", "stop"]

log = logging.getLogger("mpinb")

_publisher = None
_looked = False


def publisher():
    """This kernel's :class:`Publisher`, started on first use; ``None`` outside a Jupyter kernel."""
    global _publisher, _looked
    if not _looked:
        _looked = True
        kernel = kernel_id()
        if kernel is not None:
            _publisher = Publisher(kernel)
            _publisher.start()
            atexit.register(_publisher.close)
    return _publisher


def install(ipython):
    """After each cell of *ipython* (a kernel's shell), show the world its ``%mpi`` magics hold now: one started
    by ``%mpi start`` shows before its first ``%%mpi`` cell, one stopped goes."""

    def after_cell(result=None):
        current = publisher()
        magics = ipython.magics_manager.registry.get("MPIMagics")
        if current is not None and magics is not None:
            current.world = magics.world

    ipython.events.register("post_run_cell", after_cell)


def start(kernel, *, directory=None, every=EVERY):
    """Publish this process's world as kernel *kernel*'s (in *directory*, default ``wire/panel_files``'s), in place
    of any publisher started before: for a shell that is not a Jupyter kernel (the panel's benchmark)."""
    global _publisher, _looked
    stop()
    _looked = True
    _publisher = Publisher(kernel, every=every, directory=directory)
    _publisher.start()
    return _publisher


def stop():
    """Stop publishing (the state file is removed): the next cell runs without the panel."""
    global _publisher
    if _publisher is not None:
        _publisher.close()
        _publisher = None


def cell_started(world, number, ranks, code):
    """A ``%%mpi`` cell was sent to *ranks* of *world*: the panel asks them where they are until it ends."""
    current = publisher()
    if current is not None:
        current.cell_started(world, number, ranks, code)


def feed(message):
    """A message of the running cell; whether it was the panel's own roll-call answer (for no one else)."""
    if _publisher is None:
        return False
    try:
        return _publisher.feed(message)
    except Exception as exc:  # noqa: BLE001 - the panel never breaks a cell: it shows less
        log.debug("mpinb panel: %s", exc, exc_info=True)
        return False


def cell_ended():
    if _publisher is not None:
        _publisher.cell_ended()
