"""The signal a rank dumps its stacks on (``SIGUSR2``) never ends a rank: not while it ends a failing cell (when
the notebook asks the ranks still running where they are), and not after code set every signal back to what
``signal.getsignal()`` said (as Lightning's ``Trainer.fit`` does)."""

import pytest

from mpinb.errors import RankError


def test_a_stack_request_after_code_restored_the_signals_it_found_leaves_the_rank_running(world_of, mpi, capsys):
    world_of(2)
    mpi("import os, signal\n"
        "signal.signal(signal.SIGUSR2, signal.getsignal(signal.SIGUSR2))  # what a framework does when it ends\n"
        "os.kill(os.getpid(), signal.SIGUSR2)\n"
        "print('still here', flush=True)")
    assert capsys.readouterr().out.count("still here") == 2
    mpi("print('and after', rank)")
    assert "and after 1" in capsys.readouterr().out


def test_cells_that_fail_on_every_rank_at_once_never_end_a_rank(world_of, mpi, capsys):
    """When one rank's error comes back, the notebook asks the ranks still running for their stacks: those ranks
    are ending the same failing cell, and put their handlers back as they do. Before, the request could arrive
    between faulthandler's unregister and register and end the rank (2 runs in 3 of these 100 cells did)."""
    world_of(2)
    for cell in range(100):
        with pytest.raises(RankError) as raised:
            mpi(f"raise ValueError('cell {cell}')")
        assert f"ValueError: cell {cell}" in str(raised.value)
    capsys.readouterr()
    mpi("print('alive', rank)")
    assert "alive 1" in capsys.readouterr().out
