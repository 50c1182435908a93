"""pdb on a rank, answered in the notebook, through a real kernel (jupyter_client answering ``input_request``s as
a notebook front end does): post-mortem with %mpi debug R, breakpoint() on one rank or on several."""

import pytest
from conftest import leftover_ranks, new_world_tag
from kernel_session import jupyter_client_kernel, run

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.notebook]


def test_post_mortem_on_the_failing_rank_and_breakpoints_on_one_rank_or_several():
    tag = new_world_tag()
    with jupyter_client_kernel() as session:
        assert run(session, "%load_ext mpinb\n%mpi start -n 2")[0] == "ok"
        status, _, _ = run(session, "%%mpi\nx = rank * 100\ndef f(y):\n    z = y * 7\n    if rank == 1:\n"
                                   "        raise ValueError('bad batch')\n    return z\nf(rank + 3)")
        assert status == "error"
        status, text, prompts = run(session, "%mpi debug 1", ["p z", "up", "p x", "up", "l", "q"])
        assert status == "ok", text
        assert prompts == ["(rank 1) (Pdb) "] * 6
        assert "*** Oldest frame" in text and "mpinb" not in text  # the cell is the top: no frame of mpinb's
        assert "[rank 1] ValueError: bad batch" in text
        assert "[rank 1] 28" in text and "[rank 1] 100" in text  # z of the failing frame, then x a frame up
        assert "f(rank + 3)" in text  # l showed the cell's source
        assert "> Cell In[2](6)f()" in text and "ipykernel_" not in text  # where pdb is: the cell, as IPython names it
        status, text, prompts = run(session, "%mpi debug 0")
        assert "rank 0 has no failed cell to debug" in text and not prompts

        code = "%%mpi\nw = 5\nif rank == 1:\n    breakpoint()\n    w = 6\ncomm.Barrier()\nw"
        status, text, prompts = run(session, code, ["p w", "n", "p w", "c"])
        assert status == "ok", text
        assert prompts == ["(rank 1) (Pdb) "] * 4
        assert "[rank 1] 5" in text and "[rank 1] 6" in text
        assert "[rank 0] 5" in text and "[rank 1] 6" in text  # rank 0 waited in the barrier, then finished

        asked = []

        def each_rank(prompt):  # every rank is asked, one prompt at a time: print v once, then go on
            asked.append(prompt)
            return "p v" if asked.count(prompt) == 1 else "c"

        status, text, prompts = run(session, "%%mpi\nv = rank\nbreakpoint()\ncomm.Barrier()\nv + 1", each_rank)
        assert status == "ok", text
        assert sorted(prompts) == ["(rank 0) (Pdb) ", "(rank 0) (Pdb) ", "(rank 1) (Pdb) ", "(rank 1) (Pdb) "]
        assert "[rank 0] 1" in text and "[rank 1] 2" in text
        assert run(session, "%mpi stop")[0] == "ok"
    assert not leftover_ranks(tag)


def test_a_stopped_cell_keeps_every_ranks_variables_in_a_real_kernel():
    """In a kernel, as in a notebook: a failing rank, a timeout and the Stop button (the kernel's interrupt),
    each while other ranks wait in MPI; after each, the variables are there and a collective is right."""
    tag = new_world_tag()
    with jupyter_client_kernel() as session:
        assert run(session, "%load_ext mpinb\n%mpi start -n 3")[0] == "ok"
        assert run(session, "%%mpi\nkept = rank * 10")[0] == "ok"
        cells = ["%%mpi\nif rank == 1:\n    raise ValueError('bad')\ncomm.Barrier()",
                 "%%mpi --timeout 2\nif rank == 0:\n    comm.recv(source=2)\nelse:\n    comm.Barrier()"]
        for cell in cells:
            status, text, _ = run(session, cell)
            assert status == "error" and "every rank's variables are kept" in text, text
            status, text, _ = run(session, "%%mpi\n(kept, comm.allreduce(rank))")
            assert status == "ok" and all(f"[rank {r}] ({r * 10}, 3)" in text for r in range(3)), text
        # Stop once every rank is about to wait in MPI
        stopped = session.run("%%mpi\nimport numpy as np\ncomm.Barrier()\nprint('receiving', flush=True)\n"
                              "comm.Recv(np.zeros(2), source=(rank + 1) % size)", stops=[0.0],
                              after="[rank 2] receiving", timeout=60)
        assert stopped.status == "error", stopped.text
        status, text, _ = run(session, "%%mpi\n(kept, comm.allreduce(rank))")
        assert status == "ok" and all(f"[rank {r}] ({r * 10}, 3)" in text for r in range(3)), text
        assert run(session, "%mpi stop")[0] == "ok"
    assert not leftover_ranks(tag)
