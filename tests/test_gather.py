"""%%mpi --gather on real worlds: every kind of value, every transport, bad input, and the inspectors' verdicts."""

import collections
import glob

import numpy as np
import pytest
import torch
from IPython.core.error import UsageError

from mpinb.errors import GatherError, RankError
from mpinb.perrank import PerRank
from mpinb.widgets.grads import grads_widget
from mpinb.widgets.inspector import inspect_gathered, inspector_widget

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]

VALUES = """
import collections
import numpy as np
import torch

class ArrayLike:  # what pandas, xarray and friends look like from here
    def __init__(self, data):
        self.data = data
    def __array__(self, dtype=None, copy=None):
        return self.data

class DLPackOnly:  # what JAX, CuPy and TF arrays look like from here
    def __init__(self, data):
        self.data = data
    def __dlpack__(self, **kwargs):
        return self.data.__dlpack__(**kwargs)
    def __dlpack_device__(self):
        return self.data.__dlpack_device__()

a = np.arange(12, dtype=np.float64).reshape(3, 4) * (rank + 1)
t = torch.arange(6, dtype=torch.float32) - rank
half = torch.full((2, 2), rank + 0.5, dtype=torch.bfloat16)
ints = torch.arange(5) * rank
n = rank * 7
state = collections.OrderedDict(w=torch.eye(2) * rank, b=torch.zeros(2))
nested = {"x": [1, (2.5, "three", np.int64(rank))], "y": {"z": np.ones(3, dtype=np.float32) * rank}}
like = ArrayLike(np.full(4, rank, dtype=np.int32))
dl = DLPackOnly(np.arange(3, dtype=np.float32) + rank)
"""
NAMES = "a t half ints n state nested like dl"


def expected(rank):
    """What each rank computed, rebuilt here."""
    return {
        "a": np.arange(12, dtype=np.float64).reshape(3, 4) * (rank + 1),
        "t": torch.arange(6, dtype=torch.float32) - rank,
        "half": torch.full((2, 2), rank + 0.5, dtype=torch.bfloat16),
        "ints": torch.arange(5) * rank,
        "n": rank * 7,
        "state": collections.OrderedDict(w=torch.eye(2) * rank, b=torch.zeros(2)),
        "nested": {"x": [1, (2.5, "three", rank)], "y": {"z": np.ones(3, dtype=np.float32) * rank}},
        "like": np.full(4, rank, dtype=np.int32),
        "dl": np.arange(3, dtype=np.float32) + rank,
    }


def assert_same(got, want):
    if isinstance(want, dict):
        assert type(got) is type(want) and list(got) == list(want)
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and np.array_equal(got, want)
    else:
        assert got == want


@pytest.fixture
def transport(magics, monkeypatch):
    return lambda name: monkeypatch.setattr(magics, "gather_transport", name)


@pytest.mark.parametrize("how", ["shm", "frames", "mpi"])
def test_every_kind_of_value_arrives_as_each_rank_computed_it(how, world_of, ip, mpi, transport, capsys):
    world_of(2)
    transport(how)
    mpi(VALUES, line=f"--gather {NAMES} --no-inspect")
    for name in NAMES.split():
        gathered = ip.user_ns[name]
        assert isinstance(gathered, PerRank) and len(gathered) == 2
        for rank in (0, 1):
            assert_same(gathered[rank], expected(rank)[name])
    ip.user_ns["t"][1] += 1  # values are writable and owned by the notebook
    assert ip.user_ns["t"][1][0] == 0.0
    assert ip.user_ns["a"].stack().shape == (2, 3, 4)
    stacked = ip.user_ns["state"].stack()
    assert stacked["w"].shape == (2, 2, 2) and isinstance(stacked["w"], torch.Tensor)


def test_shared_memory_is_reused_grown_and_never_left_behind(world_of, ip, magics, mpi, transport):
    world_of(2)
    transport("shm")
    for elements in (10, 3_000_000, 1000, 5_000_000):
        mpi(f"import torch\nbig = torch.arange({elements}, dtype=torch.float32) * (rank + 1)",
            line="--gather big --no-inspect")
        for rank in (0, 1):
            assert torch.equal(ip.user_ns["big"][rank], torch.arange(elements, dtype=torch.float32) * (rank + 1))
    pids = [who["pid"] for who in magics.world.identities.values()]
    assert not [path for pid in pids for path in glob.glob(f"/dev/shm/mpinb-{pid}-*")]  # unlinked once opened


def test_a_name_missing_on_some_ranks_names_them_and_keeps_the_rest(world_of, ip, mpi, capsys):
    world_of(4)
    with pytest.raises(GatherError) as raised:
        mpi("if rank in (0, 2):\n    only_some = rank * 100\nok = rank", line="--gather only_some ok")
    message = str(raised.value)
    assert "--gather only_some: ranks 1, 3: NameError: name 'only_some' is not defined on this rank" in message
    assert "only_some holds the values of ranks 0, 2" in message
    assert dict(ip.user_ns["only_some"]) == {0: 0, 2: 200}
    assert dict(ip.user_ns["ok"]) == {0: 0, 1: 1, 2: 2, 3: 3}


def test_something_that_cannot_travel_names_its_type_and_rank(world_of, ip, mpi):
    world_of(2)
    with pytest.raises(GatherError, match=r"rank 1: lock: cannot transfer a _thread.lock .*gather the numbers"):
        mpi("import threading\nlock = threading.Lock() if rank == 1 else 'fine'", line="--gather lock")
    assert ip.user_ns["lock"] == {0: "fine"}
    assert mpi("rank") == {0: 0, 1: 1}  # the world is still usable


def test_a_failing_cell_still_gathers_what_exists_and_raises_the_cell_error(world_of, ip, mpi):
    world_of(2)
    with pytest.raises(RankError, match="rank 1: ZeroDivisionError"):
        mpi("before = rank + 0.5\nif rank == 1:\n    1 / 0", line="--gather before")
    assert dict(ip.user_ns["before"]) == {0: 0.5, 1: 1.5}


def test_gather_takes_names_only(world_of, mpi):
    world_of(2)
    with pytest.raises(UsageError, match="--gather takes variable names, not 'x.y'"):
        mpi("pass", line="--gather x.y")


PLANTED = """
import torch
same = torch.linspace(-1, 1, 1000)
perturbed = torch.linspace(-1, 1, 1000)
if rank in (1, 3):
    perturbed[10] += 1e-3
nan = torch.ones(50)
if rank == 2:
    nan[7] = float("nan")
"""


def test_inspector_verdicts_on_planted_cases(world_of, magics, mpi, capsys):
    world_of(4)
    mpi(PLANTED, line="--gather same perturbed nan")
    text = capsys.readouterr().out
    assert "same: identical on all ranks" in text
    assert "perturbed: differs on ranks 1, 3 (max |Δ| 0.001)" in text
    assert "nan: differs on rank 2 (max |Δ| nan); NaN/Inf on rank 2" in text
    result = magics.last
    reports = {r.label: r for r in inspect_gathered(result.gathered, result.gather_stats)}
    assert reports["same"].identical and reports["perturbed"].differing == [1, 3]
    assert reports["perturbed"].diff[1] == pytest.approx(1e-3, rel=1e-3) and reports["perturbed"].diff[2] == 0.0
    assert reports["nan"].stats[2]["nan"] == 1 and reports["nan"].stats[0]["nan"] == 0
    stats = reports["same"].stats[0]
    assert stats["shape"] == (1000,) and stats["dtype"] == "float32" and stats["device"] == "cpu"
    assert stats["min"] == -1.0 and stats["max"] == 1.0 and abs(stats["mean"]) < 1e-6
    assert stats["norm"] == pytest.approx(float(torch.linspace(-1, 1, 1000).norm()), rel=1e-6)
    assert sum(stats["histogram"][0]) == 1000
    widget = inspector_widget(list(reports.values()))
    assert [label for label, _ in widget.chooser.options] == ["same", "perturbed", "nan"]
    widget.chooser.value = 1
    assert "background:#fdecea" in widget.table.value  # the differing ranks are highlighted
    assert sorted(mark.labels[0] for mark in widget.histogram.marks) == [f"rank {r}" for r in range(4)]


TRAINING = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
torch.manual_seed(100 + rank)  # every rank its own data
loss = model(torch.randn(32, 6)).pow(2).mean()
loss.backward()
for name, p in model.named_parameters():
    grad = p.grad.numpy()
    if rank == 2 and name == "2.weight":
        grad = grad.copy()  # the planted bug: this rank's allreduce result lands in a copy and is lost
    comm.Allreduce(MPI.IN_PLACE, grad)
    p.grad /= size
"""


def test_gradient_view_finds_the_rank_that_skipped_the_allreduce(world_of, ip, magics, mpi, capsys):
    world_of(4)
    mpi(TRAINING)
    capsys.readouterr()
    reports = {r.layer: r for r in magics.show_grads("model")}
    text = capsys.readouterr().out
    assert text.startswith("ranks disagree on 1 of 4 layers: 2.weight")
    assert reports["2.weight"].grad_ranks == [2] and reports["2.weight"].param_ranks == []
    assert reports["2.weight"].flags == ["gradients differ on rank 2: a rank skipped the allreduce?"]
    assert all(not reports[layer].flags for layer in ("0.weight", "0.bias", "2.bias"))
    norms = reports["0.weight"].grad_norm
    assert len(set(norms.values())) == 1 and set(norms) == {0, 1, 2, 3}
    widget = grads_widget(list(reports.values()))
    assert widget.chooser.value == "2.weight"  # the flagged layer is shown first
    assert len(widget.histogram.marks) == 4 and widget.heatmap.marks[0].color.shape == (4, 4)
    mpi("for p in model.parameters():\n    comm.Allreduce(MPI.IN_PLACE, p.grad.numpy())")  # the fix
    capsys.readouterr()
    ip.run_line_magic("mpi", "grads model")
    assert capsys.readouterr().out.startswith("all 4 ranks agree on every layer's weights and gradients")


def test_gradient_view_flags_different_seeds_and_batchnorm_buffers(world_of, magics, mpi, capsys):
    world_of(2)
    mpi("""
import torch
torch.manual_seed(rank)  # the bug: seeds differ, so do the initial weights
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
model(torch.randn(8, 3)).sum().backward()
""")
    reports = {r.layer: r for r in magics.show_grads("model")}
    assert reports["0.weight"].flags[0].startswith("weights differ on rank 1: different initial seeds")
    assert reports["1.running_mean"].flags == [
        "buffer differs on rank 1: unsynchronised BatchNorm statistics?"]


def test_gradient_view_of_a_missing_model_names_the_ranks(world_of, ip, mpi):
    world_of(2)
    mpi("import torch\nif rank == 0:\n    net = torch.nn.Linear(2, 2)")
    with pytest.raises(RankError, match="rank 1: name 'net' is not defined"):
        ip.run_line_magic("mpi", "grads net")
    mpi("notamodel = 3")
    with pytest.raises(RankError, match=r"ranks 0-1: ValueError: ranks 0-1: notamodel is a int, not a torch.nn"):
        ip.run_line_magic("mpi", "grads notamodel")
    with pytest.raises(UsageError, match="takes the model's name"):
        ip.run_line_magic("mpi", "grads model()")
