"""``mpinb export``: a notebook's %%mpi cells as a script that plain ``mpiexec`` runs with the same results."""

import ast
import os
import re
import subprocess
import sys

import nbformat
import pytest
from conftest import leftover_ranks, new_world_tag
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook
from training import export, final_loss, mpinb_command, training_notebook

from mpinb import read_metrics
from mpinb.notebook.world.mpis import default_mpiexec

@pytest.mark.notebook
@pytest.mark.mpi
@pytest.mark.slow
def test_exported_training_gives_the_notebooks_loss(tmp_path):
    notebook = training_notebook(tmp_path / "train.ipynb")
    tag = new_world_tag()
    executed = nbformat.read(notebook, as_version=4)
    client = NotebookClient(executed, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    assert not leftover_ranks(tag)
    code = [cell for cell in executed.cells if cell.cell_type == "code"]
    text = ["".join(out.get("text", "") for out in cell.outputs) for cell in code]
    assert "[rank 1] rank 1 of 2 says goodbye" in text[5]
    in_notebook = final_loss(text[3])
    gathered, losses = text[4].splitlines()
    assert float(gathered) == in_notebook  # --gather brought it into the notebook too
    losses = ast.literal_eval(losses)  # every loss each rank reported, from mpinb.metrics()
    assert sorted(losses) == [0, 1] and len(losses[0]) == 40

    done = export(notebook, "-o", str(tmp_path / "train.py"), "--sbatch", str(tmp_path / "train.sbatch"))
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout
    script = (tmp_path / "train.py").read_text()
    assert "# ---- cell 3 runs in the notebook only (left out):\n# %mpi start -n 2" in script
    assert "# (--gather final: the values stay on each rank)" in script
    assert "if rank in __import__('mpinb.wire.ranks'" in script
    assert "get_ipython" not in script

    env = dict(os.environ, MPINB_METRICS_FILE=str(tmp_path / "metrics-{rank}.jsonl"), MPINB_REPORT_EVERY="0")
    run = subprocess.run([default_mpiexec(), "-n", "2", sys.executable, "train.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    assert final_loss(run.stdout) == in_notebook  # same seed, same arithmetic: the same number
    assert "rank 1 of 2 says goodbye" in run.stdout
    frame = read_metrics(str(tmp_path / "metrics-*.jsonl"))
    assert frame.query("name == 'loss'").groupby("rank")["value"].apply(list).to_dict() == losses

    job = (tmp_path / "train.sbatch").read_text()
    assert "#SBATCH --ntasks=2\n" in job
    assert f"{default_mpiexec()} -n $SLURM_NTASKS {sys.executable} {tmp_path / 'train.py'}" in job


def test_export_stops_at_ipython_syntax_and_names_the_cell(tmp_path):
    notebook = tmp_path / "magic.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("%load_ext mpinb"),
                                       new_code_cell("%%mpi\nx = 1\n%timeit x + 1")]), notebook)
    done = export(notebook, "-o", str(tmp_path / "out.py"))
    assert done.returncode == 2
    assert "cell 2 line 2 is IPython syntax, which a script cannot run: '%timeit x + 1'" in done.stderr
    assert not (tmp_path / "out.py").exists()


def test_export_needs_an_mpi_cell_and_a_size_for_the_job(tmp_path):
    notebook = tmp_path / "plain.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print(1)")]), notebook)
    done = export(notebook, "-o", str(tmp_path / "out.py"))
    assert done.returncode == 2 and "plain.ipynb has no %%mpi cell" in done.stderr
    nbformat.write(new_notebook(cells=[new_code_cell("%%mpi\nprint(rank)")]), notebook)
    done = export(notebook, "-o", str(tmp_path / "out.py"), "--sbatch", str(tmp_path / "job.sbatch"))
    assert done.returncode == 2 and "add -n N" in done.stderr
    done = export(notebook, "-o", str(tmp_path / "out.py"), "--sbatch", str(tmp_path / "job.sbatch"), "-n", "3")
    assert done.returncode == 0 and "#SBATCH --ntasks=3" in (tmp_path / "job.sbatch").read_text()


@pytest.mark.mpi
def test_a_cell_tagged_raises_exception_is_left_out_saying_why_and_the_script_runs(tmp_path):
    """A tutorial shows an error on purpose in a cell tagged ``raises-exception`` (which nbclient lets fail): the
    script leaves it out, with a comment, and runs to the end under mpiexec."""
    failing = new_code_cell("%%mpi\nprint('before', rank)\n1 / 0", metadata={"tags": ["raises-exception"]})
    notebook = tmp_path / "errors.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("%%mpi -n 2\nx = rank + 1"), failing,
                                       new_code_cell("%%mpi\nprint(f'after {x}')")]), notebook)
    done = export(notebook, "-o", str(tmp_path / "out.py"))
    assert done.returncode == 0, done.stderr
    script = (tmp_path / "out.py").read_text()
    assert "# ---- cell 2 is tagged raises-exception: it fails on purpose, to show the error (left out):" in script
    assert "# 1 / 0" in script
    ran = subprocess.run([default_mpiexec(), "-n", "2", sys.executable, str(tmp_path / "out.py")],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    # under mpiexec one rank's writes can run into another's ("afterafter 1"): one string each, found as words
    assert sorted(re.findall(r"after (\d)", ran.stdout)) == ["1", "2"], ran.stdout


def test_the_help_names_the_cell_magic_as_written():
    done = subprocess.run([mpinb_command(), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "write a notebook's %%mpi cells" in done.stdout, done.stdout
