"""A data-parallel training notebook, and ``mpinb export`` of one: what the export tests and the Slurm tests run."""

import re
import subprocess
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

TRAINING = [
    new_markdown_cell("# Data-parallel training, exported"),
    new_code_cell("%load_ext mpinb"),
    new_code_cell("%mpi start -n 2"),
    new_code_cell("%%mpi\n"
                  "import torch\n"
                  "import mpinb\n"
                  "from mpinb.torch import allreduce_gradients, broadcast_parameters\n"
                  "torch.set_num_threads(1)\n"
                  "g = torch.Generator().manual_seed(0)\n"
                  "X = torch.randn(512, 8, generator=g)\n"
                  "Y = X @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)\n"
                  "torch.manual_seed(1 + rank)  # ranks start apart; broadcast_parameters aligns them\n"
                  "model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))\n"
                  "broadcast_parameters(model)\n"
                  "opt = torch.optim.SGD(model.parameters(), lr=0.05)"),
    new_code_cell("%%mpi --gather final\n"
                  "for step in range(40):\n"
                  "    mine = torch.arange(rank, 512, size)[step % 4::4]\n"
                  "    loss = torch.nn.functional.mse_loss(model(X[mine]), Y[mine])\n"
                  "    opt.zero_grad()\n"
                  "    loss.backward()\n"
                  "    allreduce_gradients(model)\n"
                  "    opt.step()\n"
                  "    mpinb.report(step=step, loss=loss)\n"
                  "final = comm.allreduce(loss.item()) / size\n"
                  "if rank == 0:\n"
                  "    print(f'final loss {final!r}')"),
    new_code_cell("import mpinb\n"
                  "losses = mpinb.metrics().query(\"name == 'loss'\").groupby('rank')['value'].apply(list)\n"
                  "print(repr(final[0]))\n"
                  "print(repr(losses.to_dict()))"),
    new_code_cell("%%mpi --ranks 1\nprint(f'rank {rank} of {size} says goodbye')"),
    new_code_cell("%mpi stop"),
]


def training_notebook(path):
    nbformat.write(new_notebook(cells=TRAINING, metadata={"kernelspec": {"name": "python3", "language": "python",
                                                                         "display_name": "Python 3"}}), path)
    return path


def mpinb_command():
    """The ``mpinb`` console script installed beside this Python."""
    return str(Path(sys.executable).with_name("mpinb"))


def export(notebook, *args):
    return subprocess.run([mpinb_command(), "export", str(notebook), *args], capture_output=True, text=True,
                          timeout=60)


def final_loss(text):
    """The number after "final loss" (under mpiexec another rank's line can follow it without a line break)."""
    return float(re.search(r"final loss ([-+]?[0-9.]+(?:e[-+]?[0-9]+)?)", text).group(1))
