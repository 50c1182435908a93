"""mpinb: a Jupyter notebook as the driver of a real MPI job (``%load_ext mpinb``, then ``%%mpi``)."""

__version__ = "0.1.0"
__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython):
    """Register ``%mpi`` and ``%%mpi``; the magic machinery is imported only now, never on ranks."""
    from .magics import MPIMagics

    ipython.register_magics(MPIMagics(shell=ipython))


def unload_ipython_extension(ipython):
    """Stop the world this shell started."""
    magics = ipython.magics_manager.registry.get("MPIMagics")
    if magics is not None and magics.world is not None:
        magics.stop()
