from mpinb import wire


def test_round_trip_and_tampering_is_dropped():
    key = b"k" * 32
    frames = wire.pack(key, ("cell", 1, "print(1)", 3))
    assert wire.unpack(key, frames) == ("cell", 1, "print(1)", 3)
    signature, payload = frames
    assert wire.unpack(key, [signature, payload.replace(b"print", b"input")]) is None
    assert wire.unpack(b"x" * 32, frames) is None
    assert wire.unpack(key, [payload]) is None
