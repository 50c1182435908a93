"""The cell channel's message format, shared by notebook and ranks: pickled tuples signed with HMAC-SHA256.

Every message is two frames, ``[signature, payload]``. A message whose signature does not match the world's key
is dropped unread, so no other local user can run code on the ranks or feed pickles to the notebook.
"""

import hashlib
import hmac
import pickle


def pack(key, message):
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return [hmac.new(key, payload, hashlib.sha256).digest(), payload]


def unpack(key, frames):
    """The message in *frames*, or ``None`` when it is malformed or not signed with *key*."""
    if len(frames) != 2:
        return None
    signature, payload = frames
    if not hmac.compare_digest(signature, hmac.new(key, payload, hashlib.sha256).digest()):
        return None
    return pickle.loads(payload)
