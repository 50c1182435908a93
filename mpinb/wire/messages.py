"""The cell channel's message format, shared by notebook and ranks: pickled messages signed with HMAC-SHA256,
numbered per sender, and encrypted with CurveZMQ when the channel listens off loopback.

A message is ``[head, *buffers]``, its head the signature (32 bytes), the header's length (2 bytes), the header
and the pickled payload, in one frame (a frame costs a send and a receive of its own). The header says the
protocol version, who sent it and its number in that sender's stream; the header, the payload and the number
and lengths of the raw buffers (gathered array bytes, only ever read as array contents, never unpickled) are
signed. A receiver drops unread a
message that is not signed with the world's key, and one whose number is not above the last it took from that
sender, so a captured message replayed or reordered is never acted on, and no other user can run code on the
ranks or feed pickles to the notebook.
"""

import hashlib
import hmac
import itertools
import pickle
from collections import Counter

import zmq
from zmq.utils import z85

SIGNATURE = 32  # bytes of HMAC-SHA256
PROTOCOL = 8  # raise it when a message's layout or meaning changes: notebook and ranks must agree


class ProtocolMismatch(RuntimeError):
    """A peer speaks another version of the channel protocol: a different mpinb is installed on its host."""


def derive_key(secret, salt):
    """The channel's key: HMAC-SHA256 of *salt* under *secret* (ipyparallel's session key, which the notebook
    and every engine hold already). Only the salt travels when a world starts, so the key never crosses the
    network, even where ipyparallel's own messages are not encrypted."""
    if not secret:
        raise ValueError("ipyparallel's session has no key: the cell channel needs one to sign its messages")
    return hmac.new(secret, b"mpinb cell channel\0" + salt, hashlib.sha256).digest()


def curve_server_keys(key):
    """``(public, secret)``: the channel's CurveZMQ server key pair (Z85), derived from the channel's *key*.

    Each rank derives the public half itself, so no key travels, and a peer without ipyparallel's session key
    cannot even finish the CurveZMQ handshake."""
    secret = z85.encode(hmac.new(key, b"mpinb curve server", hashlib.sha256).digest())
    return zmq.curve_public(secret), secret


def encrypt_server(socket, key):
    """Make *socket* (bound by the notebook) a CurveZMQ server with the channel's key pair."""
    _, secret = curve_server_keys(key)
    socket.curve_secretkey = secret
    socket.curve_server = True


def encrypt_client(socket, key):
    """Make *socket* (a rank's, before it connects) a CurveZMQ client of the channel's server key."""
    socket.curve_serverkey = curve_server_keys(key)[0]
    socket.curve_publickey, socket.curve_secretkey = zmq.curve_keypair()


class Signer:
    """Packs the messages of one sender's stream (``notebook``, ``rank/3/outbox``): signed with *key*, numbered
    from 1.

    One stream per thread that packs: numbers must reach the receiver in the order they were given."""

    def __init__(self, key, sender):
        self.key, self.sender = key, sender.encode()
        self._numbers = itertools.count(1)

    def pack(self, message, buffers=()):
        header = b"mpinb/%d %s %d" % (PROTOCOL, self.sender, next(self._numbers))
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        head = b"".join((_sign(self.key, header, payload, buffers), len(header).to_bytes(2, "little"), header,
                         payload))
        return [head, *buffers]


class Verifier:
    """Unpacks what one receiver gets: drops what is not signed with *key* and what is not newer than the last
    message taken from the same sender; ``rejected`` counts what was dropped and why."""

    def __init__(self, key):
        self.key = key
        self.last = {}  # sender -> number of the last message taken from it
        self.rejected = Counter()
        self.mismatch = None

    def unpack(self, frames):
        """The message in *frames*, or ``None``."""
        unpacked = self.unpack_with_buffers(frames)
        return None if unpacked is None else unpacked[0]

    def unpack_with_buffers(self, frames):
        """``(message, buffers)`` from *frames* (bytes or zmq frames), or ``None`` when dropped.

        A signed message of another protocol version is dropped too, and ``mismatch`` says who sent it (the
        handshake raises it as :class:`ProtocolMismatch`). The signature is checked before anything else is read:
        what another process sends unsigned changes nothing here but the ``rejected`` count."""
        if not frames:
            self.rejected["malformed"] += 1
            return None
        head, *buffers = (_bytes(frame) for frame in frames)
        head = memoryview(head)
        size = int.from_bytes(head[SIGNATURE:SIGNATURE + 2], "little")
        signature, header, payload = head[:SIGNATURE], head[SIGNATURE + 2:SIGNATURE + 2 + size], \
            head[SIGNATURE + 2 + size:]
        # the signature first: nothing a message says (its version among it) is believed before it is checked
        if len(head) < SIGNATURE + 2 or not hmac.compare_digest(bytes(signature),
                                                                _sign(self.key, header, payload, buffers)):
            self.rejected["unsigned"] += 1
            return None
        try:
            version, sender, number = bytes(header).split(b" ")
            number = int(number)
        except ValueError:
            self.rejected["malformed"] += 1
            return None
        if version != b"mpinb/%d" % PROTOCOL:
            self.rejected["version"] += 1
            self.mismatch = ProtocolMismatch(
                f"{_who(sender)} speaks the cell channel's protocol "
                f"{version.decode(errors='replace')}, this notebook mpinb/{PROTOCOL}: install the same mpinb "
                "version on every host")
            return None
        if number <= self.last.get(sender, 0):
            self.rejected["replayed"] += 1
            return None
        self.last[sender] = number
        return pickle.loads(payload), buffers


def _who(sender):
    """``rank 3`` for a rank's stream (``rank/3/inbox``), else the sender's name."""
    parts = sender.decode(errors="replace").split("/")
    return f"rank {parts[1]}" if parts[0] == "rank" and len(parts) > 1 else parts[0]


SMALL = 1 << 16  # bytes of payload under which signing joins the parts rather than feeding them one by one


def _sign(key, header, payload, buffers):
    if len(payload) < SMALL and not buffers:  # most messages: one call into OpenSSL, no HMAC object
        return hmac.digest(key, b"".join((len(header).to_bytes(4, "little"), header, payload)), "sha256")
    mac = hmac.new(key, len(header).to_bytes(4, "little"), hashlib.sha256)
    mac.update(header)
    mac.update(payload)
    for buffer in buffers:
        mac.update(memoryview(buffer).nbytes.to_bytes(8, "little"))
    return mac.digest()


def _bytes(frame):
    """A zmq frame's contents without copying (``memoryview``), or the bytes as they are."""
    return frame.buffer if hasattr(frame, "buffer") else frame
