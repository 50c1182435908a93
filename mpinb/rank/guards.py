"""What would otherwise hang or fail silently on a rank of a notebook's world, made to say why instead.

Its frames are left out of the tracebacks users see (``wire/rank_files.py``'s ``WRAPPERS``): the error is about the cell's call.
"""


class NoKeyboard(EOFError):
    """``input()`` on a rank: there is nobody to type (an ``EOFError``, as code that handles end of input expects)."""


def guard_world(MPI, namespace=None):
    """What would otherwise hang or fail silently on a rank of a notebook's world says why instead.

    ``MPI.Finalize()`` mid-cell would end MPI on one rank while the notebook still drives the others (the next
    collective blocks forever); ``input()`` would read end-of-file from mpiexec's stdin without a word; IPython's
    ``exit()`` and ``quit()`` would do nothing until the engine's next request, then leave the rank waiting in
    ``MPI_Finalize`` for the others.
    """
    import builtins

    class Leave:
        def __init__(self, name):
            self.name = name

        def __repr__(self):
            return f"{self.name}() ends a rank alone, which a notebook's world cannot do: %mpi stop ends the world"

        def __call__(self, *args, **kwargs):
            raise RuntimeError(f"{self.name}() is not for a notebook's world: it would end this rank while the "
                               "notebook still drives the others. %mpi stop ends the world; to leave a cell early, "
                               "raise an exception")

    def finalize():
        raise RuntimeError("MPI.Finalize() is not for a notebook's world: it would end MPI on this rank while the "
                           "notebook still drives the others. %mpi stop ends the world (and MPI on every rank); "
                           "a script exported with mpinb export may call it")

    def keyboard(prompt=""):
        raise NoKeyboard("input() on a rank has no keyboard to read from: set the value in the cell, or read it "
                         "in the notebook and pass it in, e.g. value = comm.bcast(value, root=0)")

    MPI.Finalize = finalize
    builtins.input = keyboard
    for name in ("exit", "quit"):
        setattr(builtins, name, Leave(name))
        if namespace is not None:
            namespace[name] = getattr(builtins, name)
