"""Where JupyterLab's MPI panel finds a kernel's world: one JSON state file per kernel, written by the kernel a few
times a second (``notebook/panel/``), read by the Jupyter server for the browser (``mpinb/server/``); and the
requests the server leaves beside it for the kernel (a rank's stacks). A private directory under Jupyter's
runtime directory, which the kernel and the server of one user share."""

import json
import os

from . import files

VERSION = 1  # of the state file's layout, which the browser checks
STATE = ".json"
REQUESTS = ".requests"  # a directory per kernel: one file per request, removed once taken


def panel_dir(*, create=True):
    """``$MPINB_PANEL_DIR``, else ``<jupyter runtime dir>/mpinb-panel``: owner-only, made when missing."""
    path = os.environ.get("MPINB_PANEL_DIR")
    if not path:
        from jupyter_core.paths import jupyter_runtime_dir

        path = os.path.join(jupyter_runtime_dir(), "mpinb-panel")
    if create and not os.path.isdir(path):
        os.makedirs(path, mode=0o700, exist_ok=True)
    if create and not files.private_directory(path):
        raise PermissionError(f"{path} is not a directory of this user's alone: the MPI panel keeps no state there")
    return path


def state_path(kernel_id, directory=None):
    return os.path.join(directory or panel_dir(), f"{kernel_id}{STATE}")


def requests_dir(kernel_id, directory=None):
    return os.path.join(directory or panel_dir(), f"{kernel_id}{REQUESTS}")


def write_state(path, state):
    """*state* as JSON, through a file of this process's renamed over *path*: a reader never sees half of it. The
    directory is owner-only (:func:`panel_dir`), so the file beside it keeps one name (no ``mkstemp`` each time:
    this runs a few times a second)."""
    text = json.dumps(state, separators=(",", ":"), allow_nan=False, default=str).encode()
    fresh = f"{path}.{os.getpid()}.tmp"
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | files.NOFOLLOW, 0o600)
    try:
        os.write(fd, text)
    finally:
        os.close(fd)
    os.replace(fresh, path)


def read_json(path):
    """The JSON object in *path*, or ``None`` (missing, unreadable, half written by another writer)."""
    try:
        fd = files.open_own(path, os.O_RDONLY)
        with open(fd) as file:
            return json.load(file)
    except (OSError, ValueError):
        return None


def post_request(kernel_id, request_id, request, directory=None):
    """Leave *request* (``{"action": "stacks", "rank": 2}``) for kernel *kernel_id*'s panel thread."""
    folder = requests_dir(kernel_id, directory)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    files.replace(os.path.join(folder, f"{request_id}.json"), lambda file: json.dump(request, file))


def take_requests(kernel_id, directory=None):
    """``[(request_id, request)]`` left for *kernel_id*, each removed as it is read (oldest first)."""
    folder = requests_dir(kernel_id, directory)
    try:
        names = sorted(os.listdir(folder))  # the server names them by time, so this is the order they came in
    except OSError:
        return []
    taken = []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = os.path.join(folder, name)
        request = read_json(path)
        try:
            os.unlink(path)
        except OSError:
            continue
        if isinstance(request, dict):
            taken.append((name[:-5], request))
    return taken
