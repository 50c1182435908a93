"""The cell channel's message format, shared by notebook and ranks: pickled tuples signed with HMAC-SHA256.

A message is ``[signature, payload, *buffers]``. The payload is signed; raw buffers (gathered array bytes)
follow unsigned, but their number and lengths are signed, and they are only ever read as array contents, never
unpickled. A message whose signature does not match the world's key is dropped unread, so no other local user
can run code on the ranks or feed pickles to the notebook.
"""

import hashlib
import hmac
import pickle


def derive_key(secret, salt):
    """The channel's key: HMAC-SHA256 of *salt* under *secret* (ipyparallel's session key, which the notebook
    and every engine hold already). Only the salt travels when a world starts, so the key never crosses the
    network, even where ipyparallel's own messages are not encrypted."""
    if not secret:
        raise ValueError("ipyparallel's session has no key: the cell channel needs one to sign its messages")
    return hmac.new(secret, b"mpinb cell channel\0" + salt, hashlib.sha256).digest()


def pack(key, message, buffers=()):
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return [_sign(key, payload, buffers), payload, *buffers]


def unpack(key, frames):
    """The message in *frames*, or ``None`` when it is malformed or not signed with *key*."""
    unpacked = unpack_with_buffers(key, frames)
    return None if unpacked is None else unpacked[0]


def unpack_with_buffers(key, frames):
    """``(message, buffers)`` from *frames* (bytes or zmq frames), or ``None`` when not signed with *key*."""
    if len(frames) < 2:
        return None
    signature, payload, *buffers = frames
    signature, payload = bytes(_bytes(signature)), _bytes(payload)
    if not hmac.compare_digest(signature, _sign(key, payload, [_bytes(b) for b in buffers])):
        return None
    return pickle.loads(payload), [_bytes(b) for b in buffers]


def _sign(key, payload, buffers):
    mac = hmac.new(key, payload, hashlib.sha256)
    for buffer in buffers:
        mac.update(memoryview(buffer).nbytes.to_bytes(8, "little"))
    return mac.digest()


def _bytes(frame):
    """A zmq frame's contents without copying (``memoryview``), or the bytes as they are."""
    return frame.buffer if hasattr(frame, "buffer") else frame
