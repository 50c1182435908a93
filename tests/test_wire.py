import pytest
import zmq
import zmq.utils.monitor

from mpinb.wire import messages
from mpinb.wire.channel import Channel
from mpinb.wire.kinds import Hello, Out

KEY = b"k" * 32


def test_round_trip_and_tampering_is_dropped():
    signer, verifier = messages.Signer(KEY, "notebook"), messages.Verifier(KEY)
    frames = signer.pack(("cell", 1, "print(1)", 3))
    assert verifier.unpack(frames) == ("cell", 1, "print(1)", 3)
    (head,) = signer.pack(("cell", 2, "print(1)", 3))
    assert verifier.unpack([head.replace(b"print", b"input")]) is None
    assert verifier.unpack([head.replace(b"notebook", b"notebooc")]) is None
    assert messages.Verifier(b"x" * 32).unpack(signer.pack(("cell",))) is None
    assert verifier.unpack([head[40:]]) is None and verifier.unpack([]) is None
    head, buffer = signer.pack(("reply", 1), [b"12345678"])
    assert verifier.unpack_with_buffers([head, b"1234567"]) is None  # a buffer's length is signed
    assert verifier.unpack_with_buffers([head, b"12345678"]) == (("reply", 1), [b"12345678"])
    assert verifier.rejected == {"unsigned": 4, "malformed": 1}  # a cut head's signature is checked first


def test_a_replayed_or_reordered_message_is_dropped_and_each_sender_is_numbered_apart():
    notebook, rank = messages.Signer(KEY, "notebook"), messages.Signer(KEY, "rank/1/outbox")
    verifier = messages.Verifier(KEY)
    first, second, third = (notebook.pack(("cell", n)) for n in (1, 2, 3))
    assert verifier.unpack(first) == ("cell", 1)
    assert verifier.unpack(first) is None  # the same message again
    assert verifier.unpack(third) == ("cell", 3)
    assert verifier.unpack(second) is None  # older than the last taken: reordered
    assert verifier.unpack(rank.pack(("out", 1))) == ("out", 1)  # another sender counts on its own
    assert verifier.rejected == {"replayed": 2}


def test_a_peer_of_another_protocol_version_is_named_at_the_handshake(monkeypatch):
    channel = Channel(secret=b"session key")
    try:
        peer = zmq.Context.instance().socket(zmq.DEALER)
        peer.connect(channel.cells_url)
        monkeypatch.setattr(messages, "PROTOCOL", messages.PROTOCOL + 1)  # what a newer mpinb on a rank's host sends
        peer.send_multipart(messages.Signer(channel.key, "rank/3/inbox").pack(Hello(3, "stacks")))
        monkeypatch.undo()
        newer, ours = messages.PROTOCOL + 1, messages.PROTOCOL
        said = f"rank 3 speaks the cell channel's protocol mpinb/{newer}, this notebook mpinb/{ours}: install the same"
        with pytest.raises(messages.ProtocolMismatch, match=said):
            channel.wait_for_ranks([3], timeout=30)
        peer.close()
    finally:
        channel.close()


def test_the_channel_key_is_derived_from_the_session_key_and_a_salt():
    secret, salt = b"ipyparallel-session-key", b"s" * 16
    key = messages.derive_key(secret, salt)
    assert key == messages.derive_key(secret, salt) and len(key) == 32
    assert key != messages.derive_key(secret, b"t" * 16) and key != messages.derive_key(b"other", salt)
    assert secret not in key and salt not in key
    with pytest.raises(ValueError, match="no key"):
        messages.derive_key(b"", salt)


def test_off_loopback_only_a_holder_of_the_key_can_talk_to_the_channel():
    """Listening on every interface, the channel is a CurveZMQ server whose key pair is derived from the channel
    key: a client that derives it gets through, one that does not (wrong key, or no encryption) never does."""
    channel = Channel("0.0.0.0", secret=b"session key")
    assert channel.encrypt and not Channel(secret=b"session key").encrypt
    context = zmq.Context.instance()
    monitor = channel.events.get_monitor_socket()
    try:
        url = channel.events_url.replace(channel.events_url.split("//")[1].split(":")[0], "127.0.0.1")
        for name, key in (("stranger", b"w" * 32), ("plain", None), ("rank", channel.key)):
            push = context.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            if key is not None:
                messages.encrypt_client(push, key)
            push.connect(url)
            frames = messages.Signer(channel.key, f"rank/0/{name}").pack(Out(0, 1, "stdout", name))
            try:
                # a stranger whose handshake failed already has no pipe to queue on: its send would wait forever
                push.send_multipart(frames, flags=0 if name == "rank" else zmq.NOBLOCK)
            except zmq.Again:
                pass
        failed = 0
        while failed < 2:  # the server refused both strangers' handshakes
            event = zmq.utils.monitor.recv_monitor_message(monitor)
            if event["event"] & (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                                 | zmq.EVENT_HANDSHAKE_FAILED_AUTH):
                failed += 1
        received = channel.receive(30)
        assert [m.text for m in received] == ["rank"]
    finally:
        channel.events.disable_monitor()
        channel.close()


@pytest.mark.mpi
def test_each_rank_derives_the_channel_key_and_only_the_salt_is_sent(world_of, mpi):
    """The set-up sends the ranks a salt, not the key: each derives the key from ipyparallel's session key."""
    world = world_of(2)
    channel = world.channel
    assert channel.key == messages.derive_key(world.client.session.key, channel.salt)
    keys = mpi("__import__('mpinb.rank.agent', fromlist=['_agent'])._agent.key")
    assert keys == {0: channel.key, 1: channel.key}
    assert mpi("rank + 1") == {0: 1, 1: 2}  # cells signed with it run
