"""The port where a torch group's ranks meet, held from the moment it is chosen until torch's store serves there.

A port chosen free and then left bound but not listening (or closed) can be taken meanwhile: a program that
picks its ports by binding port 0 and closing it, and binds them again later with ``SO_REUSEADDR`` (zmq's
listeners: ipyparallel's controller, a Jupyter kernel), gets the same number from the kernel, binds beside a
socket that does not listen, and listens there first; rank 0's store then fails with EADDRINUSE and the other
ranks retry against that program. So the port is held by a socket that listens (no other socket of the host can
bind it then, ``SO_REUSEADDR`` or not), and the first store made on it as the server (``env://``, ``tcp://``, or
the user's own ``dist.TCPStore(..., is_master=True)``) is given that socket (``master_listen_fd``), as
``torchrun``'s agent makes its store on a socket it already listens on. A rank that connects before the store
exists waits in the socket's backlog, as under ``torchrun``.
"""

import socket
import sys

from .on_import import when_imported

_held = {}  # port -> the listening socket holding it, until a store takes it over
_stores = []  # the multi-tenant stores made on a held socket: torch's server of a port lives while one of them does
_ARGUMENTS = ("host_name", "port", "world_size", "is_master", "timeout", "wait_for_workers", "multi_tenant",
              "master_listen_fd", "use_libuv")  # TCPStore's, in its order


def hold(address=""):
    """A free port of this host on *address* (every address by default), listening from now on; its number."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind((address, 0))
    holder.listen()
    port = holder.getsockname()[1]
    _held[port] = holder
    when_imported("torch.distributed", _serve_held_ports)
    return port


def _serve_held_ports(dist):
    """``dist.TCPStore`` (and the one ``env://`` and ``tcp://`` make, ``torch.distributed.rendezvous``'s) made as
    the server of a held port on the socket that holds it; anything else as before (idempotent)."""
    original = dist.TCPStore
    if getattr(original, "serves_held_ports", False):
        return

    class TCPStore(original):
        serves_held_ports = True

        def __init__(self, *args, **kwargs):
            given = {**dict(zip(_ARGUMENTS, args)), **kwargs}
            holder = None
            if given.get("is_master") and given.get("master_listen_fd") is None:
                holder = _held.pop(given.get("port"), None)
            if holder is None:
                super().__init__(*args, **kwargs)
                return
            given["master_listen_fd"] = holder.detach()  # the store owns the socket from here
            super().__init__(**given)
            if given.get("multi_tenant"):
                _stores.append(self)  # a later group on this port gets this server, as torch's multi-tenant one does

    TCPStore.__module__, TCPStore.__qualname__, TCPStore.__doc__ = \
        original.__module__, original.__qualname__, original.__doc__
    dist.TCPStore = TCPStore
    rendezvous = sys.modules.get("torch.distributed.rendezvous")
    if rendezvous is not None and getattr(rendezvous, "TCPStore", None) is original:
        rendezvous.TCPStore = TCPStore
