"""The root of the errors mpinb raises on purpose, and the one the cell channel raises when the world is gone: here,
below everything that raises them, so that the channel needs nothing above it; ``mpinb/errors.py`` re-exports
both, and users name and catch them there."""


class MpinbError(Exception):
    """Every error mpinb raises on purpose. Its message says what happened and what to do; IPython shows it
    without mpinb's own frames (``_render_traceback_``), and the magics show :class:`BadArguments` and
    :class:`NoMPI` as the one-line ``UsageError`` of a magic."""

    __module__ = "mpinb.errors"  # the name users import, catch and see in a plain traceback

    def _render_traceback_(self):
        return [f"\x1b[1;31m{type(self).__name__}\x1b[0m: {self}"]


class MPIError(MpinbError):
    """The MPI world itself went wrong or is not there: it did not start, it stopped, a rank of it died."""

    __module__ = "mpinb.errors"
