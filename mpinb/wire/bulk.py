"""Large messages across hosts (a rank's reply with gathered arrays), sealed with AES-GCM instead of CurveZMQ.

CurveZMQ moves a large message at a fifth of the link's speed (one message of 128 MB: 0.33 GB/s on a 1.6 GB/s link,
``benchmarks/RESULTS.md``). AES-GCM from OpenSSL (through ``cryptography``), with the CPU's AES instructions, seals
and opens several GB/s on one core. Such a message leaves on a socket of its own without CurveZMQ, as a stream of
chunks of ``CHUNK`` bytes, each its own ZeroMQ message: the link carries one chunk while the rank seals the next
and the notebook opens the one before.

Each sender seals with a key of its own, derived from the channel's key (which never crosses the network); the
nonce of a chunk is the sender's message number and the chunk's index, and the chunk's plain prefix (sender,
number, index, count, and the parts' lengths) is authenticated with it. A chunk replayed, reordered, cut or moved
to another message fails to open, and a whole message replayed is refused by its number. What the sealed
message holds is the channel's usual signed message (``messages.py``), checked as usual once opened. The
notebook learns that such a message is next from a marker on the CurveZMQ channel, in order with the sender's
output (:class:`~mpinb.wire.kinds.Bulk`).
"""

import hashlib
import hmac
import itertools
import struct

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

CHUNK = 1 << 21  # bytes sealed per chunk: small enough to overlap sealing, sending and opening
MINIMUM = 1 << 20  # messages of at least this many bytes go this way; smaller ones stay on CurveZMQ
TAG = 16  # bytes of AES-GCM's authentication tag
_PREFIX = struct.Struct("<QII")  # message number, chunk index, chunk count


def _key(key, sender):
    return hmac.new(key, b"mpinb bulk\0" + sender, hashlib.sha256).digest()


def _nonce(number, index):
    return number.to_bytes(8, "little") + index.to_bytes(4, "little")


def _chunks(parts):
    """``(part, start, end)`` for each chunk of *parts* (memoryviews): a chunk never spans two parts."""
    for i, part in enumerate(parts):
        size = part.nbytes
        for start in range(0, max(size, 1), CHUNK):
            yield i, start, min(size, start + CHUNK)


class Sealer:
    """Seals the large messages of one sender (``rank/3``) of a world with channel *key*."""

    def __init__(self, key, sender):
        self.sender = sender.encode()
        self.aead = AESGCM(_key(key, self.sender))
        self._numbers = itertools.count(1)

    def seal(self, frames):
        """The chunk messages (each a list of two frames: its plain prefix and the sealed bytes) of the signed
        message *frames* (``[head, *buffers]``), made one at a time as they are sent."""
        number = next(self._numbers)
        parts = [memoryview(frame).cast("B") for frame in frames]
        lengths = struct.pack(f"<{len(parts)}Q", *(part.nbytes for part in parts))
        chunks = list(_chunks(parts))
        for index, (i, start, end) in enumerate(chunks):
            prefix = b"".join((self.sender, b"\0", _PREFIX.pack(number, index, len(chunks)),
                               lengths if index == 0 else b""))
            # into memory of our own: encrypt() returning new bytes per chunk took 57 ms for 32 MB here, against
            # 7 ms into a buffer (benchmarks/hosts.py's sealed arm)
            sealed = np.empty(end - start + TAG, dtype=np.uint8)
            self.aead.encrypt_into(_nonce(number, index), parts[i][start:end], prefix, sealed)
            yield [prefix, sealed]


class Opener:
    """Opens what the notebook receives on the bulk socket: per sender, the message being assembled; refuses
    what does not open, and messages not newer than the last one opened from the same sender. ``rejected``
    counts what was refused and why (the channel's ``Verifier.rejected``)."""

    def __init__(self, key, rejected):
        self.key, self.rejected = key, rejected
        self.aeads = {}
        self.last = {}  # sender -> number of the last message opened
        self.building = {}  # sender -> (number, parts, chunks, next index)
        self.done = {}  # sender -> [frames of messages opened, oldest first]

    def take(self, sender):
        """The oldest whole message opened from *sender* (``[head, *buffers]``), or ``None``."""
        waiting = self.done.get(sender)
        return waiting.pop(0) if waiting else None

    def forget(self, sender):
        """Drop *sender*'s message being opened (given up: it stopped coming)."""
        self.building.pop(sender, None)

    def feed(self, frames):
        """One chunk message; return the sender whose message it completed, or ``None``."""
        if len(frames) != 2:
            self.rejected["malformed"] += 1
            return None
        prefix, sealed = (memoryview(frame).cast("B") if not isinstance(frame, bytes) else frame for frame in frames)
        prefix = bytes(prefix)
        sender, _, rest = prefix.partition(b"\0")
        if len(rest) < _PREFIX.size or not sender.startswith(b"rank/"):
            self.rejected["malformed"] += 1
            return None
        number, index, count = _PREFIX.unpack_from(rest)
        aead = self.aeads.get(sender) or AESGCM(_key(self.key, sender))  # kept once a chunk of its opens
        if index == 0:
            return self._first(sender, aead, prefix, rest, sealed, number, count)
        building = self.building.get(sender)
        if building is None or building[0] != number or building[3] != index or len(building[2]) != count:
            self.rejected["unsigned"] += 1
            self.building.pop(sender, None)
            return None
        number, parts, chunks, _ = building
        i, start, end = chunks[index]
        try:
            if end - start + TAG != len(sealed):
                raise InvalidTag
            aead.decrypt_into(_nonce(number, index), sealed, prefix, memoryview(parts[i])[start:end])
        except InvalidTag:
            self.rejected["unsigned"] += 1
            self.building.pop(sender, None)
            return None
        return self._next(sender, number, parts, chunks, index)

    def _first(self, sender, aead, prefix, rest, sealed, number, count):
        """A message's first chunk: opened before anything is made for the message, since the parts' lengths it
        names are only to be believed once it opens."""
        if number <= self.last.get(sender, 0):
            self.rejected["replayed"] += 1
            return None
        sizes = rest[_PREFIX.size:]
        if len(sizes) % 8 or not sizes or len(sealed) < TAG:
            self.rejected["malformed"] += 1
            return None
        opened = np.empty(len(sealed) - TAG, dtype=np.uint8)
        try:
            aead.decrypt_into(_nonce(number, 0), sealed, prefix, opened)
        except InvalidTag:
            self.rejected["unsigned"] += 1
            return None
        self.aeads[sender] = aead
        self.building.pop(sender, None)  # a message of the sender's cut short by this one is dropped
        lengths = struct.unpack(f"<{len(sizes) // 8}Q", sizes)
        # not zero-filled first (bytearray would be): decrypt_into writes every byte, and the parts become the
        # gathered values themselves (notebook/cell/gather.py does not copy memory it owns)
        parts = [np.empty(length, dtype=np.uint8) for length in lengths]
        chunks = list(_chunks([memoryview(part) for part in parts]))
        i, start, end = chunks[0]
        if len(chunks) != count or end - start != opened.nbytes:
            self.rejected["malformed"] += 1  # sealed by a sender with the key: a bug, not an attack
            return None
        parts[i][start:end] = opened
        return self._next(sender, number, parts, chunks, 0)

    def _next(self, sender, number, parts, chunks, index):
        """After chunk *index* of a message opened: the sender when it was the last, else ``None``."""
        if index + 1 < len(chunks):
            self.building[sender] = (number, parts, chunks, index + 1)
            return None
        self.building.pop(sender, None)
        self.last[sender] = number
        self.done.setdefault(sender, []).append(parts)
        return sender
