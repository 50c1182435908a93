"""Run a script file on this rank as ``__main__`` in the cell's namespace, as ``python FILE ARGS`` would."""

import argparse
import os
import sys

from . import runner, stacks


class ScriptExit(Exception):
    """The script ended with ``sys.exit`` (or ``exit()``) and a status other than 0: said in one line rather than
    ending the rank, which the notebook still drives."""


class _ArgumentsRejected(SystemExit):
    """argparse's ``error()``: its usage and message kept for the one :class:`ScriptExit` that says it, instead of
    printed by every rank (a ``SystemExit``, so a script that catches argparse's exit still does)."""

    def __init__(self, text):
        super().__init__(2)
        self.text = text


def run(path, args=(), *, namespace=None):
    """Run the script at *path* on this rank with ``sys.argv = [path, *args]``, in *namespace* (the cell's: the
    script's globals stay there for the next cell), as ``__main__`` with ``__file__`` set.

    Its source is compiled under its own file name, so tracebacks and pdb show the file and its lines. The
    namespace's ``__name__`` and ``__file__``, ``sys.argv`` and ``sys.path`` are put back afterwards, however the
    script ended. ``sys.exit(0)`` (or ``exit()``) ends it as a script's exit would; another status raises
    :class:`ScriptExit`, argparse's usage and error attached to it as a note.
    """
    if namespace is None:
        namespace = runner.user_namespace()
    _process_groups_alike()
    name = os.path.basename(path)
    with open(path, "rb") as file:
        source = file.read()
    code = compile(source, path, "exec", dont_inherit=True)  # bytes: its coding line or BOM is honoured
    missing = object()
    kept = {key: namespace.get(key, missing) for key in ("__name__", "__file__", "exit", "quit")}
    argv, directory = sys.argv, os.path.dirname(path)
    added = directory not in sys.path
    error = argparse.ArgumentParser.error
    namespace.update(__name__="__main__", __file__=path, exit=_leave, quit=_leave)
    sys.argv = [path, *args]
    if added:
        sys.path.insert(0, directory)  # as python FILE does: modules beside the script import
    argparse.ArgumentParser.error = _rejected
    try:
        with stacks.running_file(path):
            exec(code, namespace)
    except SystemExit as exc:
        failure = _failure(name, exc)
        if failure is not None:
            raise failure from None
    finally:
        argparse.ArgumentParser.error = error
        if added and directory in sys.path:
            sys.path.remove(directory)
        sys.argv = argv
        for key, value in kept.items():
            if key in ("exit", "quit") and namespace.get(key) is not _leave:
                continue  # the script's own
            if value is missing:
                namespace.pop(key, None)
            else:
                namespace[key] = value


def _process_groups_alike():
    """Before a script runs, torch.distributed's default process group is on every rank or on none.

    A script run in a process of its own ends with its groups. Here the ranks live on, and a run that failed on
    one rank after another had destroyed its group at the end (``destroy_process_group()``, as the PyTorch DDP
    tutorial does) leaves a group on the first rank only: the next run's ``init_process_group`` then fails there
    ("initialize the default process group twice") while the other ranks wait for it. A rank whose group its
    peers no longer have destroys it too, so the script starts on every rank as in a new process. Every rank
    calls this first, before anything of the script's can fail, on mpi4py's own (untraced) ``COMM_WORLD``, so
    no ledger counts it.
    """
    from mpi4py import MPI

    from ..wire.ranks import label_ranks
    from .tracing.comms import registry

    dist = sys.modules.get("torch.distributed")
    mine = bool(dist is not None and dist.is_available() and dist.is_initialized())
    world = registry.installed["original"][0] if registry.installed is not None else MPI.COMM_WORLD
    everyone = world.allgather(mine)
    if mine and not all(everyone):
        dist.destroy_process_group()
        without = [rank for rank, has in enumerate(everyone) if not has]
        print(f"torch.distributed's default process group, destroyed on {label_ranks(without)} by the last run, "
              "destroyed here too: the script starts with none on every rank, as in a new process",
              file=sys.stderr)


def _failure(name, exc):
    """The :class:`ScriptExit` that says how the script *name* ended with *exc*, or ``None`` for status 0."""
    code = exc.code
    if code is None or (isinstance(code, int) and code == 0):
        return None
    if isinstance(code, int):
        failure = ScriptExit(f"{name} exited with status {code}")
    else:
        failure = ScriptExit(f"{name} exited with status 1: {code}")  # as Python prints it, then exits with 1
    if isinstance(exc, _ArgumentsRejected):
        failure.add_note(exc.text.rstrip("\n"))
    return failure


def _leave(code=None):
    """``exit()`` and ``quit()`` in a script: its end, as under ``python FILE`` (in a cell they say why not)."""
    raise SystemExit(code)


def _rejected(parser, message):
    """argparse's ``error()``: the usage and the message it would print, carried by its exit with status 2."""
    raise _ArgumentsRejected(f"{parser.format_usage()}{parser.prog}: error: {message}\n")

