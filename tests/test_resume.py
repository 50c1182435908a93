"""Training resumes exactly: N steps in a notebook's world, a segfault inside a C extension, ``%mpi restart``
and N more steps give the same losses and weights, bit for bit, as 2N steps run without a break under plain
``mpiexec``: every rank's variables and the global random generators (Python's, numpy's, torch's) come back.
Once for a loop written with mpi4py, once for a DDP loop (its process group and wrapper are made again, as a
user runs the cell that made them)."""

import re
import subprocess
import sys

import pytest
from conftest import leftover_ranks, new_world_tag

from kernel_session import jupyter_client_kernel
from mpinb.notebook.world.mpis import default_mpiexec

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.notebook]

STEPS = 4

# each step draws from every global generator; the gradients are averaged with mpi4py
MPI4PY_SETUP = """
import random, numpy as np, torch
random.seed(10 + rank); np.random.seed(20 + rank); torch.manual_seed(30 + rank)
w = np.zeros(4)
velocity = np.zeros(4)
losses = []
def step():
    x = np.random.randn(16, 4) + random.random()
    y = x @ np.arange(1.0, 5.0) + torch.randn(16, dtype=torch.float64).numpy()
    error = x @ w - y
    grad = x.T @ error / len(y)
    total = np.empty_like(grad)
    comm.Allreduce(grad, total)
    velocity[:] = 0.9 * velocity + total / size
    w[:] -= 0.01 * velocity
    losses.append(float((error ** 2).mean()))
"""
MPI4PY_WRAP = ""

# DDP over torch.distributed; batches drawn from torch's and numpy's global generators, dropout from torch's
DDP_SETUP = """
import random, numpy as np, torch
import mpinb.torch as mt
random.seed(10 + rank); np.random.seed(20 + rank); torch.manual_seed(30)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
losses = []
def step():
    x = torch.randn(16, 4) + float(np.random.rand()) + random.random()
    loss = ((ddp(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(float(loss))
"""
DDP_WRAP = """
mt.init_process_group()
ddp = torch.nn.parallel.DistributedDataParallel(model)
"""

RUN = """
for _ in range({n}):
    step()
"""
REPORT = """
import hashlib
state = w.tobytes() if 'w' in dir() else b''.join(p.detach().numpy().tobytes() for p in model.parameters())
line = f'RESULT {rank} ' + ' '.join(f'{loss!r}' for loss in losses) + ' ' + hashlib.sha256(state).hexdigest()
print(line, flush=True)
"""
# under mpiexec the ranks' lines can run into each other on one stdout: each rank writes its own file too
TO_FILE = "open(f'result-{rank}.txt', 'w').write(line + '\\n')\n"
CRASH = "import ctypes\nif rank == 1:\n    ctypes.string_at(0)\ncomm.Barrier()"


def results(text):
    """``{rank: 'losses... weights-hash'}`` from the lines REPORT printed."""
    return {int(rank): rest for rank, rest in re.findall(r"RESULT (\d) ([^\n]+)", text)}


def uninterrupted(tmp_path, setup, wrap):
    script = tmp_path / "train.py"
    script.write_text("from mpi4py import MPI\ncomm = MPI.COMM_WORLD\nrank, size = comm.rank, comm.size\n" + setup +
                      wrap + RUN.format(n=2 * STEPS) + REPORT + TO_FILE)
    ran = subprocess.run([default_mpiexec(), "-n", "2", sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return results("".join((tmp_path / f"result-{rank}.txt").read_text() for rank in (0, 1)))


@pytest.mark.parametrize("setup, wrap", [(MPI4PY_SETUP, MPI4PY_WRAP), (DDP_SETUP, DDP_WRAP)], ids=["mpi4py", "ddp"])
def test_steps_a_crash_a_restart_and_more_steps_match_an_uninterrupted_run_bit_for_bit(tmp_path, setup, wrap):
    expected = uninterrupted(tmp_path, setup, wrap)
    assert sorted(expected) == [0, 1], expected
    tag = new_world_tag()
    with jupyter_client_kernel() as k:
        # snapshot_lag = 0: each cell waits for the last one's snapshot, so the crash loses nothing of it
        assert k.run("%load_ext mpinb\n%config MPIMagics.snapshot_lag = 0\n%mpi start -n 2").status == "ok"
        shown = k.run("%%mpi\n" + setup + wrap + RUN.format(n=STEPS))
        assert shown.status == "ok", shown.text
        crashed = k.run("%%mpi\n" + CRASH)
        assert crashed.status == "error" and "SIGSEGV" in crashed.text, crashed.text
        said = k.run("%mpi restart")
        assert said.status == "ok" and "restored every rank's variables" in said.text, said.text
        if wrap:  # the process group and the DDP wrapper belong to the world that died: made again
            assert "ddp (a DDP wrapper" in said.text, said.text
            assert k.run("%%mpi\n" + wrap).status == "ok"
        shown = k.run("%%mpi\n" + RUN.format(n=STEPS) + REPORT)
        assert shown.status == "ok", shown.text
        resumed = results(shown.text)
        k.run("%mpi stop")
    assert not leftover_ranks(tag)
    assert resumed == expected
