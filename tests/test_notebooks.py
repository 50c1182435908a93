"""The tutorials, executed top to bottom in a real Jupyter kernel; each test checks the notebook's own results
(they also assert what they teach inside the notebook) and that its world left no process behind."""

import base64
import re
import time

import nbformat
import numpy as np
import pytest
from conftest import leftover_ranks, new_world_tag, text_of
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from tutorial_notebooks import NOTEBOOKS

TUTORIALS = sorted(path.name for path in NOTEBOOKS.glob("0[1-8]_*.ipynb"))


def runs_a_kernel(test):
    """The marks of a test that executes a notebook: a real kernel and a real world."""
    for mark in (pytest.mark.notebook, pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(300)):
        test = mark(test)
    return test


class ReaderClient(NotebookClient):
    """Runs a tutorial top to bottom, and each exercise's check once more just before its folded solution, as a
    reader who left the exercise undone would run it (``probes``: marker → that run of the check cell)."""

    def __init__(self, notebook, markers, **options):
        super().__init__(notebook, **options)
        self.markers, self.probes = markers, {}

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        if "solution" in cell.metadata.get("tags", []):
            check = next((later for later in self.nb.cells[cell_index + 1:]
                          if any(marker in later.source for marker in self.markers)), None)
            marker = check and next(marker for marker in self.markers if marker in check.source)
            if check is not None and marker not in self.probes:
                probe = nbformat.v4.new_code_cell(check.source, metadata={"tags": ["raises-exception"]})
                # run as a cell of its own at the end, for the time it runs: updates of what it displays (found
                # by cell index) must not land in another cell's outputs
                self.nb.cells.append(probe)
                try:
                    await super().async_execute_cell(probe, len(self.nb.cells) - 1, store_history=False)
                finally:
                    self.nb.cells.pop()
                    for places in self._display_id_map.values():
                        places.pop(len(self.nb.cells), None)
                self.probes[marker] = probe
        return await super().async_execute_cell(cell, cell_index, execution_count, store_history)


def execute(name):
    """*name* run top to bottom in a real kernel; each exercise's check, run before its solution, must fail and
    say what is wrong (``EXERCISES``); no rank may be left behind."""
    started, tag = time.time(), new_world_tag()
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    resources = {"metadata": {"path": str(NOTEBOOKS)}}
    exercises = dict(EXERCISES[name])
    client = ReaderClient(notebook, exercises, timeout=120, kernel_name="python3", resources=resources)
    try:
        client.execute()
    except CellExecutionError as failed:  # what the cells before it said: a rank's death is told where it happened
        earlier = [text_of(cell) for cell in notebook.cells if cell.cell_type == "code" and cell.get("outputs")]
        raise AssertionError(f"{name} stopped at a cell; the outputs before it:\n" + "\n---\n".join(earlier[-3:])) \
            from failed
    print(f"{name} ran in {time.time() - started:.1f} s")
    assert not leftover_ranks(tag)
    assert sorted(client.probes) == sorted(exercises), f"no solution before the checks of {name}"
    for marker, said in exercises.items():
        text = text_of(client.probes[marker])
        assert "AssertionError" in text and said in text, text
    return notebook


def outputs(notebook):
    """The text of every code cell, in order (markdown cells left out)."""
    return [text_of(cell) for cell in notebook.cells if cell.cell_type == "code"]


def widget_text(notebook):
    """Every string value in the saved widget state (what the widgets show), tags stripped."""
    state = notebook.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    values = [model["state"].get("value") for model in state.values()]
    return "\n".join(re.sub(r"<[^>]+>", " ", value) for value in values if isinstance(value, str))


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


def assert_static(notebook):
    """No output refers to a widget model (a reopened notebook would say "model not found" there); the charts
    of every cell that reported metrics are in its output as an image."""
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            assert "application/vnd.jupyter.widget-view+json" not in output.get("data", {}), cell.source[:80]
        if "mpinb.report(" in cell.source and cell.source.startswith("%%mpi"):
            assert any("image/png" in o.get("data", {}) for o in cell.outputs), cell.source[:80]


@runs_a_kernel
def test_quickstart():
    notebook = execute("00_quickstart.ipynb")
    cells = [c for c in notebook.cells if c.cell_type == "code" and "solution" not in c.metadata.get("tags", [])]
    figure, _, *cells = cells  # the figure, then %load_ext
    assert any("image/png" in o.get("data", {}) for o in figure.outputs)  # the notebook, its ranks, their messages
    hello, persist, allreduce, failing, subset, training, frame, status, _, check, stop = (text_of(c) for c in cells)
    assert all(f"[rank {r}] mean_value = 5.0 on this rank, as on every other" in check for r in range(2))
    assert "[rank 0] hello from 0 of 2" in hello and "[rank 1] hello from 1 of 2" in hello
    assert "[rank 1] 11" in persist and "[rank 1] 10" in persist
    assert "[rank 0] 10\n[rank 1] 10" in allreduce
    assert "RankError" in failing and "rank 1: ValueError: rank 1 disagrees" in failing
    assert "rank 0: ZeroDivisionError: division by zero" in failing
    assert subset.strip() == "[rank 1] 10"
    assert "[rank 0] w=" in training and "[rank 1] w=" in training
    assert re.findall(r"^(\d)\s+150\s", frame, re.M) == ["0", "1"]  # every step of every rank in the DataFrame
    assert_curves_for_every_rank(notebook, ranks=2, points=150)
    status_outputs = next(c for c in cells if c.source == "%mpi status").outputs
    assert any("<table" in o.get("data", {}).get("text/html", "") for o in status_outputs)
    assert_static(notebook)
    assert "stopped" in stop


@runs_a_kernel
def test_01_mpi_basics():
    notebook = execute("01_mpi_basics.ipynb")
    cells = [text_of(cell) for cell in notebook.cells if cell.cell_type == "code" and not cell.source.startswith(
        "import matplotlib")]
    text = "\n".join(cells)
    assert all(f"[rank {r}] rank {r} of 4" in cells[1] for r in range(4))
    assert "[rank 1] received {'step': 1, 'params': ['w', 'b']}" in cells[2]
    assert "[rank 1] received tensor([0., 1., 2., 3.])" in cells[3]
    assert "[rank 0] {'lr': 0.1, 'seed': 42} 10 ['r0', 'r1', 'r2', 'r3'] [0, 1, 4, 9]" in cells[4]
    assert "[rank 3] [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [3.0, 3.0, 3.0]] [6.0, 6.0, 6.0]" in cells[5]
    figure = next(cell for cell in notebook.cells if cell.source.startswith("import matplotlib"))
    assert any("image/png" in o.get("data", {}) for o in figure.outputs)  # what each collective does
    assert all(f"[rank {r}] my_bcast is right on this rank, from every root" in cells[-2] for r in range(4))
    rows = re.findall(r"^(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", cells[9], re.M)
    assert [int(row[0]) for row in rows] == [8, 1024, 65536, 1 << 20, 16 << 20]  # every size, both calls timed
    assert "stopped" in text


@runs_a_kernel
def test_02_ring_allreduce():
    notebook = execute("02_collectives_and_ring_allreduce.ipynb")
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    cells = [text_of(cell) for cell in code]
    assert any(all(f"[rank {r}] ring_allreduce matches MPI.Allreduce" in t for r in range(4)) for t in cells)
    table = next(t for t in cells if "ring / bound" in t)
    rows = re.findall(r"^(\d+\.\d+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)", table, re.M)
    assert [float(row[0]) for row in rows] == [0.0625, 1.0, 8.0, 32.0]
    assert all(float(value) > 0 for row in rows for value in row[1:])
    figures = [cell for cell in code if any("image/png" in o.get("data", {}) for o in cell.outputs)]
    assert len(figures) == 1  # the measured times against the bound (the ring's steps are a drawing)
    assert all(f"[rank {r}] ring_allgather is right on this rank" in cells[-2] for r in range(4))
    assert "solution" in code[-3].metadata.tags and "hide-cell" in code[-3].metadata.tags
    assert "stopped" in cells[-1]


EXERCISES = {  # tutorial -> [(a line of its check cell, what the check says when the exercise is left undone)]
    "00_quickstart.ipynb": [("everyone = comm.allgather(mean_value)",
                             "the ranks hold [0, 10]; comm.allreduce(value) sums value over all ranks")],
    "01_mpi_basics.ipynb": [("got = my_bcast(",
                             "with root 0, rank 1 holds [1.0, 1.0, 1.0] instead of the root's [0.0, 0.0, 0.0]")],
    "02_collectives_and_ring_allreduce.ipynb": [("piece = 10.0 * rank", "are wrong on rank 0: rank 1's block is")],
    "05_communication_cost.ipynb": [("cases = [", "is each bucket's start the later of its last gradient and the "
                                                  "previous allreduce's end?")],
    "03_data_parallel_training.ipynb": [("own = gradients(model)", "they are this rank's own gradients: nothing was "
                                                                   "exchanged with the other ranks")],
    "04_debugging.ipynb": [("update = sgd_step(w, comm) - w",
                            "the update is 2.0x the single-process one on rank 0: were the gradients summed but not "
                            "averaged?"),
                           ("if straggler != culprit:",  # the straggler %mpi inject planted
                            "straggler and waited_ms are still None: read the summary")],
    "06_model_and_hybrid_parallel.ipynb": [("got = {\"data\": data.allgather(rank)",
                                            "rank 0's data communicator holds ranks [0, 1, 2, 3]; it should hold the "
                                            "ranks with the same stage: [0, 2]")],
    "07_debugging_ddp.ipynb": [("average_batchnorm_statistics(bn)",
                                "running_var on rank 0 is still this rank's own, not the mean over the ranks")],
    "08_bring_your_own_script.ipynb": [("for n, world_size in [",
                                        "with 17 batches on 2 ranks, no rank gets batch 16: keep every batch")],
}


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")


@pytest.mark.parametrize("name", TUTORIALS)
def test_a_tutorial_explains_itself_and_ends_with_a_checked_exercise(name):
    """Read, not run: each of 01-08 has at least 5,000 characters of explanation, ends with an exercise whose check
    cell raises what is wrong (``execute`` runs it left undone), is saved without outputs, and every image it
    shows exists beside it."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    markdown = [cell.source for cell in notebook.cells if cell.cell_type == "markdown"]
    assert sum(map(len, markdown)) >= 5000, f"{name} explains in {sum(map(len, markdown))} characters of markdown"
    headings = [(i, line) for i, cell in enumerate(notebook.cells) if cell.cell_type == "markdown"
                for line in cell.source.splitlines() if line.startswith("## ")]
    last, heading = headings[-1]
    assert heading.startswith("## Exercise"), f"{name} ends with {heading!r}"
    after = [cell for cell in notebook.cells[last + 1:] if cell.cell_type == "code"]
    assert any("solution" in cell.metadata.get("tags", []) for cell in after)  # folded, run top to bottom
    checks = [cell for cell in after if "raise AssertionError(" in cell.source]
    assert checks and any(marker in check.source for check in checks for marker, _ in EXERCISES[name])
    assert not [cell.source[:40] for cell in notebook.cells if cell.get("outputs")]
    for image in IMAGE.findall("\n".join(markdown)):
        # JupyterLab (make lab opens notebooks/) serves nothing above the folder it opens: a drawing above it is
        # a broken image and a 404 in the console
        assert not image.startswith(("../", "/")) and "://" not in image, image
        assert (NOTEBOOKS / image).is_file(), image


@runs_a_kernel
def test_03_data_parallel_training():
    notebook = execute("03_data_parallel_training.ipynb")
    code = [c for c in notebook.cells if c.cell_type == "code"]
    figure = next(c for c in code if c.source.startswith("import matplotlib"))
    assert any("image/png" in o.get("data", {}) for o in figure.outputs)  # what each rank holds, one step
    assert "hide-input" in figure.metadata.tags

    def cell(key):
        return text_of(next(c for c in code if key in c.source and "solution" not in c.metadata.get("tags", [])))

    differences = re.findall(r"^(.+), rank (\d): largest \|weight - single process\| = (\S+)$",
                             cell("def largest_difference"), re.M)
    assert len(differences) == 4 and all(float(d) < 1e-5 for *_, d in differences)
    trained = "\n".join(cell(key) for key in ["mt.allreduce_gradients(model)", "DistributedDataParallel(", "alone ="])
    accuracies = re.findall(r"test accuracy (0\.\d+)", trained)
    assert len(accuracies) == 5 and len(set(accuracies)) == 1  # 2 methods × 2 ranks, and one process: one model
    assert_curves_for_every_rank(notebook, ranks=2, points=256)
    assert_static(notebook)
    assert re.findall(r"^(?:DDP|allreduce_gradients)?\s+(\d)\s+[\d.]+\s+[\d.]+\s+256$", cell("mpinb.metrics()"),
                      re.M) == ["0", "1", "0", "1"]
    solution = next(c for c in code if "solution" in c.metadata.get("tags", []))
    assert "hide-cell" in solution.metadata.tags and solution.source.splitlines()[1] == "# Solution"
    check = cell("own = gradients(model)")
    assert all(f"[rank {r}] average_gradients gives the whole batch's gradient on this rank" in check
               for r in range(2))
    assert "stopped" in text_of(code[-1])


@runs_a_kernel
def test_04_debugging():
    notebook = execute("04_debugging.ipynb")
    code = [c for c in notebook.cells if c.cell_type == "code" and "solution" not in c.metadata.get("tags", [])]
    figure = next(c for c in code if c.source.startswith("import matplotlib"))
    assert any("image/png" in o.get("data", {}) for o in figure.outputs)  # the deadlock's wait-for cycle
    cell = {key: text_of(next(c for c in code if key in c.source)) for key in [
        'same_losses("same data"))', 'same_losses("sampler"))', "%%mpi --timeout 3", "comm.sendrecv(",
        "ctypes.string_at(0)", "comm.allreduce(1)", "update = sgd_step(w, comm) - w", "%%capture",
        "%%mpi --trace", "if straggler != culprit:", "%mpi inject clear", "%mpi stop"]}
    widgets = "\n".join(outputs(notebook))  # %mpi grads' static rendering, as the saved notebook keeps it
    assert_static(notebook)
    assert "gradients differ on rank 1: a rank skipped the allreduce?" in widgets
    assert "weights differ on rank 1: different initial seeds, no broadcast from rank 0, or steps taken" in widgets
    assert "all 2 ranks agree on every layer" in widgets
    assert "every rank saw the same batches: True" in cell['same_losses("same data"))']
    assert "every rank saw the same batches: False" in cell['same_losses("sampler"))']
    deadlock = cell["%%mpi --timeout 3"]
    assert "ranks 0-1: Timeout: still running after 3 s, blocked in theirs = comm.recv(source=other) at cell line 3" \
        in deadlock and "ranks 0-1 left recv on COMM_WORLD" in deadlock and "variables are kept" in deadlock
    assert "[rank 0] hello from 1 | still here: Sequential (2048, 16)" in cell["comm.sendrecv("]  # the world was kept
    assert "[rank 1] hello from 0" in cell["comm.sendrecv("]
    crash = cell["ctypes.string_at(0)"]
    assert re.search(r"rank 1: RankLost: rank 1 died: signal 11 \(SIGSEGV\) in string_at \(__init__\.py:\d+\), "
                     r"called at cell line 4: ctypes\.string_at\(0\)", crash)
    # the other rank is named either way: ended by mpiexec, or found still running (which comes first is a race)
    assert re.search(r"rank 0: RankLost: (rank 0 was ended by mpiexec after|still running when) rank 1 died", crash)
    assert cell["comm.allreduce(1)"] == "[rank 0] 2\n[rank 1] 2" and "stopped" in cell["%mpi stop"]
    assert all(f"[rank {r}] the update matches one process on the whole batch, on this rank"
               in cell["update = sgd_step(w, comm) - w"] for r in range(2))
    solution = next(c for c in notebook.cells if "solution" in c.metadata.get("tags", []))
    assert "hide-cell" in solution.metadata.tags and solution.source.startswith("%%mpi\n# Solution")
    # the straggler %mpi inject planted, found in the trace's summary and by the folded solution
    assert cell["%%capture"] == ""  # what was planted where stays hidden
    planted = re.search(r"rank (\d) arrived last at \d+ of 20 Allreduce calls; the other ranks waited ([\d.]+) ms "
                        r"per call for it", cell["%%mpi --trace"])  # at all 20 unless the machine stalls the other
    assert planted, cell["%%mpi --trace"]
    answer = re.search(r"right: rank (\d) slept (\d+) ms before each collective", cell["if straggler != culprit:"])
    assert answer and answer[1] == planted[1] and 0.5 <= float(planted[2]) / float(answer[2]) <= 2
    assert "removed 1 fault: the ranks run as written" in cell["%mpi inject clear"]


@runs_a_kernel
def test_05_communication_cost():
    notebook = execute("05_communication_cost.ipynb")
    cell = {key: text_of(next(c for c in notebook.cells if c.cell_type == "code" and key in c.source)) for key in [
        "table[\"communication share\"]", "alpha, bandwidth, gradient_bytes", "compression[r] for r",
        "table[\"saved\"]", "table[\"efficiency\"]", "needed = {}", "Get_library_version", "cases = [", "%mpi stop"]}
    assert len(re.findall(r"^(\d)\s+[\d.]+\s+[\d.]+\s+(0\.\d+)$", cell["table[\"communication share\"]"], re.M)) == 2
    link = cell["alpha, bandwidth, gradient_bytes"]
    assert re.search(r"latency [\d.]+ µs, bandwidth [\d.]+ GB/s between ranks 0 and 1", link)
    error = re.findall(r"^\d\s+[\d.]+\s+[\d.]+\s+([\d.e-]+)$", cell["compression[r] for r"], re.M)
    assert len(error) == 2 and all(float(e) < 2e-3 for e in error)  # fp16 keeps about 3 digits
    assert len(re.findall(r"^\d\s+[\d.]+\s+[\d.]+\s+-?[\d.]+$", cell["table[\"saved\"]"], re.M)) == 2
    scaling = re.findall(r"^(\d)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", cell["table[\"efficiency\"]"], re.M)
    # one rank's speed-up and efficiency are 1 (pandas shows "1.00" where every value of a column rounds to two
    # decimals)
    assert [row[0] for row in scaling] == ["1", "2", "4"] and [float(value) for value in scaling[0][2:]] == [1.0, 1.0]
    figures = [c for c in notebook.cells if any("image/png" in o.get("data", {}) for o in c.get("outputs", []))]
    assert any("calls = mpinb.trace()" in c.source for c in figures)  # one step of each rank, from the trace
    assert any("needed = {}" in c.source for c in figures)  # speed-up on 8 ranks against the link
    assert "GB/s a link needs for 7x on 8 ranks: as here, fp32: " in cell["needed = {}"]
    assert re.search(r"^IB HDR\s+as here\s+[\d.]+\s+[\d.]+\s+[\d.]+$", cell["needed = {}"], re.M)
    assert "MPICH" in cell["Get_library_version"]
    assert all(f"[rank {r}] right: buckets of " in cell["cases = ["] for r in range(4))
    assert "stopped" in cell["%mpi stop"]


@runs_a_kernel
def test_06_model_and_hybrid_parallel():
    notebook = execute("06_model_and_hybrid_parallel.ipynb")
    code = [c for c in notebook.cells if c.cell_type == "code" and "solution" not in c.metadata.get("tags", [])]
    cell = {key: text_of(next(c for c in code if key in c.source)) for key in [
        "largest_difference(pipelined[stage], stage)", "for r in hybrid}", "pd.DataFrame(grid)", "got = {\"data\"",
        "%mpi stop"]}
    figures = [c for c in code if any("image/png" in o.get("data", {}) for o in c.outputs)]
    assert any("FancyBboxPatch" in c.source for c in figures)  # who holds what, what travels: data, pipeline, hybrid
    assert any("idle_fraction(measured)" in c.source for c in figures)  # the pipeline's schedule, counted and measured
    pipeline = re.findall(r"largest \|weight - single process\| = (\S+)",
                          cell["largest_difference(pipelined[stage], stage)"])
    hybrid = re.findall(r"^rank (\d) \(replica (\d), stage (\d)\): largest \|weight - single process\| = (\S+)$",
                        cell["for r in hybrid}"], re.M)
    assert len(pipeline) == 2 and all(float(d) < 1e-5 for d in pipeline)
    assert [row[:3] for row in hybrid] == [("0", "0", "0"), ("1", "0", "1"), ("2", "1", "0"), ("3", "1", "1")]
    assert all(float(row[3]) < 1e-5 for row in hybrid)
    assert "[0, 2]" in cell["pd.DataFrame(grid)"] and "[1, 3]" in cell["pd.DataFrame(grid)"]
    assert all(f"[rank {r}] make_grid is right on this rank, for 1, 2 and 4 stages" in cell["got = {\"data\""]
               for r in range(4))
    assert "stopped" in cell["%mpi stop"]


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
MPINB_FRAME = re.compile(r"mpinb/(notebook|rank|wire)/")  # a traceback frame of mpinb's own code


def shown(cell):
    """All a cell showed, tracebacks included (``text_of`` keeps only an error's last line), colours removed."""
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.append(output.data.get("text/plain", ""))
        elif output.output_type == "error":
            parts.extend(output.traceback)
    return ANSI.sub("", "\n".join(parts))


@runs_a_kernel
def test_07_debugging_ddp_names_each_bug():
    """Each DDP bug the tutorial plants is named in its own cell's output (the ranks, the collective or the
    parameters, the fix), with no --timeout; each fix runs cleanly; no output shows a frame of
    mpinb's own code."""
    notebook = execute("07_debugging_ddp.ipynb")
    code = [c for c in notebook.cells if c.cell_type == "code" and "solution" not in c.metadata.get("tags", [])]
    for c in code:
        assert not [line for line in shown(c).splitlines() if MPINB_FRAME.search(line)], shown(c)
    failing = [c for c in code if "raises-exception" in c.metadata.get("tags", [])]
    assert len(failing) == 4  # uneven inputs, a rank-dependent branch, collective order, collective sizes
    for c in code:
        errors = [o for o in c.outputs if o.output_type == "error"]
        assert bool(errors) == (c in failing), (c.source[:60], shown(c))
    for c in failing:  # named by mpinb's ledger or the mpi4py backend's check, not by the backend's own timeout
        text = shown(c)
        assert "Timed out" not in text, text
        assert any(said in text for said in ("CollectiveMismatch", "got no gradient", "called different collectives"))

    def cell(key):
        return shown(next(c for c in code if key in c.source))

    figure = next(c for c in code if c.source.startswith("import matplotlib"))
    assert any("image/png" in o.get("data", {}) for o in figure.outputs) and "hide-input" in figure.metadata.tags
    assert "[rank 0] 6 batches on rank 0" in cell("%%mpi -n 2") and "[rank 1] 5 batches on rank 1" in cell("%%mpi -n 2")

    uneven = cell("%%mpi\nfor x in batches:\n    step(x)")
    assert "rank 0 in DDP all_reduce(5 x float32) at cell line 3" in uneven, uneven
    assert "rank 1 finished the cell without entering it" in uneven and "Likely uneven inputs" in uneven
    assert "model.join()" in uneven and "drop_last=True" in uneven
    assert "the world and every rank's variables are kept" in uneven and "Timed out" not in uneven
    joined = re.findall(r"^\[rank (\d)\] (\d) steps on rank \d, weight sum (\S+)$", cell("with model.join():"), re.M)
    assert sorted(joined)[0][:2] == ("0", "6") and sorted(joined)[1][:2] == ("1", "5")  # every batch trained
    assert len({weights for *_, weights in joined}) == 1  # the same weights on both ranks

    branch = cell("return self.a(x) if rank == 0 else self.b(x)")
    assert "parameters b.weight, b.bias of the DDP model got no gradient on rank 0" in branch, branch
    assert "parameters a.weight, a.bias of the DDP model got no gradient on rank 1" in branch
    assert "find_unused_parameters=True" in branch
    sums = re.findall(r"^\[rank \d\] (a\.weight\.grad sum .+)$", cell("find_unused_parameters=True)"), re.M)
    assert len(sums) == 2 and len(set(sums)) == 1

    drift = cell("loaded.module.load_state_dict(checkpoint)")
    assert "the parameters of `loaded` differ across ranks after this cell (bias, weight: rank 0; rank 1" in drift
    restored = cell("restored = DDP(linear)")
    assert "differ across ranks" not in restored
    assert restored.count("weight [[0.5, 0.5, 0.5, 0.5]] bias [0.0]") == 2  # rank 0's checkpoint on both ranks

    batchnorm = cell("normed = DDP(")
    assert "the BatchNorm statistics of `normed` differ across ranks (1.running_mean" in batchnorm, batchnorm
    assert "SyncBatchNorm.convert_sync_batchnorm" in batchnorm and "GroupNorm" in batchnorm
    grouped = cell("grouped = DDP(")
    assert "differ across ranks" not in grouped and grouped.count("buffers: []") == 2

    unshuffled = cell("sampler = DistributedSampler(data, shuffle=True)\nfor epoch in range(3):\n    print(")
    assert unshuffled.count("iterated again with epoch 0") == 2 and "sampler.set_epoch(epoch)" in unshuffled
    reshuffled = cell("sampler.set_epoch(epoch)\n")
    assert "iterated again" not in reshuffled
    for r in range(2):
        orders = re.findall(rf"^\[rank {r}\] epoch \d: (.+)$", reshuffled, re.M)
        assert len(orders) == 3 and len(set(orders)) == 3  # each epoch its own order

    # the default mpi4py backend names a mismatch on every rank before data moves: the world and its group stay
    order = cell("else:                                            # the bug: the other order on rank 1")
    assert "rank 0 in all_reduce(4 x float32" in order, order
    assert "rank 1 in broadcast(root=0, 4 x float32)" in order and "different order" in order
    assert "started again" not in order, order
    assert cell("# the same calls in the same order").count("tensor([2., 2., 2., 2.])") == 2

    sizes = cell("dist.all_reduce(torch.ones(4 if rank == 0 else 8))")
    assert "rank 0 in all_reduce(4 x float32" in sizes and "rank 1 in all_reduce(8 x float32" in sizes, sizes
    assert "different sizes or types" in sizes and "%mpi restart" not in sizes
    assert not [c for c in code if "%mpi restart" in c.source]
    assert cell("F.pad(mine").count("tensor([2., 2., 2., 2., 1., 1., 1., 1.])") == 2

    solution = next(c for c in notebook.cells if "solution" in c.metadata.get("tags", []))
    assert "hide-cell" in solution.metadata.tags and solution.source.startswith("%%mpi\n# Solution")
    check = cell("average_batchnorm_statistics(bn)")
    assert all(f"[rank {r}] every BatchNorm statistic is the mean over the ranks, on this rank" in check
               for r in range(2)), check
    assert "stopped" in shown(code[-1]) and code[-1].source == "%mpi stop"


@pytest.fixture(scope="module")
def bring_your_own_script():
    """Tutorial 08, run once for the tests that read it (the reader's script uses Lightning Fabric)."""
    pytest.importorskip("lightning.fabric", reason="make test installs lightning: pip install -e '.[frameworks]'")
    return execute("08_bring_your_own_script.ipynb")


@runs_a_kernel
def test_08_bring_your_own_script(bring_your_own_script):
    """The reader's own Fabric script, run with %mpi run: each rank's output of its arguments, the live loss
    chart, its globals kept (the model the same on both ranks), the uneven data named as such with the fixes, the
    fixed script training on both ranks in the same world, and the exercise's padding training every batch."""
    notebook = bring_your_own_script
    code = [c for c in notebook.cells if c.cell_type == "code" and "solution" not in c.metadata.get("tags", [])]
    for c in code:
        assert not [line for line in shown(c).splitlines() if MPINB_FRAME.search(line)], shown(c)
    failing = [c for c in code if "raises-exception" in c.metadata.get("tags", [])]
    assert [c.source for c in failing] == ["%mpi run train.py --epochs 2 --lr 0.05 --uneven"]  # the planted bug
    for c in code:
        errors = [o for o in c.outputs if o.output_type == "error"]
        assert bool(errors) == (c in failing), (c.source[:60], shown(c))

    def cell(key):
        return shown(next(c for c in code if key in c.source))

    runs = [c for c in code if c.source.startswith("%mpi run train.py")]
    assert len(runs) == 3 and all(any("image/png" in o.get("data", {}) for o in c.outputs) for c in runs)  # charts
    first, uneven, fixed = (shown(c) for c in runs)
    for r in range(2):
        assert f"[rank {r}] rank {r} of 2: Namespace(epochs=2, lr=0.05, batches=16, uneven=False)" in first, first
        assert f"[rank {r}] rank {r} of 2: Namespace(epochs=2, lr=0.05, batches=16, uneven=True)" in fixed, fixed
        for run in first, fixed:
            assert re.search(rf"^\[rank {r}\] 16 steps on rank {r}, last loss \d+\.\d+$", run, re.M), run
    assert "[rank 0] trained 2 epochs on 16 batches" in first and "[rank 1] trained" not in first  # fabric.print
    assert "[rank 0] trained 2 epochs on 17 batches" in fixed
    assert_curves_for_every_rank(notebook, ranks=2, points=16)
    assert_static(notebook)

    who = cell("%mpi who")  # the script's globals, kept on the ranks
    assert re.search(r"^model\s+all\s+_FabricModule\s.*161 parameters", who, re.M), who
    assert re.search(r"^args\s+all\s+Namespace", who, re.M) and re.search(r"^mine\s+0\s.*differs on rank 1", who, re.M)
    kept = cell("torch.equal(weights, everyone[0])")
    assert all(f"[rank {r}] 16 steps, 8 batches an epoch on rank {r}; the same weights as rank 0: True" in kept
               for r in range(2)), kept

    # named by mpinb's ledger within seconds, not by gloo's timeout or its closed connection
    assert re.search(r"collective #\d+ on torch:default: rank 0 in DDP all_reduce\(161 x float32\)", uneven), uneven
    assert "rank 1 finished the cell without entering it" in uneven
    assert "Likely uneven inputs: rank 1 ran out of batches first" in uneven
    assert "model.join()" in uneven and "drop_last=True" in uneven
    assert "the world and every rank's variables are kept" in uneven
    assert "Timed out" not in uneven and "Connection closed" not in uneven
    left = cell("{len(mine)} of them on rank {rank}")
    assert "[rank 0] 17 batches in the data set, 9 of them on rank 0, 16 steps taken" in left, left
    assert "[rank 1] 17 batches in the data set, 8 of them on rank 1, 16 steps taken" in left
    diff = cell("difflib.unified_diff")
    assert "-    return batches[rank::world_size]" in diff and "+    return batches[rank:usable:world_size]" in diff

    solution = next(c for c in notebook.cells if "solution" in c.metadata.get("tags", []))
    assert "hide-cell" in solution.metadata.tags and solution.source.startswith("%%mpi\n# Solution")
    check = cell("for n, world_size in [")
    assert all(f"[rank {r}] 9 batches on rank {r}, every one of the 17 trained on; the same weights as rank 0: "
               "True" in check for r in range(2)), check
    assert "stopped" in shown(code[-1]) and code[-1].source.startswith("%mpi stop")
    assert not (NOTEBOOKS / "train.py").exists()  # the script the notebook wrote is gone with it


@runs_a_kernel
def test_08_the_uneven_diagnosis_names_the_scripts_own_line(bring_your_own_script):
    """Every line number mpinb shows is the editor's: in a script run by %mpi run, a line of train.py."""
    uneven = shown(next(c for c in bring_your_own_script.cells
                        if "raises-exception" in c.metadata.get("tags", [])))
    assert "mpinb.rank.run_script" not in uneven and "at cell line 1" not in uneven, uneven
    assert "rank 0 in DDP all_reduce(161 x float32) at train.py line 45;" in uneven, uneven
    assert "called at train.py line 45: fabric.backward(loss)" in uneven, uneven  # the line as the editor numbers it
