"""``%mpi run FILE ARGS`` on real worlds: a script as ``__main__`` on every rank with its arguments, as under
``torchrun`` or ``mpiexec python FILE ARGS``, with everything a ``%%mpi`` cell gets, its globals kept."""

import _thread
import os
import re
import textwrap
import threading

import pytest
from IPython.core.error import UsageError
from waiting import wait_for

import mpinb
from mpinb.errors import RankError

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]

ANSI = re.compile(r"\x1b\[[0-9;]*m")

TRAIN = '''\
"""Train for a few epochs, as under torchrun or mpiexec."""
import argparse
import sys

from mpi4py import MPI

import mpinb

parser = argparse.ArgumentParser(description="a tiny training script")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()

world = MPI.COMM_WORLD
model = {"weight": 1.0}
for epoch in range(args.epochs):
    model["weight"] -= args.lr
    mpinb.report(step=epoch, loss=model["weight"])
total = world.allreduce(world.Get_rank() + 1)


def loss():
    return round(model["weight"] * total, 6)


if __name__ == "__main__":
    print(f"epochs={args.epochs} lr={args.lr} total={total} argv={sys.argv[1:]} file={__file__}")
    finished = True
'''


def script(directory, text, name="train.py"):
    """*text* written to *directory*/*name*; its absolute path."""
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return str(path)


def rendered(error):
    """What the notebook shows of *error*, colours left out."""
    return ANSI.sub("", "\n".join(error._render_traceback_()))


def test_a_script_runs_on_every_rank_as_main_with_its_arguments_and_its_globals_stay(ip, fresh, mpi, capsys,
                                                                                     tmp_path):
    fresh(2)
    path = script(tmp_path, TRAIN)
    before = mpi("import sys\n(__name__, '__file__' in globals(), list(sys.argv), sys.path[0])")
    capsys.readouterr()
    assert ip.run_line_magic("mpi", f"run {path} --epochs 2 --lr 0.1") is None
    out = capsys.readouterr().out
    for rank in (0, 1):
        assert f"[rank {rank}] epochs=2 lr=0.1 total=3 argv=['--epochs', '2', '--lr', '0.1'] file={path}" in out, out
    # the script's globals, for inspection in the next cells; the namespace's own names and sys.argv as they were
    assert mpi("(args.epochs, model['weight'], finished, loss())") == {r: (2, 0.8, True, 2.4) for r in (0, 1)}
    assert mpi("(__name__, '__file__' in globals(), list(sys.argv), sys.path[0])") == before
    frame = mpinb.metrics()  # mpinb.report() in the script reached the notebook, as from a cell
    assert sorted(frame[frame.name == "loss"].step.tolist()) == [0, 0, 1, 1]


def test_a_relative_path_is_read_from_the_notebooks_directory(ip, world_of, mpi, capsys, tmp_path, monkeypatch):
    world_of(2)
    path = script(tmp_path / "project" / "scripts", "import sys\nprint('argv0', sys.argv[0], 'file', __file__)\n")
    monkeypatch.chdir(tmp_path / "project")  # the ranks' own working directory is not this one
    capsys.readouterr()
    ip.run_line_magic("mpi", "run scripts/train.py")
    out = capsys.readouterr().out
    assert f"[rank 0] argv0 {path} file {path}" in out and f"[rank 1] argv0 {path} file {path}" in out, out


def test_a_missing_file_is_a_usage_error_and_nothing_is_sent(ip, magics, world_of, tmp_path, monkeypatch):
    world_of(2)
    monkeypatch.chdir(tmp_path)
    last = magics.last
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("mpi", "run train.py --epochs 2")
    assert str(info.value) == f"%mpi run: no file train.py (relative to the notebook's directory {tmp_path})"
    with pytest.raises(UsageError, match=re.escape(f"%mpi run: no file {tmp_path}/gone.py")):
        ip.run_line_magic("mpi", f"run {tmp_path}/gone.py")
    with pytest.raises(UsageError, match="%mpi run: .* is a directory"):
        ip.run_line_magic("mpi", f"run {tmp_path}")
    with pytest.raises(UsageError, match=re.escape("%mpi run takes a script: %mpi run [-n N] [--timeout S] [--trace] "
                                                   "FILE [ARGS ...]")):
        ip.run_line_magic("mpi", "run")
    assert magics.last is last  # no cell went to the ranks


@pytest.mark.parametrize("end", ["sys.exit(0)", "sys.exit()", "sys.exit(None)", "raise SystemExit", "exit(0)",
                                 "quit()"])
def test_a_script_exiting_with_status_0_on_every_rank_ends_normally(ip, world_of, mpi, capsys, tmp_path, end):
    world_of(2)
    path = script(tmp_path, f"import sys\nprint('bye')\n{end}\nprint('never')\n")
    capsys.readouterr()
    ip.run_line_magic("mpi", f"run {path}")
    out = capsys.readouterr().out
    assert "[rank 0] bye" in out and "[rank 1] bye" in out and "never" not in out, out
    assert mpi("comm.allreduce(1)") == {0: 2, 1: 2}
    with pytest.raises(RankError, match="RuntimeError: exit\\(\\) is not for a notebook's world"):
        mpi("exit()")  # in a cell, exit() still says why it cannot


@pytest.mark.parametrize("call, line", [
    ("sys.exit(2)", "rank 1: ScriptExit: fail.py exited with status 2"),
    ("sys.exit('no data in /data/shard1')", "rank 1: ScriptExit: fail.py exited with status 1: no data in "
                                            "/data/shard1"),
])
def test_a_script_exiting_with_an_error_on_one_rank_names_it_and_keeps_the_world(ip, world_of, mpi, capsys,
                                                                                   tmp_path, call, line):
    world_of(2)
    mpi("kept = 41")
    path = script(tmp_path, f"""\
        import sys
        from mpi4py import MPI
        if MPI.COMM_WORLD.Get_rank() == 1:
            {call}
        print("finished", MPI.COMM_WORLD.Get_rank())
        """, name="fail.py")
    capsys.readouterr()
    with pytest.raises(RankError) as info:
        ip.run_line_magic("mpi", f"run {path}")
    assert str(info.value).splitlines() == ["cell failed on rank 1; rank 0 finished it", line]
    shown = rendered(info.value)
    assert "mpinb/" not in shown and "Cell In" not in shown and "SystemExit" not in shown, shown
    assert "[rank 0] finished 0" in capsys.readouterr().out
    assert mpi("kept + 1") == {0: 42, 1: 42}  # the world and its variables are kept


def test_argparse_rejecting_the_arguments_shows_its_message_once(ip, world_of, mpi, capsys, tmp_path):
    world_of(2)
    path = script(tmp_path, TRAIN)
    capsys.readouterr()
    with pytest.raises(RankError) as info:
        ip.run_line_magic("mpi", f"run {path} --epochs 2 --bogus")
    assert str(info.value).splitlines() == ["cell failed on every rank it ran on (ranks 0-1)",
                                            "ranks 0-1: ScriptExit: train.py exited with status 2"]
    shown = rendered(info.value)
    assert shown.count("usage: train.py [-h] [--epochs EPOCHS] [--lr LR]") == 1, shown
    assert shown.count("train.py: error: unrecognized arguments: --bogus") == 1, shown
    assert "mpinb/" not in shown, shown
    captured = capsys.readouterr()
    assert "usage:" not in captured.out + captured.err  # not once per rank as well
    assert mpi("comm.allreduce(1)") == {0: 2, 1: 2}


def test_an_exception_in_the_script_shows_the_scripts_file_and_lines(ip, world_of, tmp_path):
    world_of(2)
    path = script(tmp_path, """\
        import sys


        def step(x):
            return 1 / x


        step(0)
        """)
    with pytest.raises(RankError) as info:
        ip.run_line_magic("mpi", f"run {path}")
    assert "ranks 0-1: ZeroDivisionError: division by zero" in str(info.value)
    shown = rendered(info.value)
    assert f"{path}:8" in shown and "----> 8 step(0)" in shown, shown  # line 1 is the file's first line
    assert f"{path}:5, in step" in shown and "----> 5     return 1 / x" in shown, shown
    assert "mpinb/" not in shown and "Cell In" not in shown, shown


def test_a_script_that_never_returns_is_stopped_as_a_cell(ip, world_of, mpi, tmp_path):
    world_of(2)
    before = mpi("import sys\n(__name__, '__file__' in globals(), list(sys.argv))")
    path = script(tmp_path, f"""\
        import pathlib
        import time
        from mpi4py import MPI
        pathlib.Path({str(tmp_path)!r}, f"started{{MPI.COMM_WORLD.Get_rank()}}").touch()
        while True:
            time.sleep(0.05)
        """, name="forever.py")

    def press_stop_once_both_started():  # at most two minutes: then the test's own timeout ends it
        wait_for(lambda: all((tmp_path / f"started{rank}").exists() for rank in (0, 1)), "both ranks started", 120,
                 required=False)
        _thread.interrupt_main()

    threading.Thread(target=press_stop_once_both_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt) as info:
        ip.run_line_magic("mpi", f"run {path} --forever")
    shown = rendered(info.value)
    assert "time.sleep(0.05) at forever.py line 6" in shown, shown  # where each rank was: the script's line
    assert "cell line" not in shown and "run_script" not in shown, shown
    assert mpi("(__name__, '__file__' in globals(), list(sys.argv))") == before
    assert mpi("rank") == {0: 0, 1: 1}


def test_a_mismatch_and_a_stuck_rank_in_a_script_are_named_at_the_scripts_lines(ip, world_of, mpi, tmp_path):
    """The lines mpinb names are the script's, as the editor numbers them, never the one-line cell that ran it."""
    world_of(2)
    path = script(tmp_path, """\
        from mpi4py import MPI

        comm = MPI.COMM_WORLD


        def wait_for(value):
            comm.Barrier()
            return value


        if comm.Get_rank() == 0:
            wait_for("only rank 0 gets here")
        """, name="lonely.py")
    with pytest.raises(RankError) as info:
        ip.run_line_magic("mpi", f"run --timeout 60 {path}")
    text = str(info.value)
    assert "rank 0 in Barrier() at lonely.py line 7" in text, text
    assert "rank 1 finished the cell without entering it" in text, text
    shown = rendered(info.value)
    assert "run_script" not in shown and "cell line" not in shown and "__import__" not in shown, shown
    assert mpi("comm.allreduce(1)") == {0: 2, 1: 2}


DDP_TUTORIAL_UNEVEN = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(BACKEND)
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [torch.randn(8, 4) for _ in range(5 + (rank == 0))]  # one batch more on rank 0
for step, x in enumerate(batches):
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("backend", ["gloo", "mpi4py"])
def test_a_ddp_script_that_destroys_its_group_is_let_out_of_uneven_inputs_and_runs_again(ip, world_of, mpi, capfd,
                                                                                         tmp_path, backend):
    """A plain DDP script that ends with ``destroy_process_group()``, as the PyTorch DDP tutorial does, with one
    batch more on rank 0: rank 1 finishes and destroys its group while rank 0 waits in its last step's
    all_reduce. Rank 1 stands in for that step on the group it destroyed (its DDP model still holds it; the
    mpi4py backend frees a destroyed group's communicator only when the next group is made): the world and the
    run's globals are kept. Run again, rank 0's group (which it never got to destroy) is ended
    first, so ``init_process_group`` meets on both ranks, as in new processes."""
    pytest.importorskip("torch")
    world_of(2)
    # as a new torchrun worker: no group yet (an earlier test's cells may have made one in this shared world)
    mpi("import torch.distributed as dist\nif dist.is_initialized():\n    dist.destroy_process_group()")
    path = script(tmp_path, DDP_TUTORIAL_UNEVEN.replace("BACKEND", repr(backend)), name="ddp_uneven.py")
    for run in range(2):
        capfd.readouterr()
        with pytest.raises(RankError) as info:
            ip.run_line_magic("mpi", f"run {path}")
        text = str(info.value)
        assert "rank 0 in DDP all_reduce(5 x float32) at ddp_uneven.py line 13" in text, text
        assert "Likely uneven inputs" in text and "the world and every rank's variables are kept" in text, text
        assert "LookupError" not in text and "started again" not in text, text
        assert mpi("(step, len(batches))") == {0: (5, 6), 1: (4, 5)}  # the run's globals, kept
        err = capfd.readouterr().err
        ended = "[rank 0] torch.distributed's default process group, destroyed on rank 1 by the last run, destroyed"
        assert (ended in err) == (run == 1), err


def test_options_before_the_file_are_mpinbs_and_after_it_the_scripts(ip, magics, world_of, mpi, capsys, tmp_path):
    world_of(2)
    path = script(tmp_path, "import sys\nfrom mpi4py import MPI\nprint('argv', sys.argv[1:])\n"
                            "MPI.COMM_WORLD.allreduce(1)\n")
    with pytest.raises(UsageError, match="a 2-rank world is running, not 3"):
        ip.run_line_magic("mpi", f"run -n 3 {path}")
    with pytest.raises(UsageError, match="--timeout takes seconds"):
        ip.run_line_magic("mpi", f"run --timeout nan {path}")
    capsys.readouterr()
    ip.run_line_magic("mpi", f"run -n 2 --trace {path} -n 5 --trace -h")
    assert "[rank 1] argv ['-n', '5', '--trace', '-h']" in capsys.readouterr().out
    assert magics.last_trace is not None and len(magics.last_trace) > 0


def test_a_missing_file_starts_no_world(ip, magics, no_world, tmp_path):
    with pytest.raises(UsageError, match="%mpi run: no file"):
        ip.run_line_magic("mpi", f"run {tmp_path}/train.py")
    assert magics.world is None


@pytest.mark.slow
@pytest.mark.notebook
def test_the_debugger_stops_in_the_script_at_its_lines(tmp_path):
    """``breakpoint()`` in a script, and ``%mpi debug R`` after it failed, in a real kernel: pdb's prompt in the
    notebook, at the script's file and lines."""
    from conftest import leftover_ranks, new_world_tag
    from kernel_session import jupyter_client_kernel, run

    stops = script(tmp_path, """\
        from mpi4py import MPI
        w = 5
        if MPI.COMM_WORLD.Get_rank() == 1:
            breakpoint()
            w = 6
        MPI.COMM_WORLD.Barrier()
        print("w", w)
        """, name="stops.py")
    fails = script(tmp_path, """\
        from mpi4py import MPI


        def step(x):
            y = x * 7
            return y / (x - MPI.COMM_WORLD.Get_rank())


        step(1)
        """, name="fails.py")
    tag = new_world_tag()
    with jupyter_client_kernel() as client:
        assert run(client, "%load_ext mpinb\n%mpi start -n 2")[0] == "ok"
        status, text, prompts = run(client, f"%mpi run {stops}", ["p w", "n", "p w", "c"])
        assert status == "ok", text
        assert prompts == ["(rank 1) (Pdb) "] * 4
        assert f"> {stops}(5)<module>()" in text, text  # where pdb is: the script's file and line
        assert "[rank 1] w 6" in text and "[rank 0] w 5" in text, text
        status, text, _ = run(client, f"%mpi run {fails}")
        assert status == "error" and "rank 1: ZeroDivisionError" in text, text
        status, text, prompts = run(client, "%mpi debug 1", ["p y", "l", "q"])
        assert status == "ok", text
        assert f"> {fails}(6)step()" in text and "[rank 1] 7" in text, text
        assert "return y / (x - MPI.COMM_WORLD.Get_rank())" in text, text  # l showed the script's source
        assert run(client, "%mpi stop")[0] == "ok"
    assert not leftover_ranks(tag)
