"""A restore: which cells a rank has a whole snapshot of, and putting one back into the rank's namespace."""

import os
import pickle
import time

from ...wire import files
from .pickling import RANDOM_STATE, loading, set_random_state


def changes_namespace(call):
    """Whether *call* (a ``Call`` of mpinb's own rank-side code) changes the rank's namespace as a cell does."""
    return call.module == restore.__module__ and call.name == restore.__name__


def available(directory, rank=None):
    """The cells this rank has a whole snapshot of under *directory* (a world's snapshot folder on this host)."""
    from ..runner import user_namespace

    rank = user_namespace()["rank"] if rank is None else rank
    try:
        names = os.listdir(os.path.join(directory, f"rank-{rank}"))
    except FileNotFoundError:
        return []
    return sorted(int(name.removeprefix("cell-")) for name in names if name.startswith("cell-"))


def restore(directory, cell, rank=None, namespace=None):
    """Put the variables of *rank*'s snapshot of cell *cell* (under *directory*, a world's snapshot folder on this
    host) into *namespace* (the rank's, by default), and the global random generators' state; returns ``(names
    restored, {name: why not kept}, bytes read, seconds)``. Called on each rank of a fresh world by a restart.

    Nothing is unpickled unless *directory*, the rank's folder, its blobs' folder and every file read are this
    user's own, private and not reached through a link (another user of a shared host could have planted them)."""
    from ..runner import user_namespace

    namespace = user_namespace() if namespace is None else namespace
    rank = namespace["rank"] if rank is None else rank
    tic = time.perf_counter()
    root = os.path.join(directory, f"rank-{rank}")
    blobs = os.path.join(root, "blobs")
    path = os.path.join(root, f"cell-{cell:08d}")
    if not os.path.lexists(path):
        raise FileNotFoundError(f"no snapshot of cell {cell} on this host ({path})")
    for folder in (directory, root, blobs):
        if not files.private_directory(folder):
            raise PermissionError(f"{folder} is not a private directory of this user's: its snapshot is not read")
    manifest = pickle.loads(_read_own(path))
    buffers = [_read_own(os.path.join(blobs, digest)) for digest in manifest["buffers"]]
    read = sum(len(data) for data in buffers)
    with loading(namespace):
        values = pickle.loads(manifest["header"], buffers=buffers)
    namespace.update(values)
    if RANDOM_STATE in manifest:
        set_random_state(manifest[RANDOM_STATE])
    return manifest["names"], manifest["not_kept"], read, time.perf_counter() - tic


def _read_own(path):
    """The bytes of *path*, a regular file of this user's that no one else may write, never through a link."""
    fd = files.open_own(path, os.O_RDONLY)
    with open(fd, "rb") as file:
        status = os.fstat(file.fileno())
        if status.st_mode & 0o022:
            raise PermissionError(f"{path} may be written by other users: its snapshot is not read")
        data = bytearray(status.st_size)
        file.readinto(data)
    return data
