"""The tutorials, executed top to bottom in a real Jupyter kernel."""

import base64
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"

pytestmark = [pytest.mark.notebook, pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(300)]


def execute(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return notebook


def assert_curves_for_every_rank(notebook, *, ranks, points):
    """The saved widget state (what JupyterLab restores) holds one loss curve per rank, with all its points."""
    state = notebook.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    curves = {}
    for model in state.values():
        if model["model_name"] == "LinesModel":
            buffers = {tuple(b["path"]): base64.b64decode(b["data"]) for b in model.get("buffers", [])}
            y = np.frombuffer(buffers[("y", "value")], dtype=model["state"]["y"]["dtype"])
            curves.setdefault(model["state"]["labels"][0], []).append(y)
    assert sorted(curves) == [f"rank {r}" for r in range(ranks)]
    for rank in range(ranks):
        assert any(len(y) == points and np.isfinite(y).all() for y in curves[f"rank {rank}"])


def text_of(cell):
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.append(output.data.get("text/plain", ""))
        elif output.output_type == "error":
            parts.append(f"{output.ename}: {output.evalue}")
    return "\n".join(parts)


def test_quickstart():
    notebook = execute("00_quickstart.ipynb")
    cells = [c for c in notebook.cells if c.cell_type == "code"]
    hello, persist, allreduce, failing, subset, training, frame, status, stop = (text_of(c) for c in cells[1:])
    assert "[rank 0] hello from 0 of 2" in hello and "[rank 1] hello from 1 of 2" in hello
    assert "[rank 1] 11" in persist and "[rank 1] 10" in persist
    assert "[rank 0] 10\n[rank 1] 10" in allreduce
    assert "RankError" in failing and "rank 1: ValueError: rank 1 disagrees" in failing
    assert "rank 0: ZeroDivisionError: division by zero" in failing
    assert subset.strip() == "[rank 1] 10"
    assert "[rank 0] w=" in training and "[rank 1] w=" in training
    assert re.findall(r"^(\d)\s+150\s", frame, re.M) == ["0", "1"]  # every step of every rank in the DataFrame
    assert_curves_for_every_rank(notebook, ranks=2, points=150)
    status_outputs = cells[-2].outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in status_outputs)
    assert "stopped" in stop
