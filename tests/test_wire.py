import pytest

from mpinb import wire


def test_round_trip_and_tampering_is_dropped():
    key = b"k" * 32
    frames = wire.pack(key, ("cell", 1, "print(1)", 3))
    assert wire.unpack(key, frames) == ("cell", 1, "print(1)", 3)
    signature, payload = frames
    assert wire.unpack(key, [signature, payload.replace(b"print", b"input")]) is None
    assert wire.unpack(b"x" * 32, frames) is None
    assert wire.unpack(key, [payload]) is None


def test_the_channel_key_is_derived_from_the_session_key_and_a_salt():
    secret, salt = b"ipyparallel-session-key", b"s" * 16
    key = wire.derive_key(secret, salt)
    assert key == wire.derive_key(secret, salt) and len(key) == 32
    assert key != wire.derive_key(secret, b"t" * 16) and key != wire.derive_key(b"other", salt)
    assert secret not in key and salt not in key
    with pytest.raises(ValueError, match="no key"):
        wire.derive_key(b"", salt)


@pytest.mark.mpi
def test_each_rank_derives_the_channel_key_and_only_the_salt_is_sent(world_of, mpi):
    """The set-up sends the ranks a salt, not the key: each derives the key from ipyparallel's session key."""
    world = world_of(2)
    channel = world.channel
    assert channel.key == wire.derive_key(world.client.session.key, channel.salt)
    keys = mpi("__import__('mpinb.rank.agent', fromlist=['_agent'])._agent.key")
    assert keys == {0: channel.key, 1: channel.key}
    assert mpi("rank + 1") == {0: 1, 1: 2}  # cells signed with it run
