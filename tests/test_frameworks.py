"""TensorFlow and JAX on real ranks: mpi4py's collectives with TF tensors, --gather bringing back their own types
(TF strings too, without losing a rank), bfloat16 statistics in the inspector, and mpinb.report() taking them."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from mpinb.notebook.models.leaf_reports import inspect_gathered
from mpinb.rank.gather import collect
from mpinb.rank.report import AgentSink, Recorder
from mpinb.widgets.inspector import inspector_text

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(300)]

QUIET = "import os\nos.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # TF's start-up notices, once per rank\n"


@pytest.fixture(scope="module")
def tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return pytest.importorskip("tensorflow", reason="tensorflow is not importable: pip install -e '.[dev]'")


@pytest.fixture(scope="module")
def jax():
    return pytest.importorskip("jax", reason="jax is not importable: pip install -e '.[dev]'")


@pytest.fixture
def transport(magics, monkeypatch):
    return lambda name: monkeypatch.setattr(magics, "gather_transport", name)


def rank_pids(magics):
    return {rank: who["pid"] for rank, who in magics.world.identities.items()}


ALLGATHER = QUIET + """
import tensorflow as tf

local = tf.constant([rank, 10 * rank], dtype=tf.float32)
everyone = comm.allgather(local)  # TF tensors pickle: mpi4py's lowercase collectives take them as they are
total = tf.add_n(everyone)
"""


def test_tensorflow_tensors_through_mpi4py_allgather(tf, world_of, ip, mpi, capsys):
    world_of(2)
    mpi(ALLGATHER, line="--gather total everyone --no-inspect")
    for rank in (0, 1):
        total = ip.user_ns["total"][rank]
        assert isinstance(total, tf.Tensor) and total.dtype == tf.float32
        assert total.numpy().tolist() == [1.0, 10.0]
        everyone = ip.user_ns["everyone"][rank]
        assert type(everyone) is list and [t.numpy().tolist() for t in everyone] == [[0.0, 0.0], [1.0, 10.0]]


TF_VALUES = QUIET + """
import tensorflow as tf

tf_values = {
    "f32": tf.constant([[1.5, 2.5]]) * (rank + 1),
    "bf16": tf.constant([0.5, rank], dtype=tf.bfloat16),
    "bf16 0-d": tf.constant(rank + 0.25, dtype=tf.bfloat16),
    "f16 0-d": tf.constant(rank + 0.5, dtype=tf.float16),
    "i64 0-d": tf.constant(rank, dtype=tf.int64),
    "u8": tf.constant([1, 2, rank], dtype=tf.uint8),
    "bool": tf.constant([True, rank == 1]),
    "c64": tf.constant([1 + 1j * rank], dtype=tf.complex64),
    "empty": tf.zeros((0, 3)),
    "string": tf.constant([b"rank", str(rank).encode(), b"nul\\x00"]),
    "string 0-d": tf.constant("hello"),
    "variable": tf.Variable([1.0, rank]),
}
"""


def assert_as_on_the_ranks(ip, code, name, kind, as_numpy):
    """Each rank's *name* in the notebook is of *kind*, with the dtype, shape and values *code* makes there."""
    for rank in (0, 1):
        namespace = {"rank": rank}
        exec(code, namespace)
        want, got = namespace[name], ip.user_ns[name][rank]
        assert list(got) == list(want)
        for key, expected in want.items():
            value = got[key]
            assert isinstance(value, kind), (key, type(value))
            assert (value.dtype, value.shape) == (expected.dtype, expected.shape), key
            assert np.array_equal(as_numpy(value), as_numpy(expected)), key


@pytest.mark.parametrize("how", ["shm", "mpi", "frames"])
def test_tensorflow_values_come_back_as_tensors_and_strings_keep_the_rank_alive(how, tf, world_of, ip, magics, mpi,
                                                                                 transport, capsys):
    world_of(2)
    transport(how)
    before = rank_pids(magics)
    mpi(TF_VALUES, line="--gather tf_values")
    assert_as_on_the_ranks(ip, TF_VALUES, "tf_values", tf.Tensor, lambda value: np.array(value.numpy()))
    assert ip.user_ns["tf_values"][1]["string"].numpy().tolist() == [b"rank", b"1", b"nul\x00"]
    stats = magics.last.gather_stats["tf_values"][1]
    assert stats[("string",)]["dtype"] == "string" and stats[("bf16",)]["dtype"] == "bfloat16"
    assert stats[("bf16",)]["max"] == 1.0 and stats[("i64 0-d",)]["shape"] == ()
    assert "tf_values['string']: differs on rank 1" in capsys.readouterr().out
    assert mpi("rank") == {0: 0, 1: 1} and rank_pids(magics) == before  # the same ranks, none lost


JAX_VALUES = """
import jax.numpy as jnp

jax_values = {
    "f32": jnp.arange(6, dtype=jnp.float32).reshape(2, 3) + rank,
    "bf16": jnp.array([0.5, rank], dtype=jnp.bfloat16),
    "bf16 0-d": jnp.array(rank + 0.5, dtype=jnp.bfloat16),
    "f16": jnp.array([1.5, -rank], dtype=jnp.float16),
    "i32 0-d": jnp.array(rank, dtype=jnp.int32),
    "u8": jnp.arange(4, dtype=jnp.uint8) * rank,
    "bool": jnp.array([True, rank == 1]),
    "c64": jnp.array([1 + 1j * rank], dtype=jnp.complex64),
    "empty": jnp.zeros((2, 0)),
    "transposed": (jnp.arange(6.0).reshape(2, 3) + rank).T,
}
"""


@pytest.mark.parametrize("how", ["shm", "mpi", "frames"])
def test_jax_values_come_back_as_jax_arrays(how, jax, world_of, ip, mpi, transport):
    world_of(2)
    transport(how)
    mpi(JAX_VALUES, line="--gather jax_values --no-inspect")
    assert_as_on_the_ranks(ip, JAX_VALUES, "jax_values", jax.Array, np.asarray)


BFLOAT16 = QUIET + """
import jax.numpy as jnp
import tensorflow as tf

jx = jnp.linspace(-1, 1, 9, dtype=jnp.bfloat16)
tx = tf.cast(tf.linspace(-1.0, 1.0, 9), tf.bfloat16)
if rank == 1:
    jx = jx.at[3].set(jnp.nan)
    tx = tf.tensor_scatter_nd_update(tx, [[2]], tf.constant([0.25], tf.bfloat16))  # -0.5 on rank 0
"""


def test_bfloat16_from_jax_and_tensorflow_gets_real_statistics(tf, jax, world_of, magics, mpi, ip, capsys):
    world_of(2)
    mpi(BFLOAT16, line="--gather jx tx")
    text = capsys.readouterr().out
    assert "jx: NaN/Inf on rank 1" in text and "max |Δ| nan" not in text
    assert "tx: differs on rank 1 (max |Δ| 0.75)" in text
    result = magics.last
    gathered = {name: ip.user_ns[name] for name in result.gathered}  # the values went to the namespace
    reports = {r.label: r for r in inspect_gathered(gathered, result.gather_stats)}
    for label in ("jx", "tx"):
        stats = reports[label].stats[0]
        assert stats["dtype"] == "bfloat16" and stats["shape"] == (9,)
        assert (stats["min"], stats["max"], stats["mean"], stats["nan"]) == (-1.0, 1.0, 0.0, 0)
        assert stats["norm"] == pytest.approx(float(np.linalg.norm(np.linspace(-1, 1, 9))))
        assert sum(stats["histogram"][0]) == 9
    assert reports["jx"].stats[1]["nan"] == 1 and reports["jx"].stats[1]["max"] == 1.0
    assert reports["tx"].diff[1] == 0.75 and reports["tx"].stats[1]["mean"] == pytest.approx(0.75 / 9)
    assert inspector_text(list(reports.values())).count("bfloat16") == 4


def test_report_takes_one_element_tensorflow_and_jax_arrays(tf, jax):
    recorder = Recorder()
    recorder.sink = AgentSink(notify=lambda: None)
    recorder.report(0, None, {
        "tf": tf.constant([0.5]), "tf 0-d": tf.constant(2.0), "tf bf16": tf.constant([[1.5]], dtype=tf.bfloat16),
        "tf bf16 0-d": tf.constant(-1.5, dtype=tf.bfloat16), "tf variable": tf.Variable([4.0]),
        "jax": jax.numpy.array([0.25]), "jax bf16": jax.numpy.array(3.5, dtype=jax.numpy.bfloat16),
        "jax int": jax.numpy.array([7])})
    ((_, _, _, values, _),) = recorder.sink.drain()
    assert values == {"tf": 0.5, "tf 0-d": 2.0, "tf bf16": 1.5, "tf bf16 0-d": -1.5, "tf variable": 4.0, "jax": 0.25,
                      "jax bf16": 3.5, "jax int": 7.0}
    assert all(type(v) is float for v in values.values())
    with pytest.raises(TypeError, match=r"loss=\.\.\.\) takes one number, not an array of shape \(2,\); reduce"):
        recorder.report(1, None, {"loss": jax.numpy.ones(2)})
    with pytest.raises(TypeError, match=r"name=\.\.\.\) takes a number .* not EagerTensor"):
        recorder.report(1, None, {"name": tf.constant(["text"])})


WITHOUT_FRAMEWORKS = """
import pickle, sys
sys.modules["jax"] = sys.modules["tensorflow"] = None  # a notebook where neither can be imported
item, buffers = pickle.load(open(sys.argv[1], "rb"))
value = pickle.loads(item.pickle, buffers=buffers)
for key, array in value.items():
    print(key, type(array).__name__, array.dtype, array.shape, array.tolist())
"""


def test_a_notebook_without_the_framework_gets_numpy_arrays(tf, jax, tmp_path):
    values = {"jax": jax.numpy.array([1.5, -2.0], dtype=jax.numpy.bfloat16), "tf": tf.constant([b"a", b"bc"]),
              "tf bf16": tf.constant(0.5, dtype=tf.bfloat16)}
    items, buffers = collect(["values"], {"values": values})
    path = tmp_path / "values.pickle"
    path.write_bytes(pickle.dumps((items["values"], [bytearray(buffer) for buffer in buffers])))
    done = subprocess.run([sys.executable, "-c", WITHOUT_FRAMEWORKS, str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["jax ndarray bfloat16 (2,) [1.5, -2.0]", "tf ndarray object (2,) [b'a', b'bc']",
                                        "tf bf16 ndarray bfloat16 () 0.5"]
