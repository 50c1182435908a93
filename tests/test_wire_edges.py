"""Edges of what notebook and ranks exchange: empty values, bytes that are not UTF-8, messages nobody signed,
and files created where another user could have planted something."""

import glob
import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq

from mpinb.notebook.world.mpis import default_mpiexec
from mpinb.notebook.cell.perrank import PerRank
from mpinb.wire import rank_files
from mpinb.wire import messages, shm
from mpinb.wire.channel import Channel
from mpinb.wire.kinds import Hello

EMPTY = """
import numpy as np
import torch
e = np.zeros(0)
e2 = np.zeros((3, 0), dtype=np.int16)
t = torch.zeros(0, 2)
tb = torch.zeros(0, dtype=torch.bfloat16)
"""
EMPTY_NAMES = {"e": ((0,), np.float64), "e2": ((3, 0), np.int16), "t": ((0, 2), torch.float32),
               "tb": ((0,), torch.bfloat16)}


def test_a_segment_takes_buffers_of_no_bytes(tmp_path):
    """Empty arrays have empty buffers: nothing to map, and their offsets all the same."""
    segment = shm.Segment(str(tmp_path))
    try:
        assert segment.write([np.zeros(0).data, memoryview(b"")]) == [0, 0]
        assert segment.write([np.arange(3.0).data]) == [0]  # the same segment grows later as usual
    finally:
        segment.close()


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["shm", "mpi", "frames"])
def test_empty_arrays_and_tensors_are_gathered_on_every_transport(how, world_of, ip, magics, mpi, monkeypatch):
    world_of(2)
    monkeypatch.setattr(magics, "gather_transport", how)
    mpi(EMPTY, line=f"--gather {' '.join(EMPTY_NAMES)} --no-inspect")
    for name, (shape, dtype) in EMPTY_NAMES.items():
        gathered = ip.user_ns[name]
        assert isinstance(gathered, PerRank) and sorted(gathered) == [0, 1]
        for value in gathered.values():
            assert (tuple(value.shape), value.dtype) == (shape, dtype), name
    mpi("a = np.zeros(0, dtype=np.complex64)", line="--gather a --no-inspect")  # one name alone, as users write it
    assert [(v.shape, v.dtype) for v in ip.user_ns["a"].values()] == [((0,), np.complex64)] * 2
    mpi("z = np.array(rank + 0.5)\nz0 = torch.tensor(rank)", line="--gather z z0 --no-inspect")  # 0-d
    assert [(v.shape, float(v)) for v in ip.user_ns["z"].values()] == [((), 0.5), ((), 1.5)]
    assert [(tuple(v.shape), int(v)) for v in ip.user_ns["z0"].values()] == [((), 0), ((), 1)]
    assert mpi("rank") == {0: 0, 1: 1}  # the world is as it was


def forged(version=b"mpinb/999", sender=b"rank/0/inbox", number=1 << 40, payload=b"not a pickle"):
    """What any local process can send to the channel's ports: a well-formed head with a signature that is not
    the world key's."""
    header = b"%s %s %d" % (version, sender, number)
    return [b"\0" * messages.SIGNATURE + len(header).to_bytes(2, "little") + header + payload]


def test_an_unsigned_message_changes_nothing_at_the_handshake():
    """A stranger's message claiming another protocol version (or a huge number) is dropped unread: the ranks'
    own hellos still get through, and no protocol mismatch is reported."""
    channel = Channel(secret=b"session key")
    context = zmq.Context.instance()
    stranger, rank = context.socket(zmq.DEALER), context.socket(zmq.DEALER)
    push = context.socket(zmq.PUSH)
    try:
        for sock, url in ((stranger, channel.cells_url), (rank, channel.cells_url), (push, channel.events_url)):
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(url)
        stranger.send_multipart(forged())
        stranger.send_multipart(forged(version=b"mpinb/3", sender=b"rank/3/inbox"))  # our version, not our key
        push.send_multipart(forged(sender=b"rank/3/outbox"))
        push.send_multipart([b"short"])
        rank.send_multipart(messages.Signer(channel.key, "rank/3/inbox").pack(Hello(3, "stacks")))
        assert channel.wait_for_ranks([3], timeout=60) == {3: "stacks"}
        assert channel.verifier.mismatch is None and channel.verifier.last == {b"rank/3/inbox": 1}
    finally:
        for sock in (stranger, rank, push):
            sock.close()
        channel.close()


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_a_forged_message_to_a_running_world_is_dropped_and_cells_still_run(world_of, mpi):
    world = world_of(2)
    channel = world.channel
    last = dict(channel.verifier.last)
    context = zmq.Context.instance()
    dealer, push = context.socket(zmq.DEALER), context.socket(zmq.PUSH)
    try:
        dealer.setsockopt(zmq.LINGER, 0)
        push.setsockopt(zmq.LINGER, 0)
        dealer.connect(channel.cells_url)
        push.connect(channel.events_url)
        dealer.send_multipart(forged())
        push.send_multipart(forged(sender=b"rank/1/outbox"))
        assert mpi("rank * 10") == {0: 0, 1: 10}
        assert channel.verifier.mismatch is None
        assert all(channel.verifier.last[s] > n for s, n in last.items() if s.endswith(b"/replies"))
        assert channel.verifier.last.get(b"rank/0/inbox", 0) < 1 << 40
        assert channel.verifier.last.get(b"rank/1/outbox", 0) < 1 << 40
    finally:
        dealer.close()
        push.close()


NOT_UTF8 = r"""
import os, sys
os.write(1, b'fd1 \xff end\n')
print('name', os.fsdecode(b'\xff'))
sys.stdout.buffer.write(b'buffer \xff\xe2\x82\xac\n')
sys.stderr.write('stderr \udcfe\n')
"""


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_bytes_that_are_not_utf8_show_as_replacement_characters(world_of, ip, mpi, capsys, caplog):
    """In a cell's own output, labelled by rank, written by Python or to descriptor 1 below it; a stop after it
    says no word of decoding."""
    world_of(2)
    capsys.readouterr()
    mpi(NOT_UTF8)
    out, err = capsys.readouterr()
    for rank in (0, 1):
        assert f"[rank {rank}] name \ufffd\n" in out and f"[rank {rank}] buffer \ufffd\u20ac\n" in out
        assert f"[rank {rank}] stderr \ufffd\n" in err
        assert f"[rank {rank}] fd1 \ufffd end\n" in out, out
    caplog.clear()
    ip.run_line_magic("mpi", "stop")
    out, err = capsys.readouterr()
    said = out + err + "\n".join(record.getMessage() for record in caplog.records)
    assert "decode" not in said and "Traceback" not in said and not any(r.exc_info for r in caplog.records)
    assert "stopped" in out


PLAIN = """
import mpinb
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
mpinb.report(step=0, loss=1.0)
"""


def planted(directory, name):
    """A link at *directory*/*name*, as another user would plant it where a rank will write, to a file of the
    victim's that must stay as it is."""
    victim = directory / f"victim-{name}"
    victim.write_text("precious\n")
    (directory / name).symlink_to(victim)
    return victim


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_files_named_by_the_user_under_plain_mpiexec_are_never_written_through_a_link(tmp_path):
    """MPINB_TRACE's files replace a link planted at their name (a fresh owner-only file renamed over it, none
    left behind); MPINB_METRICS_FILE, appended to, refuses one and says so in a line."""
    script = tmp_path / "train.py"
    script.write_text(PLAIN)
    victims = [planted(tmp_path, "trace-0.json"), planted(tmp_path, "metrics-1.jsonl")]
    env = dict(os.environ, MPINB_TRACE=str(tmp_path / "trace-{rank}.json"), MPINB_REPORT_EVERY="0",
               MPINB_METRICS_FILE=str(tmp_path / "metrics-{rank}.jsonl"),
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([default_mpiexec(), "-n", "2", sys.executable, str(script)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [victim.read_text() for victim in victims] == ["precious\n"] * 2
    for name in ("trace-0.json", "trace-1.json", "metrics-0.jsonl"):
        status = os.lstat(tmp_path / name)
        assert stat.S_ISREG(status.st_mode) and stat.S_IMODE(status.st_mode) == 0o600, name
    assert json.loads((tmp_path / "trace-0.json").read_text())["traceEvents"]
    assert (tmp_path / "metrics-1.jsonl").is_symlink()
    assert f"[mpinb] rank 1: cannot write metrics to {tmp_path / 'metrics-1.jsonl'}" in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob(".mpinb-*"))


def test_a_rank_keeps_its_files_only_in_a_private_directory(tmp_path, monkeypatch):
    """$MPINB_STATUS_DIR is used only when it is this user's directory and no one else's to enter; otherwise
    the rank makes a private one of its own (never a fixed name in the shared temporary directory)."""
    import shutil

    from mpinb.rank import stacks
    from mpinb.wire import files

    private = tmp_path / "world"
    private.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(private)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert files.private_directory(str(private))
    for status_dir in (str(private), str(shared), str(tmp_path / "link"), str(tmp_path / "missing"), None):
        if status_dir is None:
            monkeypatch.delenv("MPINB_STATUS_DIR", raising=False)
        else:
            monkeypatch.setenv("MPINB_STATUS_DIR", status_dir)
        directory = stacks.rank_directory()
        try:
            assert files.private_directory(directory)
            assert (directory == str(private)) == (status_dir == str(private)), status_dir
        finally:
            if directory != str(private):
                shutil.rmtree(directory)
    victim = planted(private, "mpinb-stderr-1")
    with pytest.raises(OSError):  # a link where a rank's file goes is refused, not followed
        files.open_own(str(private / "mpinb-stderr-1"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    assert victim.read_text() == "precious\n"


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_a_worlds_rank_files_are_private_and_removed_with_it(world_of, ip, mpi, magics):
    """Stacks, recent stderr, C's stderr and the collective mirror of every rank: in the world's 0700
    directory, each 0600, none in the shared temporary directory, and all gone after %mpi stop."""
    world = world_of(2)
    mpi("import sys\nprint('to stderr', file=sys.stderr)\ncomm.Barrier()")
    status_dir = world.status_dir
    assert files_of_world(world) and stat.S_IMODE(os.stat(status_dir).st_mode) == 0o700
    pids = [who["pid"] for who in world.identities.values()]
    kept = []
    for path in world.stack_files.values():
        assert os.path.dirname(path) == status_dir
        for each in rank_files.every_path(path):
            status = os.lstat(each)
            assert stat.S_ISREG(status.st_mode) and stat.S_IMODE(status.st_mode) == 0o600, each
            kept.append(each)
    assert not [p for pid in pids for p in glob.glob(os.path.join(tempfile.gettempdir(), f"mpinb-*-{pid}"))]
    ip.run_line_magic("mpi", "stop")
    assert not [path for path in kept if os.path.lexists(path)] and not os.path.lexists(status_dir)


def files_of_world(world):
    return sorted(os.listdir(world.status_dir))
