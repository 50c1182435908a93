"""The port where a torch group's ranks meet, held from the moment it is chosen until torch's store serves there.

A port chosen free and then left bound but not listening (or closed) can be taken meanwhile: a program that
picks its ports by binding port 0 and closing it, and binds them again later with ``SO_REUSEADDR`` (zmq's
listeners: ipyparallel's controller, a Jupyter kernel), gets the same number from the kernel, binds beside a
socket that does not listen, and listens there first; rank 0's store then fails with EADDRINUSE and the other
ranks retry against that program. So the port is held by a socket that listens (no other socket of the host can
bind it then, ``SO_REUSEADDR`` or not), and the first store torch makes on it as the server (``env://`` and
``tcp://`` meet through ``torch.distributed.rendezvous._create_c10d_store``) is given that socket
(``master_listen_fd``), as ``torchrun``'s agent makes its store on a socket it already listens on. A rank that
connects before the store exists waits in the socket's backlog, as under ``torchrun``.
"""

import functools
import socket

from .on_import import when_imported

_held = {}  # port -> the listening socket holding it, until a store takes it over
_stores = []  # the stores made on a held socket: torch's server of a port lives while one of them does


def hold(address=""):
    """A free port of this host on *address* (every address by default), listening from now on; its number."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind((address, 0))
    holder.listen()
    port = holder.getsockname()[1]
    _held[port] = holder
    when_imported("torch.distributed.rendezvous", _serve_held_ports)
    return port


def _serve_held_ports(rendezvous):
    """Make the stores of held ports on their sockets (idempotent)."""
    original = rendezvous._create_c10d_store
    if getattr(original, "serves_held_ports", False):
        return

    @functools.wraps(original)
    def _create_c10d_store(hostname, port, rank, world_size, timeout, use_libuv=True):
        server = rank == 0 and not rendezvous._torchelastic_use_agent_store()
        holder = _held.pop(port, None) if server else None
        if holder is None:
            return original(hostname, port, rank, world_size, timeout, use_libuv)
        store = rendezvous.TCPStore(host_name=hostname, port=port, world_size=world_size, is_master=True,
                                    timeout=timeout, multi_tenant=True, use_libuv=use_libuv,
                                    master_listen_fd=holder.detach())  # the store owns the socket from here
        _stores.append(store)  # a later group on this port gets this server, as torch's multi-tenant store does
        return store

    _create_c10d_store.serves_held_ports = True
    rendezvous._create_c10d_store = _create_c10d_store
