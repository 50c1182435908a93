"""%%mpi --gather on real worlds: every kind of value, every transport, bad input, and the inspectors' verdicts."""

import collections
import glob

import numpy as np
import pytest
import torch
from IPython.core.error import UsageError

from mpinb.errors import GatherError, RankError
from mpinb.notebook.models.leaf_reports import inspect_gathered
from mpinb.notebook.cell.perrank import PerRank
from mpinb.widgets.grads import grads_widget
from mpinb.widgets.inspector import inspector_widget

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


KINDS = """
import warnings
import numpy as np
import torch
warnings.filterwarnings("ignore", "ComplexHalf support is experimental")

def psum(a):  # ipyparallel's MPI example
    locsum = np.sum(a)
    rcvBuf = np.array(0.0, 'd')
    comm.Allreduce([locsum, MPI.DOUBLE], [rcvBuf, MPI.DOUBLE], op=MPI.SUM)
    return rcvBuf

total = psum(np.arange(4.0) + rank)
grid = np.arange(20.0).reshape(4, 5) * (rank + 1)
kinds = {
    "f64 0-d": np.array(rank + 0.5),
    "i32 0-d": np.array(rank, dtype=np.int32),
    "bool 0-d": np.array(rank == 1),
    "c128 0-d": np.array(1 + 1j * rank),
    "datetime 0-d": np.array(rank, dtype="datetime64[s]"),
    "f32": np.arange(6, dtype=np.float32).reshape(2, 3) + rank,
    "f16": np.linspace(-1, 1, 7, dtype=np.float16) * (rank + 1),
    "f16 many": np.ones(70_000, dtype=np.float16),  # their norm, 264.6, overflows float16's sum of squares
    "u8": np.arange(5, dtype=np.uint8) + rank,
    "i64 3-d": np.arange(24, dtype=np.int64).reshape(2, 3, 4) - rank,
    "bool": np.array([True, False, rank == 1]),
    "c64": (np.arange(4) * (1 + 2j * rank)).astype(np.complex64),
    "datetime": np.array(["2024-01-01", "2024-06-30"], dtype="datetime64[D]") + rank,
    "timedelta": np.array([1, 2 + rank], dtype="timedelta64[ms]"),
    "unicode": np.array(["a", "bc" * (rank + 1)]),
    "bytes": np.array([b"x", b"yz"]),
    "structured": np.array([(rank, 2.5)], dtype=[("a", "i4"), ("b", "f8")]),
    "objects": np.array([1, "two", None], dtype=object),
    "empty": np.zeros((0, 3), dtype=np.float32),
    "strided": grid[::2, 1::2],
    "fortran": np.asfortranarray(grid),
    "transposed": grid.T,
    "masked": np.ma.masked_array([1.0, 2.0, 3.0], mask=[False, rank == 1, False]),
    "np f32": np.float32(rank + 0.25),
    "np i8": np.int8(-rank),
    "np bool": np.bool_(rank == 1),
    "np c64": np.complex64(1j * rank),
    "np datetime": np.datetime64("2024-01-01") + rank,
    "t f32 0-d": torch.tensor(rank + 0.5),
    "t bf16 0-d": torch.tensor(rank + 0.5, dtype=torch.bfloat16),
    "t bf16": torch.full((2, 3), rank + 0.5, dtype=torch.bfloat16),
    "t f16": torch.linspace(-1, 1, 5, dtype=torch.float16) * (rank + 1),
    "t f64": torch.arange(4, dtype=torch.float64) / (rank + 1),
    "t f8": torch.tensor([0.5, -2.0, rank], dtype=torch.float8_e4m3fn),
    "t c32": torch.tensor([1 + 1j * rank, 2], dtype=torch.complex32),
    "t c64": torch.tensor([1 + 1j * rank, 2], dtype=torch.complex64),
    "t i8": torch.arange(-3, 3, dtype=torch.int8) * rank,
    "t u8 0-d": torch.tensor(200 + rank, dtype=torch.uint8),
    "t i64": torch.arange(5) * rank,
    "t bool": torch.tensor([True, rank == 1]),
    "t empty": torch.zeros(0, 2),
    "t strided": torch.arange(12.0).reshape(3, 4)[:, ::2] + rank,
    "t transposed": torch.arange(6.0).reshape(2, 3).t() + rank,
    "t conj": torch.tensor([1 + 2j, 3 - 1j * rank]).conj(),
    "t with grad": torch.ones(3, requires_grad=True) * (rank + 2),
    "int": rank,
    "float": rank + 0.5,
    "complex": 1j * rank,
    "bool value": rank == 1,
    "str": f"rank {rank}",
    "bytes value": bytes([rank]),
    "none": None,
    "nested": {"list": [np.array(1.0 * rank), (torch.tensor(rank), "s")], "tuple": (np.float64(rank),),
               "dict": {"deep": [None, np.zeros((2, 0)), torch.tensor(rank, dtype=torch.bfloat16)]}},
}
"""


def computed_on(rank):
    """What the cell computed on *rank*, computed again here."""
    from mpi4py import MPI

    class Comm:  # psum's Allreduce with every rank's sum: rank 0's 0+1+2+3, rank 1's 1+2+3+4
        def Allreduce(self, send, receive, op):
            receive[0][...] = 6.0 + 10.0

    namespace = {"rank": rank, "comm": Comm(), "MPI": MPI}
    exec(KINDS, namespace)
    return namespace


def differences(got, want, path=""):
    """Where *got* is not exactly *want* (type, shape, dtype, memory order, value): a list of descriptions."""
    if type(got) is not type(want):
        return [f"{path}: {type(got).__name__}, not {type(want).__name__}"]
    if isinstance(want, dict):
        if list(got) != list(want):
            return [f"{path}: keys {list(got)}, not {list(want)}"]
        return [d for key in want for d in differences(got[key], want[key], f"{path}[{key!r}]")]
    if isinstance(want, (list, tuple)):
        if len(got) != len(want):
            return [f"{path}: {len(got)} items, not {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in differences(g, w, f"{path}[{i}]")]
    if isinstance(want, torch.Tensor):
        if (got.dtype, got.shape) != (want.dtype, want.shape):
            return [f"{path}: {got.dtype} {tuple(got.shape)}, not {want.dtype} {tuple(want.shape)}"]
        wide = torch.complex128 if want.is_complex() else torch.float64
        if not torch.equal(got.resolve_conj().to(wide), want.resolve_conj().to(wide)) or got.requires_grad:
            return [f"{path}: {got} is not {want}"]
        return []
    if isinstance(want, np.ma.MaskedArray):
        if not (np.array_equal(got.data, want.data) and np.array_equal(got.mask, want.mask)):
            return [f"{path}: {got!r} is not {want!r}"]
        return []
    if isinstance(want, np.ndarray):
        if (got.dtype, got.shape) != (want.dtype, want.shape):
            return [f"{path}: {got.dtype} {got.shape}, not {want.dtype} {want.shape}"]
        if want.flags.f_contiguous and not want.flags.c_contiguous and not got.flags.f_contiguous:
            return [f"{path}: lost its Fortran order"]
        if not np.array_equal(got, want) or not got.flags.writeable:
            return [f"{path}: {got!r} is not {want!r} (or is read-only)"]
        return []
    if isinstance(want, np.generic) and want.dtype != got.dtype:
        return [f"{path}: {got.dtype}, not {want.dtype}"]
    return [] if got == want else [f"{path}: {got!r} is not {want!r}"]


@pytest.mark.parametrize("how", ["shm", "mpi", "frames"])
def test_every_value_keeps_its_type_shape_and_dtype(how, world_of, ip, magics, mpi, transport, capsys):
    world_of(2)
    transport(how)
    mpi(KINDS, line="--gather kinds total")
    for rank in (0, 1):
        want = computed_on(rank)
        assert differences(ip.user_ns["kinds"][rank], want["kinds"], "kinds") == []
        assert differences(ip.user_ns["total"][rank], want["total"], "total") == []
    assert float(ip.user_ns["total"][1]) == 16.0  # what the ipyparallel example does with psum's result
    stats = magics.last.gather_stats["kinds"][1]
    assert stats[("f64 0-d",)]["shape"] == () and stats[("f64 0-d",)]["max"] == 1.5
    assert stats[("t bf16 0-d",)]["shape"] == () and stats[("t bf16 0-d",)]["dtype"] == "bfloat16"
    assert stats[("fortran",)]["shape"] == (4, 5) and stats[("fortran",)]["max"] == 38.0
    assert stats[("t f8",)]["dtype"] == "float8_e4m3fn" and stats[("t f8",)]["min"] == -2.0
    assert stats[("f16 many",)]["norm"] == pytest.approx(70_000 ** 0.5) and stats[("f16 many",)]["inf"] == 0
    assert "kinds['f64 0-d']: differs on rank 1 (max |Δ| 1)" in capsys.readouterr().out


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


def test_inspector_verdicts_on_planted_cases(world_of, magics, mpi, ip, capsys):
    world_of(4)
    mpi(PLANTED, line="--gather same perturbed nan")
    text = capsys.readouterr().out
    assert "same: identical on all ranks" in text
    assert "perturbed: differs on ranks 1, 3 (max |Δ| 0.001)" in text
    assert "nan: NaN/Inf on rank 2" in text and "max |Δ| nan" not in text
    result = magics.last
    gathered = {name: ip.user_ns[name] for name in result.gathered}  # the values went to the namespace
    reports = {r.label: r for r in inspect_gathered(gathered, result.gather_stats)}
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


LARGE = """
import numpy as np
import torch
n = 1 << 21  # 8 MB of float32: the notebook takes these statistics in the pass that compares the ranks
base = np.linspace(-3, 5, n, dtype=np.float32)
same = base.copy()
skewed = base * (1 + rank)  # differs on every rank but the first
moved = torch.from_numpy(base.copy())
if rank == 3:
    moved[n - 1] += 0.5  # the very last value, in the last block
fortran = np.asfortranarray(np.arange(n, dtype=np.float64).reshape(1024, -1) * (rank % 2))
nan = base.copy()
if rank == 1:
    nan[12345] = np.nan
"""


def test_large_float_leaves_are_described_in_the_pass_that_compares_them(world_of, magics, mpi, ip, capsys):
    world_of(4)
    mpi(LARGE, line="--gather same skewed moved fortran nan")
    text = capsys.readouterr().out
    assert "same: identical on all ranks" in text
    assert "skewed: differs on ranks 1-3 (max |Δ| 15)" in text
    assert "moved: differs on rank 3 (max |Δ| 0.5)" in text
    assert "fortran: differs on ranks 1, 3" in text
    assert "nan: NaN/Inf on rank 1" in text and "max |Δ| nan" not in text
    result = magics.last
    sent = result.gather_stats["skewed"][2][()]
    assert sent["scan"] and "min" not in sent  # the rank only described it: the statistics are the notebook's
    gathered = {name: ip.user_ns[name] for name in result.gathered}
    reports = {r.label: r for r in inspect_gathered(gathered, result.gather_stats)}
    for name, report in reports.items():
        for rank, stats in report.stats.items():
            values = np.asarray(gathered[name][rank], dtype=np.float64)
            finite = values[np.isfinite(values)]
            assert "scan" not in stats and stats["shape"] == values.shape
            assert stats["nan"] == int(np.isnan(values).sum()) and stats["inf"] == 0
            assert stats["min"] == finite.min() and stats["max"] == finite.max()
            assert stats["mean"] == pytest.approx(finite.mean(), rel=1e-6, abs=1e-9)
            assert stats["norm"] == pytest.approx(np.linalg.norm(finite), rel=1e-6)
            assert sum(stats["histogram"][0]) == len(range(0, values.size, stats["histogram_stride"]))
            if name != "nan":
                expected_diff = np.abs(values - np.asarray(gathered[name][0], dtype=np.float64)).max()
                assert report.diff[rank] == pytest.approx(expected_diff, rel=1e-6, abs=0)
    assert reports["skewed"].stats[1]["dtype"] == "float32" and reports["moved"].stats[3]["device"] == "cpu"
    assert reports["fortran"].differing == [1, 3] and reports["same"].identical


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
    with pytest.raises(UsageError, match="%mpi grads net: rank 1: name 'net' is not defined"):
        ip.run_line_magic("mpi", "grads net")
    mpi("notamodel = 3")
    with pytest.raises(UsageError, match=r"%mpi grads notamodel: ranks 0-1: notamodel is a int, not a torch.nn"):
        ip.run_line_magic("mpi", "grads notamodel")
    with pytest.raises(UsageError, match="takes the model's name"):
        ip.run_line_magic("mpi", "grads model()")
