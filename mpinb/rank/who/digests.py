"""The digest every kind of value is hashed into for ``%mpi who``, SHA-1 started with a header, and what one call
may still hash (its :class:`Budget`)."""

import hashlib

from .text import MB, size_text

LIMIT = 64 * MB  # bytes of one array, tensor or model hashed at most
TOTAL = 512 * MB  # bytes hashed in one call at most
PICKLE_LIMIT = 4 * MB  # bytes of a pickled container hashed at most
DEVICE_LIMIT = 16 * MB  # a GPU tensor (or model) larger than this is not copied to the host to be hashed


class Budget:
    """What one call of :func:`who` may still hash and copy from GPUs; *partial*: the current hash was cut off."""

    def __init__(self, limit=LIMIT, total=TOTAL, pickle_limit=PICKLE_LIMIT, device_limit=DEVICE_LIMIT):
        self.limit, self.left, self.pickle_limit, self.device_left = limit, total, pickle_limit, device_limit
        self.start()

    def start(self):
        """A new name: it may hash its own limit, or what is left of the call's total."""
        self.allowed = self.room = min(self.limit, self.left)
        self.partial = False

    def take(self, nbytes):
        """How many of *nbytes* may be hashed now (the rest is cut off, and that is noted)."""
        taken = max(0, min(nbytes, self.room))
        self.room -= taken
        self.left -= taken
        if taken < nbytes:
            self.partial = True
        return taken

    def cut_note(self):
        if not self.partial:
            return None
        return f"first {size_text(self.allowed)}" if self.allowed else "not hashed: who's total spent"


def hasher(*header):
    """A hash that starts with *header* (type, shape, dtype): equal bytes of other shapes hash apart."""
    return hashlib.sha1(repr(header).encode(), usedforsecurity=False)


def short(digest):
    return digest.hexdigest()[:8]
