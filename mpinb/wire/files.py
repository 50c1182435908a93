"""Files mpinb creates where another user could have planted something first: never opened through a symbolic
link, owner-only (0600), new where the name is mpinb's own, and kept in directories only their owner can enter.

The notebook makes each world a private directory (``tempfile.mkdtemp``, 0700) and passes it to the ranks as
``$MPINB_STATUS_DIR``; what a rank keeps on disk for the notebook goes there (:func:`private_directory` checks it
is what it claims), or, on a host where it does not exist, in a private directory of the rank's own. A file whose
name the user chose (``MPINB_TRACE``, ``MPINB_METRICS_FILE``) is written through a fresh file renamed over the
name (:func:`replace`), or appended to only when it is the user's own regular file (:func:`open_own`).
"""

import errno
import os
import stat
import tempfile
from pathlib import Path

NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def private_directory(path):
    """Whether *path* is a directory (not a link to one) of this user that no one else may enter or list."""
    try:
        status = os.lstat(path)
    except (OSError, TypeError, ValueError):
        return False
    return stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid() and not status.st_mode & 0o077


def create(path, *, append=False):
    """A new owner-only file at *path*, open for writing (a descriptor); ``FileExistsError`` when anything is
    there already, a planted link included."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | (os.O_APPEND if append else 0), 0o600)


def open_own(path, flags):
    """*path* opened with *flags* (``os.O_CREAT`` makes it owner-only) as a descriptor, never through a link, and
    only when it is this user's own regular file: ``OSError`` otherwise (``ELOOP`` for a link)."""
    fd = os.open(path, flags | NOFOLLOW, 0o600)
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode) or status.st_uid != os.getuid():
        os.close(fd)
        raise PermissionError(errno.EPERM, "not a file of this user's own", str(path))
    return fd


def replace(path, write, *, mode="w"):
    """Call ``write(file)`` on a fresh owner-only file beside *path*, then rename it to *path*: whatever was
    there (a planted link) is replaced, never written through, and no reader sees half a file. The fresh file
    is removed when anything fails."""
    fd, fresh = tempfile.mkstemp(prefix=".mpinb-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with open(fd, mode) as file:
            write(file)
        os.replace(fresh, path)
    except BaseException:
        Path(fresh).unlink(missing_ok=True)
        raise
