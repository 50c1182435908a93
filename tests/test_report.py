"""mpinb.report() on the rank side: what it accepts, how it buffers, and what it does under plain mpiexec."""

import io
import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from mpinb.notebook.world.mpis import default_mpiexec
from mpinb.rank.report import AgentSink, Recorder, ScriptSink


@pytest.fixture
def recorder():
    wakeups = []
    recorder = Recorder()
    recorder.sink = AgentSink(notify=lambda: wakeups.append(1))
    recorder.wakeups = wakeups
    return recorder


def test_numbers_numpy_and_tensors_become_floats(recorder):
    recorder.report(None, None, {"a": 1, "b": np.float32(0.5), "c": np.int64(7), "d": torch.tensor(2.5),
                                 "e": torch.tensor([3.0], requires_grad=True), "f": True})
    ((run, step, when, values, _),) = recorder.sink.drain()
    assert (run, step) == ("main", 0)
    assert values == {"a": 1.0, "b": 0.5, "c": 7.0, "d": 2.5, "e": 3.0, "f": 1.0}
    assert all(type(v) is float for v in values.values())


def test_one_element_arrays_of_any_shape_become_floats(recorder):
    """As one-element torch tensors do: numpy refuses float() of an array with dimensions, report() does not."""
    recorder.report(None, None, {"a": np.array([0.5]), "b": np.array([[2]], dtype=np.int8), "c": np.array(1.5),
                                 "d": np.array([True]), "e": np.float16([0.25]), "f": torch.tensor([[3.0]])})
    ((_, _, _, values, _),) = recorder.sink.drain()
    assert values == {"a": 0.5, "b": 2.0, "c": 1.5, "d": 1.0, "e": 0.25, "f": 3.0}
    assert all(type(v) is float for v in values.values())


def test_steps_count_per_run_and_runs_are_sticky(recorder):
    for _ in range(3):
        recorder.report(None, None, {"loss": 1.0})
    recorder.report(10, None, {"loss": 1.0})
    recorder.report(None, None, {"loss": 1.0})
    recorder.report(None, "b", {"loss": 1.0})
    recorder.report(None, None, {"loss": 1.0})
    recorder.report(np.int64(7), "main", {"loss": 1.0})
    assert [(run, step) for run, step, *_ in recorder.sink.drain()] == [
        ("main", 0), ("main", 1), ("main", 2), ("main", 10), ("main", 11), ("b", 0), ("b", 1), ("main", 7)]


def test_the_agent_is_woken_once_per_batch_not_per_call(recorder):
    for step in range(1000):
        recorder.report(step, None, {"loss": step})
    assert len(recorder.wakeups) == 1
    assert len(recorder.sink.drain()) == 1000
    recorder.report(None, None, {"loss": 0})
    assert len(recorder.wakeups) == 2


@pytest.mark.parametrize("call, message", [
    (dict(step=None, run=None, metrics={}), "needs at least one metric"),
    (dict(step=1.5, run=None, metrics={"x": 1}), "step=...) takes an integer, not float"),
    (dict(step=None, run="", metrics={"x": 1}), "run=...) takes a non-empty name"),
    (dict(step=None, run=None, metrics={"x": "high"}), "x=...) takes a number (int, float, numpy scalar"),
    (dict(step=None, run=None, metrics={"g": torch.ones(3)}), "not a tensor of shape (3,); reduce it first"),
    (dict(step=None, run=None, metrics={"g": np.ones((2, 2))}), "not an array of shape (2, 2); reduce it first"),
    (dict(step=None, run=None, metrics={"s": np.array(["x"])}), "s=...) takes a number (int, float, numpy scalar"),
])
def test_bad_input_says_what_to_do(recorder, call, message):
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        recorder.report(call["step"], call["run"], call["metrics"])
    assert recorder.sink.drain() == []


def test_script_sink_summarises_on_rank_0_and_warns_on_nan(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    sink = ScriptSink(rank=0, every=1e-9, path=str(tmp_path / "m-{rank}.jsonl"), stdout=out, stderr=err)
    recorder = Recorder()
    recorder.sink = sink
    for step in range(3):
        recorder.report(None, None, {"loss": 1.0 / (step + 1)})
    recorder.report(None, None, {"loss": math.nan})
    sink.close()
    assert "[mpinb] rank 0 step 2: loss=0.3333" in out.getvalue()
    assert err.getvalue() == "[mpinb] rank 0: loss became NaN at step 3\n"
    lines = [json.loads(line) for line in (tmp_path / "m-0.jsonl").read_text().splitlines()]
    assert [(d["rank"], d["run"], d["step"]) for d in lines] == [(0, "main", s) for s in range(4)]
    assert lines[0]["loss"] == 1.0 and math.isnan(lines[3]["loss"])


def test_other_ranks_print_no_summary():
    out = io.StringIO()
    sink = ScriptSink(rank=1, every=1e-9, path="", stdout=out, stderr=io.StringIO())
    sink.put(("main", 0, 0.0, {"loss": 1.0}))
    sink.close()
    assert out.getvalue() == ""


@pytest.mark.mpi
def test_under_plain_mpiexec_without_a_notebook(tmp_path):
    """A training script exported from a notebook: report() works with no IPython, no agent, no widgets."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys
        import mpinb
        from mpi4py import MPI
        rank = MPI.COMM_WORLD.rank
        for step in range(50):
            mpinb.report(loss=100.0 * rank + step)
        if rank == 1:
            mpinb.report(loss=float("inf"))
        assert "IPython" not in sys.modules and "ipywidgets" not in sys.modules
    """))
    env = dict(os.environ, MPINB_METRICS_FILE=str(tmp_path / "metrics-{rank}.jsonl"), MPINB_REPORT_EVERY="60")
    done = subprocess.run([default_mpiexec(), "-n", "2", sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()  # once, at exit: the period is 60 s
    assert line.startswith("[mpinb] rank 0 step 49: loss=49 (") and line.endswith(" steps/s)")
    assert "[mpinb] rank 1: loss became inf at step 50" in done.stderr
    import mpinb

    frame = mpinb.read_metrics(str(tmp_path / "metrics-*.jsonl"))
    assert frame.groupby("rank").size().to_dict() == {0: 50, 1: 51}
    assert frame[frame["rank"] == 1].value.iloc[:50].tolist() == [100.0 + s for s in range(50)]


def test_under_torchrun_each_worker_reports_as_its_own_rank(tmp_path):
    """A script launched by ``torchrun`` (no MPI launcher, mpi4py not loaded): each worker is the rank torchrun
    says in ``RANK``; only rank 0 prints the summary, and each writes its own metrics file."""
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import os
        import sys
        import mpinb
        rank = int(os.environ["RANK"])
        for step in range(10):
            mpinb.report(loss=100.0 * rank + step)
        assert "mpi4py" not in sys.modules
    """))
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PMI_", "OMPI_", "PMIX_", "SLURM_", "MPINB_", "RANK", "WORLD_SIZE", "LOCAL_",
                                   "GROUP_", "ROLE_", "MASTER_", "TORCHELASTIC_"))}
    env.update(MPINB_METRICS_FILE=str(tmp_path / "metrics-{rank}.jsonl"), MPINB_REPORT_EVERY="60")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summaries = [line for line in done.stdout.splitlines() if line.startswith("[mpinb] rank")]
    assert len(summaries) == 1 and summaries[0].startswith("[mpinb] rank 0 step 9: loss=9 ("), done.stdout
    import mpinb

    frame = mpinb.read_metrics(str(tmp_path / "metrics-*.jsonl"))
    assert frame.groupby("rank").size().to_dict() == {0: 10, 1: 10}
    assert frame[frame["rank"] == 1].value.tolist() == [100.0 + s for s in range(10)]
