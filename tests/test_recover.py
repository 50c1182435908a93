"""A stopped cell keeps the world: ranks stuck in MPI are let out, every rank keeps its variables, and MPI's
collectives and messages match again in the next cell (real worlds; the Stop button case is in test_faults.py)."""

import pytest
from conftest import world_processes

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

CASES = {
    "ranks 1, 3 raise while 0, 2 wait in a barrier": (
        "if rank in (1, 3):\n    raise ValueError('bad rank')\ncomm.Barrier()", "", "ranks 0, 2 left Barrier #"),
    "a receive waits for a rank that sleeps past the timeout": (
        "import time\nif rank == 0:\n    comm.recv(source=1)\nelse:\n    time.sleep(30)", "--timeout 2",
        "rank 0 left recv on COMM_WORLD"),
    "every rank waits in a receive from the next (a deadlock)": (
        "import numpy as np\ncomm.Recv(np.zeros(4), source=(rank + 1) % size)", "--timeout 2",
        "ranks 0-3 left Recv on COMM_WORLD"),
    "an allreduce waits for a rank that sleeps past the timeout": (
        "import numpy as np, time\nif rank == 2:\n    time.sleep(30)\ncomm.Allreduce(np.ones(8), np.zeros(8))",
        "--timeout 2", "ranks 0-1, 3 left Allreduce #"),
    "a blocking send of 8 MB waits for a receive that never comes": (
        "import numpy as np, time\nif rank == 0:\n    comm.Send(np.ones(1 << 20), dest=1)\nelse:\n    time.sleep(30)",
        "--timeout 2", "rank 0 left Send on COMM_WORLD"),
    "a split communicator's collective waits for a rank that failed": (
        "half = comm.Split(rank % 2, rank)\nif rank == 3:\n    raise RuntimeError('rank 3 fails')\nhalf.Barrier()",
        "", "rank 1 left Barrier #1 on COMM_WORLD.Split#"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_stopped_cell_keeps_every_ranks_variables(case, world_of, mpi, magics, capsys):
    world = world_of(4)
    if world.dead_ranks(world.ranks):
        world = world_of(4)
    mpi("kept = rank * 10")
    processes = world_processes(world)
    code, line, left = CASES[case]
    with pytest.raises(Exception) as raised:
        mpi(code, line)
    text = str(raised.value)
    assert left in text and "every rank's variables are kept" in text, text
    assert not magics.last.stuck and magics.last.recovered
    assert all(process.is_running() for process in processes)
    assert mpi("kept") == {0: 0, 1: 10, 2: 20, 3: 30}
    assert mpi("comm.allreduce(rank)") == {rank: 6 for rank in range(4)}  # collectives match again
    assert mpi("comm.sendrecv(rank, dest=(rank + 1) % size, source=(rank - 1) % size)") == {0: 3, 1: 0, 2: 1, 3: 2}


def test_a_recovery_says_what_it_does_while_it_runs(world_of, mpi, capsys):
    """Between the diagnosis and the cell's error, a line says which ranks are being let out of what."""
    world_of(2)
    capsys.readouterr()
    with pytest.raises(Exception) as raised:
        mpi("comm.recv(source=(rank + 1) % size)", "--timeout 2")
    assert "every rank's variables are kept" in str(raised.value)
    err = capsys.readouterr().err
    assert "[mpinb] asking ranks 0-1 where they wait in MPI" in err, err
    assert "[mpinb] letting ranks 0-1 out: ranks 0-1 in recv on COMM_WORLD" in err, err
