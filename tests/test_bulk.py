"""Large messages sealed in chunks with AES-GCM (``mpinb/wire/bulk.py``): what opens, and what is refused."""

import os
from collections import Counter

import numpy as np
import pytest
from mpinb.wire import bulk

KEY = os.urandom(32)
HEAD = b"signed head of the message"


def sealed(frames, sender="rank/1", key=KEY, sealer=None):
    sealer = sealer or bulk.Sealer(key, sender)
    return [[bytes(part) for part in chunk] for chunk in sealer.seal(frames)]


def opened(chunks, sender=b"rank/1", key=KEY):
    opener, whole = bulk.Opener(key, Counter()), []
    for chunk in chunks:
        if opener.feed(chunk) is not None:
            whole.append(opener.take(sender))
    return whole, opener.rejected


def test_a_message_of_several_chunks_opens_whole_into_arrays_of_its_own():
    data = np.random.default_rng(0).random(3 * bulk.CHUNK // 8 + 5)  # four chunks, the last one short
    chunks = sealed([HEAD, data, b""])
    assert len(chunks) == 6  # the head, four chunks of the data, the empty part
    assert data.tobytes()[:64] not in b"".join(b"".join(chunk) for chunk in chunks)
    (parts,), rejected = opened(chunks)
    assert bytes(parts[0]) == HEAD and bytes(parts[1]) == data.tobytes() and bytes(parts[2]) == b""
    assert all(isinstance(part, np.ndarray) and part.flags.writeable for part in parts)
    assert not rejected


@pytest.mark.parametrize("how", ["reordered", "cut", "tampered", "other key", "other sender", "spliced"])
def test_a_chunk_out_of_place_or_changed_does_not_open(how):
    data = np.arange(bulk.CHUNK // 2, dtype=np.int64)  # two chunks of data
    chunks = sealed([HEAD, data])
    if how == "reordered":
        chunks[1], chunks[2] = chunks[2], chunks[1]
    elif how == "cut":
        chunks = chunks[:-1]
    elif how == "tampered":
        sealed_bytes = bytearray(chunks[1][1])
        sealed_bytes[100] ^= 1
        chunks[1][1] = bytes(sealed_bytes)
    elif how == "other key":
        chunks = sealed([HEAD, data], key=os.urandom(32))
    elif how == "other sender":  # rank 2's chunks presented as rank 1's
        chunks = [[chunk[0].replace(b"rank/2", b"rank/1"), chunk[1]] for chunk in sealed([HEAD, data], "rank/2")]
    elif how == "spliced":  # a chunk of another message of the same sender, same place
        sealer = bulk.Sealer(KEY, "rank/1")
        first, second = sealed([HEAD, data], sealer=sealer), sealed([HEAD, data + 1], sealer=sealer)
        chunks = first[:2] + second[2:]
    whole, rejected = opened(chunks)
    assert whole == []
    assert how == "cut" or rejected["unsigned"] >= 1, rejected


def test_a_whole_message_replayed_is_refused_by_its_number():
    sealer = bulk.Sealer(KEY, "rank/1")
    first, second = sealed([HEAD, b"one" * 1000], sealer=sealer), sealed([HEAD, b"two" * 1000], sealer=sealer)
    whole, rejected = opened(first + second + first)
    assert [bytes(parts[1]) for parts in whole] == [b"one" * 1000, b"two" * 1000]
    assert rejected["replayed"] == 1


def test_a_forged_first_chunk_naming_huge_parts_is_refused_before_anything_is_made_for_it():
    """The parts' lengths come in the chunk's plain prefix: believed only once the chunk opens."""
    chunks = sealed([HEAD, b"x" * 100])
    sender, _, rest = chunks[0][0].partition(b"\0")
    forged = sender + b"\0" + rest[:16] + (1 << 62).to_bytes(8, "little") * 2  # two parts of 4 EiB each
    opener = bulk.Opener(KEY, Counter())
    assert opener.feed([forged, chunks[0][1]]) is None
    assert opener.rejected == Counter(unsigned=1) and not opener.building and not opener.aeads
    # the sender's real message still opens whole afterwards
    assert [opener.feed(chunk) for chunk in chunks] == [None, b"rank/1"]
    assert bytes(opener.take(b"rank/1")[1]) == b"x" * 100


def test_a_forged_first_chunk_does_not_drop_the_message_being_opened():
    data = np.arange(bulk.CHUNK // 2, dtype=np.int64)
    chunks = sealed([HEAD, data])
    forged = [chunks[0][0], bytes(len(chunks[0][1]))]  # the real prefix, the sealed bytes zeroed
    opener = bulk.Opener(KEY, Counter())
    assert opener.feed(chunks[0]) is None and opener.feed(chunks[1]) is None
    assert opener.feed(forged) is None and opener.rejected["unsigned"] == 1
    assert [opener.feed(chunk) for chunk in chunks[2:]] == [None] * (len(chunks) - 3) + [b"rank/1"]
    assert bytes(opener.take(b"rank/1")[1]) == data.tobytes()
