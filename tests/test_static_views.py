"""Every view a cell draws leaves a static rendering in the cell's output when the cell ends: a notebook run in a
real kernel (nbclient, which applies display updates as JupyterLab does) holds no widget reference any more,
but images and HTML tables that nbconvert's HTML shows without a kernel.
"""

import base64
import math
import re

import nbformat
import numpy as np
import pytest
from conftest import leftover_ranks, new_world_tag
from nbclient import NotebookClient

from mpinb.notebook.models.history import History
from mpinb.widgets import static

WIDGET = "application/vnd.jupyter.widget-view+json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

CELLS = [
    "%load_ext mpinb\n%config MPIMagics.status_after = 1.0\n%mpi start -n 2",
    "%%mpi\nimport mpinb\nfor step in range(40):\n    mpinb.report(step=step, loss=1.0 / (step + 1) + rank)",
    "%%mpi --gather x\nimport numpy as np\nx = np.linspace(-1, 1, 1000, dtype=np.float32) * (rank + 1)",
    "%%mpi\nimport torch\ntorch.manual_seed(rank)\nmodel = torch.nn.Linear(4, 3)\n"
    "model(torch.randn(8, 4)).sum().backward()",
    "%mpi grads model",
    "%%mpi --trace\nfor i in range(20):\n    comm.allreduce(i)",
    "%%mpi\nimport time\ntime.sleep(2.5 if rank == 1 else 0.0)",
    "%mpi status",
    "%mpi who",
    "%mpi stop",
]


def run_notebook(sources, tmp_path):
    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                 "language": "python"}})
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return notebook


def displayed(cell):
    return [output for output in cell.outputs if output.output_type in ("display_data", "execute_result")]


def rich(cell):
    """The cell's displayed outputs that show something: the live status line of a cell that ran past
    ``status_after`` (a loaded machine makes any cell that slow) is emptied when the cell ends, since what it
    said is no longer true (:func:`test_progress_and_status_lines_do_not_outlive_their_cell`)."""
    return [output for output in displayed(cell) if any(output.data.values())]


def png_of(output):
    data = base64.b64decode(output.data["image/png"])
    assert data.startswith(PNG_MAGIC)
    return data


def embedded_images(html):
    return re.findall(r"<img class='mpinb-chart' src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    tag = new_world_tag()
    notebook = run_notebook(CELLS, tmp_path_factory.mktemp("static"))
    assert not leftover_ranks(tag)
    return notebook


@pytest.mark.mpi
@pytest.mark.notebook
@pytest.mark.slow
def test_no_output_refers_to_a_widget_once_its_cell_ended(executed):
    for cell in executed.cells:
        for output in rich(cell):
            assert WIDGET not in output.data, (cell.source, list(output.data))


@pytest.mark.mpi
@pytest.mark.notebook
@pytest.mark.slow
def test_each_view_leaves_its_charts_as_images_and_its_tables_as_html(executed):
    cells = executed.cells
    (charts,) = rich(cells[1])
    png_of(charts)
    assert embedded_images(charts.data["text/html"]), "the chart is in the HTML too"
    assert "<table" in charts.data["text/html"] and "rank" in charts.data["text/plain"]
    assert "loss" in charts.data["text/plain"]

    (inspector,) = rich(cells[2])
    png_of(inspector)  # the per-rank histograms
    assert "differs on rank 1" in inspector.data["text/plain"]
    assert "differs on rank 1" in inspector.data["text/html"]

    (grads,) = rich(cells[4])
    png_of(grads)  # the heatmap
    assert len(embedded_images(grads.data["text/html"])) == 2  # heatmap and histograms
    assert "weight" in grads.data["text/html"] and "<table" in grads.data["text/html"]

    (timeline,) = rich(cells[5])
    png_of(timeline)
    assert "allreduce" in timeline.data["text/html"]

    status = rich(cells[7])
    assert len(status) == 1 and "<table" in status[0].data["text/html"] and "idle" in status[0].data["text/plain"]
    (who,) = rich(cells[8])
    assert "model" in who.data["text/html"]


@pytest.mark.mpi
@pytest.mark.notebook
@pytest.mark.slow
def test_progress_and_status_lines_do_not_outlive_their_cell(executed):
    """The start-up line and the per-rank status block shown while a cell runs say nothing once it ended."""
    start = displayed(executed.cells[0])
    assert start and all(not output.data.get("text/plain") for output in start)
    assert "started in" in "".join(o.text for o in executed.cells[0].outputs if o.output_type == "stream")
    slow = displayed(executed.cells[6])
    assert slow, "the cell ran 2.5 s with status_after 1 s: its status block was shown"
    assert all(not output.data.get("text/plain") for output in slow)


@pytest.mark.mpi
@pytest.mark.notebook
@pytest.mark.slow
def test_nbconvert_html_shows_the_charts_without_a_kernel(executed):
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(executed)
    assert "model not found" not in body
    images = re.findall(r"<img [^>]*src=['\"]data:image/png;base64,", body)
    assert len(images) == 5, images  # charts, the inspector's histograms, the heatmap and histograms, timeline
    assert "differs on rank 1" in body


@pytest.mark.mpi
@pytest.mark.notebook
@pytest.mark.slow
def test_keep_widgets_keeps_the_widget_and_adds_the_static_copy(tmp_path):
    tag = new_world_tag()
    notebook = run_notebook(["%load_ext mpinb\n%config MPIMagics.keep_widgets = True\n%mpi start -n 2",
                             "%%mpi\nimport mpinb\nfor step in range(5):\n    mpinb.report(step=step, loss=1.0)",
                             "%mpi stop"], tmp_path)
    assert not leftover_ranks(tag)
    (charts,) = rich(notebook.cells[1])
    assert WIDGET in charts.data and "image/png" in charts.data and "<table" in charts.data["text/html"]


def test_the_static_chart_marks_where_each_rank_became_nan_and_uses_a_log_scale_over_decades():
    history = History()
    for rank in range(3):
        values = [10.0 ** (-step / 100) for step in range(500)]
        if rank == 2:
            values[300:] = [math.nan] * 200
        history.add(rank, [("main", step, step * 0.01, {"loss": value}) for step, value in enumerate(values)])
    figure = static.metrics_figure(history, ["main"])
    (axes,) = figure.axes
    assert sorted(text.get_text() for text in axes.texts) == ["loss", "rank 2: NaN from step 300"]
    assert axes.get_yscale() == "log"  # 1 down to 1e-5
    assert [line.get_label() for line in axes.lines if not line.get_label().startswith("_")] == [
        "rank 0", "rank 1", "rank 2"]


def test_histograms_without_finite_values_say_so_and_a_nan_heatmap_cell_is_grey():
    figure = static.histograms_figure([("w", {0: None, 1: None}), ("b", {0: ([1, 2], [0.0, 0.5, 1.0])})],
                                      x_label="value")
    empty, drawn = figure.axes[:2]
    assert [text.get_text() for text in empty.texts] == ["no finite values to draw", "w"]
    assert [text.get_text() for text in drawn.texts] == ["b"] and len(drawn.patches) == 1  # rank 0's steps
    figure = static.heatmap_figure(["a", "b"], ["rank 0", "rank 1"], np.array([[1.0, math.nan], [0.5, 2.0]]),
                                   title="gradient norm", label="÷ median")
    heat, bar = figure.axes
    (image,) = heat.images
    assert image.get_array().mask.tolist() == [[False, True], [False, False]]
    assert image.cmap.get_bad().tolist() == [0.6196078431372549, 0.6196078431372549, 0.6196078431372549, 1.0]
    assert [text.get_text() for text in figure.texts] == ["gradient norm", "÷ median\n\ngrey: NaN"]
    assert len(bar.collections) + len(bar.images) + len(bar.patches) >= 1  # the colour bar is drawn
