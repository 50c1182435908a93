"""What a rank writes below Python reaches the notebook, labelled by rank as its prints are: its file descriptors
1 and 2 (``os.write``, ``os.system``, subprocesses, C's ``printf``), in order with its Python output on the same
stream, all of it before the cell's reply; and what C wrote just before the rank died is in the death's message."""

import re

import pytest

from mpinb.errors import RankError

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]

BELOW_PYTHON = """\
import ctypes, os, subprocess, sys
print("python before", flush=True)
os.write(1, f"os.write to 1 on {rank}\\n".encode())
os.system(f"echo os.system on {rank}")
subprocess.run([sys.executable, "-c", f"print('a subprocess of {rank}')"], check=True)
ctypes.CDLL(None).printf(f"printf on {rank}\\n".encode())
os.write(2, f"os.write to 2 on {rank}\\n".encode())
print("python after", flush=True)
"""


def test_descriptors_1_and_2_reach_the_notebook_labelled_and_in_order(world_of, mpi, capsys):
    world_of(2)
    capsys.readouterr()
    mpi(BELOW_PYTHON)
    captured = capsys.readouterr()
    for rank in (0, 1):
        out = [line for line in captured.out.splitlines() if line.startswith(f"[rank {rank}] ")]
        said = [line.split("] ", 1)[1] for line in out]
        expected = ["python before", f"os.write to 1 on {rank}", f"os.system on {rank}", f"a subprocess of {rank}"]
        assert [line for line in said if line in expected] == expected, captured.out  # in the order written
        assert said.index("python after") > said.index(f"a subprocess of {rank}"), captured.out
        assert f"printf on {rank}" in said, captured.out  # C's buffered stdout, flushed as the cell ends
        assert f"[rank {rank}] os.write to 2 on {rank}" in captured.err, captured.err


def test_unicode_split_across_writes_is_decoded_whole(world_of, mpi, capsys):
    world_of(2)
    capsys.readouterr()
    mpi("import os, time\ndata = 'naïve ünïcode ✓\\n'.encode()\nfor i in range(len(data)):\n"
        "    os.write(1, data[i:i + 1])\n    time.sleep(0.002)\n")
    out = capsys.readouterr().out
    assert "[rank 0] naïve ünïcode ✓" in out and "[rank 1] naïve ünïcode ✓" in out, out
    assert "\ufffd" not in out


def test_what_c_wrote_just_before_a_crash_is_in_the_message(ip, world_of, mpi):
    world_of(2)
    try:
        with pytest.raises(RankError) as info:
            mpi("import ctypes, os\nif rank == 1:\n    os.write(2, b'libfoo: bad descriptor table, giving up\\n')\n"
                "    ctypes.string_at(0)\ncomm.Barrier()\n")
    finally:
        ip.run_line_magic("mpi", "restart --fresh")  # the tests after this one share the shell's world
    text = str(info.value)
    assert re.search(r"rank 1 died: signal 11 \(SIGSEGV\).*its last stderr lines:\n(.*\n)*libfoo: bad descriptor "
                     r"table, giving up", text), text


LATE_WRITER = """\
import os, threading, time
def _late():
    while not os.path.exists({started!r}):  # the next cell, which runs on rank 1 only, has begun
        time.sleep(0.01)
    os.write(1, b"written between cells by rank 0\\n")
    open({written!r}, "w").close()
if rank == 0:
    threading.Thread(target=_late, daemon=True).start()
"""

ONLY_RANK_1 = """\
import os, time
open({started!r}, "w").close()
while not os.path.exists({written!r}):
    time.sleep(0.01)
time.sleep(0.5)  # rank 0's forwarder sends what it wrote within 50 ms
print("rank 1 done")
"""


def test_output_of_a_rank_a_cell_does_not_run_on_is_shown_and_the_cell_goes_on(world_of, mpi, capsys, tmp_path):
    """A rank outside ``--ranks`` that writes while the cell runs (a thread of its own, C output between cells):
    its line is shown, labelled, and the cell's result holds its own ranks only."""
    world_of(2)
    files = dict(started=str(tmp_path / "started"), written=str(tmp_path / "written"))
    mpi(LATE_WRITER.format(**files))
    capsys.readouterr()
    mpi(ONLY_RANK_1.format(**files), "--ranks 1")
    captured = capsys.readouterr()
    assert "[rank 1] rank 1 done" in captured.out, captured.out
    assert "[rank 0] written between cells by rank 0" in captured.out, captured.out
    mpi("print('after')")
    assert "[rank 0] after" in capsys.readouterr().out


ENGINE_MISSES_A_BEAT = """\
import logging, time
from ipyparallel.engine.app import IPEngine
engine = IPEngine.instance()
caught = []
catcher = logging.Handler()
catcher.emit = lambda record: caught.append(record.getMessage())
engine.log.addHandler(catcher)
missed = engine._hb_missed_beats
engine._hb_last_pinged, engine._hb_last_monitored = 0.0, time.time()  # the controller was slow to ping
engine._hb_monitor()
engine.log.removeHandler(catcher)
engine._hb_missed_beats = missed
print("engine logged:", caught)
"""


def test_the_engines_heartbeat_warnings_are_not_the_users_output(world_of, mpi, capsys):
    """On a busy machine ipyparallel's engine warns "No heartbeat in the last 600 ms" when its controller pings
    late, and the warning came out in a user's cell as the rank's output: the engine's log keeps its errors only
    (mpinb watches and names dead ranks itself). Here the engine's own heartbeat check runs as if a ping was late."""
    world_of(2)
    capsys.readouterr()
    mpi(ENGINE_MISSES_A_BEAT)
    out = capsys.readouterr().out
    assert "[rank 0] engine logged: []" in out and "[rank 1] engine logged: []" in out, out
    assert "No heartbeat" not in out
