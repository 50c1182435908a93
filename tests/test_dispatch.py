"""%%mpi on real mpiexec worlds, through load_ext and run_cell_magic on a real InteractiveShell."""

import _thread
import re
import threading

import pytest
from IPython.core.error import UsageError

from mpinb.errors import RankError
from mpinb.notebook.cell.perrank import PerRank
from mpinb.rank.runner import RemoteValue

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]


@pytest.mark.parametrize("size", [1, 2, 4])
def test_hello_from_every_rank_and_state_persists(size, world_of, mpi, capsys):
    world_of(size)
    mpi('print(f"hello from {rank} of {size}")\nx = rank * 10')
    out = capsys.readouterr().out
    for r in range(size):
        assert f"[rank {r}] hello from {r} of {size}\n" in out
    assert mpi("print(x + 1)\nx") == PerRank({r: r * 10 for r in range(size)})
    out = capsys.readouterr().out
    for r in range(size):
        assert f"[rank {r}] {r * 10 + 1}\n" in out


def test_comm_is_the_mpi_world(world_of, mpi):
    world_of(4)
    assert mpi("comm.allreduce(rank)") == PerRank({r: 6 for r in range(4)})


def test_ranks_subset(world_of, mpi, capsys):
    world_of(4)
    assert mpi("rank", line="--ranks 1,3") == {1: 1, 3: 3}
    assert mpi("rank", line="--ranks 0-1") == {0: 0, 1: 1}
    with pytest.raises(UsageError, match="not in this world of 4"):
        mpi("rank", line="--ranks 7")


def test_stderr_is_labelled_on_the_notebook_stderr(world_of, mpi, capsys):
    world_of(2)
    mpi('import sys\nprint("careful", file=sys.stderr)\nprint("fine")')
    captured = capsys.readouterr()
    assert "[rank 1] careful" in captured.err and "careful" not in captured.out
    assert "[rank 1] fine" in captured.out


def test_output_streams_while_the_cell_runs(world_of, ip, magics, capsys, tmp_path):
    """The rank goes on only once the notebook has shown its first line: output cannot be held until the end."""
    world_of(2)
    seen = []
    shown = tmp_path / "shown"
    from mpinb.notebook.cell import dispatch
    from mpinb.notebook.cell.output import RankPrinter

    class Watcher(RankPrinter):
        def feed(self, rank, name, text):
            seen.append(text.strip())
            if "early" in text:
                shown.touch()

    code = (f"import os, time\nprint('early', flush=True)\nfor _ in range(600):\n"
            f"    if os.path.exists({str(shown)!r}):\n        break\n    time.sleep(0.05)\n"
            f"else:\n    print('never shown')\nprint('late')")
    dispatch.dispatch(magics.world, code, ranks=[0], printer=Watcher())
    assert seen == ["early", "late"]


def test_what_a_ranks_thread_prints_between_cells_comes_with_the_next_cell(world_of, mpi, capsys, tmp_path):
    """It was lost: between cells a rank's sys.stdout is the engine's own stream, which nobody reads."""
    world_of(2)
    go, done = tmp_path / "go", tmp_path / "done"
    mpi(f"import os, sys, threading, time\ndef later():\n    while not os.path.exists({str(go)!r}):\n"
        f"        time.sleep(0.02)\n    print('between cells', rank, flush=True)\n"
        f"    sys.stderr.write(f'warned {{rank}}\\n')\n    open({str(done)!r} + str(rank), 'w').close()\n"
        f"threading.Thread(target=later, daemon=True).start()")
    capsys.readouterr()
    go.touch()  # the cell has ended: the threads print now, while no cell runs
    for rank in range(2):
        for _ in range(600):
            if (tmp_path / f"done{rank}").exists():
                break
            threading.Event().wait(0.05)
    assert mpi("'next'") == {0: "next", 1: "next"}
    captured = capsys.readouterr()
    assert "[rank 0] between cells 0" in captured.out and "[rank 1] between cells 1" in captured.out, captured
    assert "[rank 0] warned 0" in captured.err and "[rank 1] warned 1" in captured.err, captured


def test_identical_errors_merge_and_the_world_stays_usable(world_of, mpi, capsys):
    world_of(4)
    mpi("y = rank")
    with pytest.raises(RankError) as info:
        mpi("print('before')\n1 / 0")
    error = info.value
    assert "ranks 0-3: ZeroDivisionError: division by zero" in str(error)
    assert sorted(error.failures) == [0, 1, 2, 3]
    rendered = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error._render_traceback_()))
    assert rendered.count("ZeroDivisionError") >= 2 and "1 / 0" in rendered
    assert "[rank 2] before" in capsys.readouterr().out
    assert mpi("y") == {r: r for r in range(4)}


def test_every_failing_rank_is_named(world_of, mpi):
    world_of(4)
    with pytest.raises(RankError) as info:
        mpi('if rank % 2:\n    raise ValueError(f"bad {rank}")\nelse:\n    {}["k"]')
    text = str(info.value)
    assert "ranks 0, 2: KeyError: 'k'" in text
    assert "rank 1: ValueError: bad 1" in text and "rank 3: ValueError: bad 3" in text


def test_one_failing_rank_keeps_the_others_output(world_of, magics, mpi, capsys):
    world_of(2)
    with pytest.raises(RankError, match="rank 1: RuntimeError: only me"):
        mpi('print("done", rank)\nif rank == 1:\n    raise RuntimeError("only me")\nrank')
    assert "[rank 0] done 0" in capsys.readouterr().out
    assert magics.last.values == {0: 0}


def test_syntax_errors_come_back_merged(world_of, mpi):
    world_of(2)
    with pytest.raises(RankError, match="ranks 0-1: SyntaxError"):
        mpi("def broken(:\n    pass")


def test_ipython_syntax_works_on_ranks(world_of, mpi):
    world_of(2)
    assert mpi("%time z = 2 ** 10\nz") == {0: 1024, 1: 1024}


def test_a_cell_transformed_in_the_notebook_runs_with_each_ranks_own_shell_and_source(world_of, mpi, capsys):
    """IPython syntax is turned into Python once, in the notebook: what it calls still runs on each rank (its
    shell, its namespace, its processes), and a traceback points at the failing line as IPython's own would."""
    world_of(2)
    assert mpi("here = !echo $rank\nhere") == {0: ["0"], 1: ["1"]}  # each rank's own `rank`, its own shell
    with pytest.raises(RankError) as raised:
        mpi("%time y = rank\n1 / (rank - y)")
    text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(raised.value._render_traceback_()))
    assert "ZeroDivisionError" in text and "----> 3 1 / (rank - y)" in text  # the line, as IPython shows it


def test_unpicklable_values_come_back_as_their_repr(world_of, mpi):
    world_of(2)
    values = mpi("import threading\nthreading.Lock()")
    assert isinstance(values[0], RemoteValue) and "lock" in repr(values[0])


def test_no_stream_prints_rank_by_rank_at_the_end(world_of, ip, mpi, capsys):
    world_of(2)
    mpi("print('a', rank)\nprint('b', rank)", line="--no-stream")
    out = capsys.readouterr().out
    assert "--- rank 0 ---\na 0\nb 0\n--- rank 1 ---\na 1\nb 1" in out
    ip.run_line_magic("mpi", "output")
    assert "--- rank 1 ---\na 1\nb 1" in capsys.readouterr().out


def test_interrupt_reaches_every_rank_and_the_next_cell_works(world_of, mpi):
    world_of(2)
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        mpi("import time\nfor _ in range(600):\n    time.sleep(0.05)")
    assert mpi("rank") == {0: 0, 1: 1}


def test_wrong_arguments_are_usage_errors(world_of, mpi, ip):
    world = world_of(2)
    with pytest.raises(UsageError, match="restart -n 3"):
        mpi("pass", line="-n 3")
    with pytest.raises(UsageError):
        mpi("pass", line="--bogus")
    with pytest.raises(UsageError, match="already running"):
        ip.run_line_magic("mpi", "start -n 2")
    with pytest.raises(UsageError):
        ip.run_line_magic("mpi", "launch")
    assert world.running
