"""Sessions as people have them, through a real kernel: Stop pressed once, twice, three times, during a cell,
during ``%mpi start``, ``restart`` and ``stop``; front ends that answer no prompts; a world MPI left inconsistent.
After each: one line of what happened, no frame of mpinb's or ipyparallel's, ``%mpi status`` true to the
processes, a world of the same size, and nothing left once it stops."""

import time

import pytest
from conftest import leftover_ranks, new_world_tag
from kernel_session import jupyter_client_kernel

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.notebook]

# rank 1 cannot answer an interrupt (SIGINT blocked, as in a C library that masks it) for as long as the test needs
DEAF = ("import signal, time\nif rank == 1:\n    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])\n"
        "    print('deaf now', flush=True)\n    time.sleep(30)\n    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])\ncomm.Barrier()")
DEAF_NOW = "[rank 1] deaf now"  # the Stops are pressed from when this shows, however slow the cell is to start


def clean(shown):
    assert not shown.internal_frames(), shown.text
    return shown


def test_three_quick_stops_end_the_world_in_one_line_and_the_next_cell_has_as_many_ranks():
    tag = new_world_tag()
    with jupyter_client_kernel() as k:
        assert k.run("%load_ext mpinb\n%mpi start -n 3").status == "ok"
        assert k.run("%%mpi\nkept = rank").status == "ok"
        shown = clean(k.run("%%mpi\n" + DEAF, stops=(0.3, 0.6, 0.9), after=DEAF_NOW))
        assert shown.status == "error" and "Stop pressed 3 times: the world of 3 ranks was ended" in shown.text
        assert "Traceback" not in shown.text
        status = clean(k.run("%mpi status"))
        assert "no MPI world is running" in status.text and "starts 3 again" in status.text, status.text
        assert not leftover_ranks(tag, timeout=10)  # ended means every process of it
        shown = clean(k.run("%%mpi\n(size, kept)"))  # the next cell starts it again, with every rank's variables
        assert shown.status == "ok" and all(f"[rank {r}] (3, {r})" in shown.text for r in range(3)), shown.text
        assert k.run("%mpi stop").status == "ok"
    assert not leftover_ranks(tag)


def test_a_second_stop_says_what_is_awaited_and_how_long_and_keeps_the_world():
    tag = new_world_tag()
    with jupyter_client_kernel() as k:
        assert k.run("%load_ext mpinb\n%mpi start -n 3").status == "ok"
        assert k.run("%%mpi\nkept = rank * 10").status == "ok"
        shown = clean(k.run("%%mpi\n" + DEAF, stops=(0.3, 0.6), after=DEAF_NOW))
        assert shown.status == "error" and "[mpinb] still waiting for rank" in shown.text, shown.text
        assert "press Stop (Ctrl-C) again to end the world now" in shown.text
        # rank 1 stayed deaf past the grace: the world was restarted, of the same size, and said so
        assert "so the world was started again with 3 new ranks" in shown.text, shown.text
        assert "restored every rank's variables as of In[" in shown.text and "kept" in shown.text, shown.text
        shown = clean(k.run("%%mpi\n(size, comm.allreduce(rank))"))
        assert shown.status == "ok" and all(f"[rank {r}] (3, 3)" in shown.text for r in range(3)), shown.text
        assert k.run("%%mpi\nkept = rank * 10").status == "ok"
        # every rank in time.sleep answers the first Stop at once: a second one 0.3 s later must not cost the world
        shown = clean(k.run("%%mpi\nimport time\ntime.sleep(60)", stops=(1.0, 1.3)))
        assert shown.status == "error" and "so the world was restarted" not in shown.text, shown.text
        shown = clean(k.run("%%mpi\nkept"))
        assert shown.status == "ok" and all(f"[rank {r}] {r * 10}" in shown.text for r in range(3)), shown.text
        assert k.run("%mpi stop").status == "ok"
    assert not leftover_ranks(tag)


def test_a_stop_during_mpi_stop_lets_it_finish_and_leaves_nothing():
    tag = new_world_tag()
    with jupyter_client_kernel() as k:
        assert k.run("%load_ext mpinb\n%mpi start -n 2").status == "ok"
        assert k.run("%%mpi\nimport numpy").status == "ok"
        shown = clean(k.run("%mpi stop", stops=(0.05, 0.15)))
        assert shown.status == "ok" and "MPI world of 2 ranks stopped" in shown.text, shown.text
        assert not leftover_ranks(tag, timeout=10)
        assert "no MPI world is running" in k.run("%mpi status").text
    assert not leftover_ranks(tag)


@pytest.mark.parametrize("command, stop_at", [("%mpi start -n 3", 0.4), ("%mpi restart", 0.1),
                                              ("%mpi restart", 0.9), ("%%mpi\nrank", 0.4)])
def test_a_stop_during_a_start_rolls_it_back_in_one_line_and_the_size_is_kept(command, stop_at):
    tag = new_world_tag()
    with jupyter_client_kernel() as k:
        assert k.run("%load_ext mpinb\n%config MPIMagics.default_ranks = 3").status == "ok"
        if "restart" in command:
            assert k.run("%mpi start -n 3").status == "ok"
        shown = clean(k.run(command, stops=(stop_at,)))
        if shown.status == "error":  # the Stop came while it started (else it finished first, and that is fine)
            assert shown.ename == "StartInterrupted" and "no world is running" in shown.text, shown.text
            assert len([line for line in shown.text.splitlines() if "KeyboardInterrupt" in line]) == 1
            assert not leftover_ranks(tag, timeout=10, started=False)
            assert "the next %%mpi starts 3 again" in k.run("%mpi status").text
        shown = clean(k.run("%%mpi\nsize"))
        assert shown.status == "ok" and "[rank 2] 3" in shown.text, shown.text
        assert k.run("%mpi stop").status == "ok"
    assert not leftover_ranks(tag)


@pytest.mark.parametrize("cell", [
    "import numpy as np\na = np.zeros(3)\nif rank == 0:\n    comm.Bcast(a, root=0)\nelse:\n"
    "    comm.Reduce(a, None, root=0)",
    "import numpy as np\na = np.zeros(1)\ncomm.Bcast(a, root=rank)",
])
def test_a_mismatch_mpi_completed_restarts_the_world_saying_so_and_later_collectives_work(cell):
    tag = new_world_tag()
    with jupyter_client_kernel() as k:
        assert k.run("%load_ext mpinb\n%mpi start -n 2").status == "ok"
        shown = clean(k.run("%%mpi\n" + cell))
        assert shown.status == "error" and "CollectiveMismatch" in shown.text
        assert "so the world was started again with 2 new ranks" in shown.text, shown.text
        for later in ("comm.allreduce(rank)", "comm.Barrier()\nimport numpy as np\nb = np.ones(4)\n"
                      "comm.Bcast(b, root=0)\nfloat(b.sum())"):
            shown = clean(k.run("%%mpi\n" + later))
            assert shown.status == "ok" and "CollectiveMismatch" not in shown.text, shown.text
        assert "[rank 1] 4.0" in shown.text
        assert k.run("%mpi stop").status == "ok"
    assert not leftover_ranks(tag)


def test_debuggers_under_a_front_end_without_stdin_say_so_once_and_the_ranks_go_on():
    """nbclient and papermill send allow_stdin=False: breakpoint() and %mpi debug must not hang the next cell."""
    tag = new_world_tag()
    with jupyter_client_kernel() as k:
        assert k.run("%load_ext mpinb\n%mpi start -n 2").status == "ok"
        shown = clean(k.run("%%mpi\nfor i in range(3):\n    breakpoint()\ncomm.Barrier()\n'done'", allow_stdin=False))
        assert shown.status == "ok" and "[rank 0] 'done'" in shown.text and "[rank 1] 'done'" in shown.text
        assert shown.text.count("answers no prompts") == 1, shown.text
        assert "StdinNotImplementedError" not in shown.text
        assert clean(k.run("%%mpi\n1 / 0", allow_stdin=False)).status == "error"
        shown = clean(k.run("%mpi debug 1", allow_stdin=False, timeout=60))
        assert "answers no prompts" in shown.text and "StdinNotImplementedError" not in shown.text, shown.text
        shown = clean(k.run("%%mpi\nrank", timeout=60))
        assert shown.status == "ok" and "[rank 1] 1" in shown.text
        assert k.run("%mpi stop").status == "ok"
    assert not leftover_ranks(tag)


def test_a_stop_in_a_reporting_loop_shows_where_in_the_cell_and_no_frame_of_mpinb():
    tag = new_world_tag()
    with jupyter_client_kernel() as k:
        assert k.run("%load_ext mpinb\n%mpi start -n 2").status == "ok"
        shown = clean(k.run("%%mpi\nimport mpinb\nfor step in range(10**7):\n    mpinb.report(step=step, loss=1.0)",
                            stops=(2.0,)))
        assert shown.status == "error" and "Where it was" in shown.text, shown.text
        assert "blocked in mpinb.report(step=step, loss=1.0) at cell line 4" in shown.text  # the cell's call
        assert k.run("%mpi stop").status == "ok"
    assert not leftover_ranks(tag)


def test_time_at_a_debugger_prompt_does_not_count_against_the_timeout():
    """--timeout 4 with a breakpoint answered after 6 s: the cell goes on to its end, as the user asked pdb to."""
    tag = new_world_tag()
    with jupyter_client_kernel() as k:
        assert k.run("%load_ext mpinb\n%mpi start -n 2").status == "ok"
        answers = iter(["p rank", "c"])

        def slow(prompt):
            time.sleep(3)  # a user reading the code before answering
            return next(answers)

        shown = clean(k.run("%%mpi --timeout 4\nif rank == 0:\n    breakpoint()\ncomm.Barrier()\n'end'",
                            answers=slow))
        assert shown.status == "ok" and "[rank 0] 'end'" in shown.text and "[rank 1] 'end'" in shown.text, shown.text
        assert "stopping" not in shown.text
        assert k.run("%mpi stop").status == "ok"
    assert not leftover_ranks(tag)


def test_starts_interrupted_at_any_moment_leave_no_controller_behind():
    """Three starts interrupted at 0.3, 0.8 and 1.2 s, then a start and a stop, in one kernel: once, a controller
    started by ipyparallel's pending start coroutine after the interrupt outlived everything. The kernel's own
    children are what its worlds started, and nothing else."""
    import psutil

    tag = new_world_tag()
    with jupyter_client_kernel() as k:
        assert k.run("%load_ext mpinb").status == "ok"
        for at in (0.3, 0.8, 1.2):
            shown = clean(k.run("%mpi start -n 2", stops=(at,)))
            assert shown.status == "ok" or shown.ename == "StartInterrupted", shown.text
            assert k.run("%mpi stop").status == "ok"
        assert k.run("%mpi start -n 2").status == "ok"
        assert k.run("%mpi stop").status == "ok"
        children = psutil.Process(k.pid).children(recursive=True)
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, [(p.pid, p.cmdline()[:3]) for p in alive]
    assert not leftover_ranks(tag)
