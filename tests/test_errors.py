import pytest

from mpinb.errors import RankError


def failure(ename, evalue, tb=("Traceback line",)):
    return {"ename": ename, "evalue": evalue, "traceback": list(tb)}


def test_identical_failures_are_merged_with_every_rank_listed():
    error = RankError({r: failure("ZeroDivisionError", "division by zero") for r in range(4)}, range(4))
    assert "ranks 0-3: ZeroDivisionError: division by zero" in str(error)
    rendered = error._render_traceback_()
    assert sum("Traceback line" in line for line in rendered) == 1


def test_different_failures_are_listed_each_with_no_cap():
    failures = {r: failure("ValueError", f"bad {r}") for r in range(0, 40, 2)}
    error = RankError(failures, range(40))
    for r in range(0, 40, 2):
        assert f"rank {r}: ValueError: bad {r}" in str(error)
    assert "finished it" in str(error)


def test_groups_keep_rank_order():
    error = RankError({3: failure("KeyError", "'k'"), 0: failure("KeyError", "'k'"), 1: failure("OSError", "x")},
                      range(4))
    assert [ranks for ranks, _ in error.groups] == [[0, 3], [1]]


def test_the_rank_whose_death_ended_the_others_comes_first():
    lost = {0: failure("RankLost", "rank 0 was ended by mpiexec after rank 1 died"),
            1: failure("RankLost", "rank 1 died: exit code 3")}
    error = RankError(lost, range(2), notes=["%mpi restart starts a fresh world of the same size"], first=1)
    assert [ranks for ranks, _ in error.groups] == [[1], [0]]
    assert str(error).splitlines()[1] == "rank 1: RankLost: rank 1 died: exit code 3"


def test_library_code_raises_mpinbs_own_errors_outside_ipython(tmp_path):
    """World, Placement and the MPI checks raise typed errors a script can catch; only the magics turn the ones
    about what was asked into IPython's UsageError (the tests of each magic check that)."""
    from mpinb.errors import BadArguments, MpinbError, NoMPI
    from mpinb.notebook.world import mpis
    from mpinb.notebook.world.cluster import check_size
    from mpinb.notebook.world.launchers import Placement

    with pytest.raises(BadArguments, match="-n takes a number of ranks, at least 1, not 0"):
        check_size(0)
    with pytest.raises(BadArguments, match="unknown launcher 'slurmm'"):
        Placement(launcher="slurmm")
    with pytest.raises(BadArguments, match="hostfile not found"):
        Placement(launcher="ssh", hostfile=str(tmp_path / "nowhere"))
    with pytest.raises(NoMPI, match="mpiexec not found"):
        mpis.resolve(None, str(tmp_path / "no-such-mpiexec"), None)
    assert issubclass(BadArguments, ValueError) and issubclass(NoMPI, MpinbError)
