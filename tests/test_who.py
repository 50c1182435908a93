"""%mpi who: each rank's names described in a plain namespace (arrays, tensors, models, the size cap, objects that
cannot be pickled), the report that flags what differs, its text and table, and a real 4-rank world."""

import os
import subprocess
import sys
import threading
import types

import numpy as np
import pytest
import torch

from mpinb.rank.who import who
from mpinb.widgets.colors import rank_color
from mpinb.widgets.who import who_html, who_report, who_text, who_widget

MB = 1 << 20


def test_arrays_are_described_and_hashed_by_content_dtype_and_shape():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = who({"a": a, "b": a.copy(), "c": a + 1, "i": a.view(np.int32), "flat": a.reshape(-1),
               "t": a.T, "tc": np.ascontiguousarray(a.T), "zero": np.array(5.0), "empty": np.zeros((0, 3))})
    assert got["a"]["type"] == "ndarray" and got["a"]["shape"] == (3, 4) and got["a"]["dtype"] == "float32"
    assert len(got["a"]["hash"]) == 8 and int(got["a"]["hash"], 16) >= 0
    assert got["a"]["hash"] == got["b"]["hash"]
    assert len({got[name]["hash"] for name in ("a", "c", "i", "flat")}) == 4  # content, dtype, shape all count
    assert got["t"]["hash"] == got["tc"]["hash"]  # hashed in C order, however the memory is laid out
    assert got["a"]["summary"] == "[0. 1. 2. 3. 4. 5. …]" and got["t"]["summary"].startswith("[0. 4. 8. 1.")
    assert got["zero"]["shape"] == () and got["zero"]["summary"] == "5.0"
    assert got["empty"]["summary"] == "[]" and got["empty"]["hash"]
    assert all(entry["note"] is None for entry in got.values())


def test_tensors_are_hashed_on_the_host_whatever_their_dtype_or_layout():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    got = who({"t": t, "grad": t.clone().requires_grad_(), "other": t + 1, "tt": t.t(), "ttc": t.t().contiguous(),
               "half": t.to(torch.bfloat16), "conj": torch.tensor([1 + 2j]).conj(), "plain": torch.tensor([1 - 2j]),
               "param": torch.nn.Parameter(t.clone())})
    assert got["t"] == {"type": "Tensor", "shape": (3, 4), "dtype": "float32", "hash": got["t"]["hash"],
                        "summary": "[0. 1. 2. 3. 4. 5. …]", "note": None}
    assert got["grad"]["hash"] == got["t"]["hash"] != got["other"]["hash"]
    assert got["tt"]["hash"] == got["ttc"]["hash"]
    assert got["half"]["dtype"] == "bfloat16" and got["half"]["hash"] and got["half"]["summary"].startswith("[0. 1.")
    assert got["conj"]["hash"] == got["plain"]["hash"]  # the values, not the lazy conjugate bit
    assert got["param"]["type"] == "Parameter" and got["param"]["hash"]


def test_a_model_has_its_parameter_count_and_a_hash_over_its_state_an_optimizer_its_type():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1))
    twin = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1))
    twin.load_state_dict(model.state_dict())
    got = who({"model": model, "twin": twin, "opt": torch.optim.SGD(model.parameters(), lr=0.1)})
    assert got["model"]["type"] == "Sequential" and got["model"]["parameters"] == 4 * 3 + 3 + 3 + 3 + 3 + 1
    assert got["model"]["summary"] == "25 parameters"
    assert got["model"]["hash"] == got["twin"]["hash"]
    with torch.no_grad():
        twin[0].weight[0, 0] += 1
    assert who({"twin": twin})["twin"]["hash"] != got["model"]["hash"]
    twin.load_state_dict(model.state_dict())
    twin[1].running_mean += 1  # buffers are state too
    assert who({"twin": twin})["twin"]["hash"] != got["model"]["hash"]
    assert got["opt"]["type"] == "SGD" and got["opt"]["hash"] is None and got["opt"]["summary"] == "1 parameter group"


def test_a_big_array_is_hashed_over_its_first_64_mb_and_says_so():
    big = np.zeros(100 * MB // 8)
    late = big.copy()
    late[-1] = 1  # past the first 64 MB: the same hash (what the note warns of)
    early = big.copy()
    early[1000] = 1
    got = who({"big": big, "late": late, "early": early, "strided": big[::2]})
    assert got["big"]["note"] == "first 64 MB" and got["big"]["shape"] == (100 * MB // 8,)
    assert got["big"]["hash"] == got["late"]["hash"] != got["early"]["hash"]
    assert got["strided"]["note"] is None and got["strided"]["hash"]  # 50 MB: fits
    tensor = torch.zeros(100 * MB // 4)
    assert who({"t": tensor})["t"]["note"] == "first 64 MB"


def test_one_call_hashes_a_bounded_total_and_containers_a_bounded_pickle():
    arrays = {f"a{i}": np.full(MB, i, dtype=np.uint8) for i in range(4)}
    got = who(arrays, total=int(2.5 * MB))
    assert [got[f"a{i}"]["note"] for i in range(4)] == [None, None, "first 512 kB", "not hashed: who's total spent"]
    assert got["a3"]["hash"] is None and got["a2"]["hash"]
    got = who({"long": list(range(10 ** 6)), "short": list(range(10))}, pickle_limit=64 * 1024)
    assert got["long"]["note"] == "first 64 kB pickled" and got["long"]["hash"]
    assert got["long"]["summary"].startswith("1,000,000 items: [0, 1, 2")
    assert got["short"]["note"] is None


def test_containers_are_hashed_through_pickle_with_their_arrays_and_tensors_inside():
    got = who({"d": {"x": np.zeros(3), "t": torch.ones(2), "s": "text"}, "e": {"x": np.zeros(3), "t": torch.ones(2),
               "s": "text"}, "f": {"x": np.ones(3), "t": torch.ones(2), "s": "text"}, "l": [1, 2.5, None, (3, "a")],
               "n": 5, "m": 6, "s": "hello", "b": b"\x00" * 100})
    assert got["d"]["hash"] == got["e"]["hash"] != got["f"]["hash"]
    assert got["l"]["type"] == "list" and got["l"]["summary"] == "[1, 2.5, None, (3, 'a')]"
    assert got["n"]["hash"] != got["m"]["hash"] and got["n"]["summary"] == "5"
    assert got["s"]["summary"] == "'hello'" and got["b"]["summary"].startswith("100 bytes: b'\\x00")
    assert all(len(entry["summary"]) <= 40 for entry in got.values())


SET_HASHES = """
from mpinb.rank.who import who
got = who({"s": set("abcdefghij"), "mixed": {frozenset({"x", "y"}), 1, "z"}, "inside": {"k": {"p", "q", "r"}}})
print({name: entry["hash"] for name, entry in got.items()})
"""


def test_sets_hash_the_same_in_every_process_whatever_its_string_hash_seed():
    got = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed)  # as two ranks differ: each process has its own
        got.add(subprocess.run([sys.executable, "-c", SET_HASHES], env=env, capture_output=True, text=True,
                               timeout=60, check=True).stdout)
    assert len(got) == 1 and "None" not in got.pop()


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("no pickling here")


class BadRepr:
    def __repr__(self):
        raise ValueError("no repr either")


class BadShape:
    @property
    def shape(self):
        raise RuntimeError("shape is computed remotely")


def test_what_cannot_be_pickled_or_printed_is_listed_with_a_reason_and_never_raises():
    got = who({"lock": threading.Lock(), "gen": (i for i in range(3)), "obj": Unpicklable(), "bad": BadRepr(),
               "shape": BadShape(), "inside": [1, threading.Lock()]})
    assert got["lock"]["type"] == "lock" and got["lock"]["hash"] is None
    assert got["lock"]["note"] == "not hashed: cannot be pickled (TypeError)"
    assert got["gen"]["hash"] is None and got["obj"]["note"] == "not hashed: cannot be pickled (RuntimeError)"
    assert got["inside"]["hash"] is None and got["inside"]["note"].startswith("not hashed")
    assert got["bad"]["summary"] == "<BadRepr: repr() raised ValueError>"
    assert got["shape"]["shape"] is None and got["shape"]["hash"]  # pickles fine: only its shape cannot be read


def test_only_the_users_names_are_listed():
    import mpi4py

    def f(x, y=2):
        return x

    class Point:
        pass

    namespace = {"_hidden": 1, "__builtins__": {}, "np": np, "mpi4py": mpi4py, "In": [""], "Out": {},
                 "get_ipython": lambda: None, "exit": None, "quit": None, "MPI": types.SimpleNamespace(),
                 "comm": "world", "rank": 2, "size": 4, "f": f, "Point": Point, "p": Point(), "abs": abs}
    got = who(namespace)
    assert sorted(got) == ["Point", "abs", "comm", "f", "p", "rank", "size"]
    assert got["f"]["type"] == "function" and got["f"]["summary"] == "def f(x, y=2)" and got["f"]["hash"] is None
    assert got["Point"]["type"] == "type" and got["Point"]["summary"].startswith("class ")
    assert got["Point"]["hash"] is None and got["abs"]["hash"] is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_small_gpu_tensor_is_hashed_as_on_the_host_and_a_big_one_is_never_copied():
    small = torch.arange(1000, dtype=torch.float32)
    big = torch.zeros(64 * MB // 4, device="cuda")
    model = torch.nn.Linear(4096, 4096).cuda()  # 64 MB of state
    got = who({"cpu": small, "gpu": small.cuda(), "big": big, "model": model,
               "small_model": torch.nn.Linear(2, 2).cuda()})
    assert got["gpu"]["hash"] == got["cpu"]["hash"] and got["gpu"]["summary"].startswith("cuda:0 [0. 1.")
    assert got["big"]["hash"] is None and "not copied to the host" in got["big"]["note"]
    assert got["big"]["summary"] == "cuda:0 64 MB"
    assert got["model"]["hash"] is None and "not copied to the host" in got["model"]["note"]
    assert got["small_model"]["hash"] and got["small_model"]["summary"] == "6 parameters, cuda:0"


def _rank(rank, **extra):
    namespace = {"rank": rank, "size": 4, "w": np.full(3, 1.0 if rank in (1, 3) else 0.0), "same": np.arange(4)}
    namespace.update(extra)
    return who(namespace)


def test_the_report_flags_what_differs_from_the_majority_and_what_is_missing():
    by_rank = {rank: _rank(rank, seed=7 if rank != 2 else 8, **({"x": 1} if rank != 1 else {})) for rank in range(4)}
    rows = {row["name"]: row for row in who_report(by_rank)}
    assert list(rows) == ["rank", "same", "seed", "size", "w", "x"]
    assert rows["w"]["differs_on"] == [1, 3] and rows["w"]["reference"] == 0  # two against two: rank 0 rules
    assert rows["w"]["flags"] == ["w: differs on ranks 1, 3"]
    assert rows["seed"]["differs_on"] == [2] and rows["seed"]["flags"] == ["seed: differs on rank 2"]
    assert rows["x"]["missing_on"] == [1] and rows["x"]["flags"] == ["x: missing on rank 1"]
    assert rows["same"]["differs_on"] == [] and rows["same"]["flags"] == []
    assert rows["same"]["type"] == "ndarray" and rows["same"]["shape"] == (4,) and rows["same"]["dtype"] == "int64"
    assert rows["rank"]["differs_on"] == [1, 2, 3] and rows["rank"]["by_design"] and rows["rank"]["flags"] == []
    assert [ranks for ranks, _ in rows["w"]["groups"]] == [[0, 2], [1, 3]]
    majority = who_report({rank: _rank(rank, w=np.zeros(3) + (rank == 0)) for rank in range(4)})
    w = next(row for row in majority if row["name"] == "w")
    assert w["reference"] == 1 and w["differs_on"] == [0]  # three against one: rank 0 is the odd one out


def test_values_that_cannot_be_hashed_are_compared_by_type_and_shape():
    by_rank = {0: {"v": {"type": "lock", "shape": None, "dtype": None, "hash": None, "summary": "<lock>"}},
               1: {"v": {"type": "lock", "shape": None, "dtype": None, "hash": None, "summary": "<lock>"}},
               2: {"v": {"type": "RLock", "shape": None, "dtype": None, "hash": None, "summary": "<RLock>"}}}
    row = who_report(by_rank)[0]
    assert row["differs_on"] == [2] and row["type"] is None


def test_the_text_says_what_is_the_same_once_and_lists_each_group_that_differs():
    rows = who_report({rank: _rank(rank, big=np.zeros(100 * MB // 8)) for rank in range(4)})
    text = who_text(rows)
    print(text)
    lines = text.splitlines()
    assert lines[0] == "5 names on 4 ranks; w: differs on ranks 1, 3"
    assert lines[1].split() == ["name", "ranks", "type", "shape", "dtype", "hash", "value", "notes"]
    same = next(line for line in lines if line.startswith("same "))
    assert same.split()[:5] == ["same", "all", "ndarray", "(4,)", "int64"] and "differs" not in same
    assert "(first 64 MB)" in next(line for line in lines if line.startswith("big "))
    assert "0, 1, 2, 3" in next(line for line in lines if line.startswith("rank ")) and "differs by design" in text
    w = lines.index(next(line for line in lines if line.startswith("w ")))
    assert lines[w].split()[1:3] == ["0,", "2"] and lines[w].endswith("differs on ranks 1, 3")
    assert lines[w + 1].split()[:3] == ["1,", "3", "ndarray"] and "[1. 1. 1.]" in lines[w + 1]
    assert who_text([]) == "no names defined on the ranks"


def test_the_table_has_a_hash_column_per_rank_in_its_colour_with_differences_marked():
    rows = who_report({rank: _rank(rank, **({"x": 1} if rank != 2 else {})) for rank in range(4)})
    widget = who_widget(rows)
    assert widget.rows is rows and widget.value == who_html(rows)
    for rank in range(4):
        assert f"background:{rank_color(rank)}" in widget.value and f"<b>rank {rank}</b></span></th>" in widget.value
    w = next(row for row in rows if row["name"] == "w")
    w_html = next(part for part in widget.value.split("<tr") if "<b>w</b>" in part)
    assert "background:#fdecea" in w_html and w_html.count("color:#c62828;font-weight:bold") == 2
    assert w["ranks"][1]["hash"] in w_html and "differs on ranks 1, 3" in w_html
    x_html = next(part for part in widget.value.split("<tr") if "<b>x</b>" in part)
    assert "not defined on rank 2" in x_html and "missing on rank 2" in x_html
    same_html = next(part for part in widget.value.split("<tr") if "<b>same</b>" in part)
    assert "background" not in same_html and "font-weight:bold" not in same_html
    rank_html = next(part for part in widget.value.split("<tr") if "<b>rank</b>" in part)
    assert "differs by design" in rank_html and "#fdecea" not in rank_html


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_who_on_a_real_world_flags_the_name_that_differs(world_of, mpi):
    world_of(4)
    mpi("import numpy as np\nw = np.full(3, 1.0 if rank in (1, 3) else 0.0)\nsame = np.arange(4)")
    by_rank = mpi("__import__('mpinb.rank.who', fromlist=['who']).who()")
    assert sorted(by_rank) == [0, 1, 2, 3]
    names = set(by_rank[0])
    assert {"comm", "rank", "size", "w", "same"} <= names
    assert not names & {"MPI", "np", "In", "Out", "get_ipython", "exit", "quit"}
    assert not any(name.startswith("_") for name in names)
    assert by_rank[1]["w"]["shape"] == (3,) and by_rank[1]["w"]["summary"] == "[1. 1. 1.]"
    rows = {row["name"]: row for row in who_report(by_rank)}
    assert rows["w"]["flags"] == ["w: differs on ranks 1, 3"]
    assert rows["same"]["flags"] == [] and rows["same"]["differs_on"] == []
    assert rows["comm"]["differs_on"] == [] and rows["size"]["differs_on"] == []
    assert by_rank[2]["comm"]["summary"] == "MPI_COMM_WORLD, size 4" and by_rank[2]["comm"]["hash"]
    assert rows["rank"]["by_design"] and rows["rank"]["flags"] == []
    text = who_text(list(rows.values()))
    print(text)
    assert "w: differs on ranks 1, 3" in text and "same: " not in text


def test_mpi_who_flags_a_planted_difference(ip, magics, world_of, mpi, capsys):
    """``%mpi who`` in a terminal: one line per name, the planted difference flagged by rank."""
    world_of(4)
    mpi("import numpy as np\nw = np.full(3, 1.0 if rank in (1, 3) else 0.0)\nsame = np.arange(4)")
    capsys.readouterr()
    ip.run_line_magic("mpi", "who")
    text = capsys.readouterr().out
    assert "w: differs on ranks 1, 3" in text
    rows = magics.show_who()
    flagged = {row["name"]: row["differs_on"] for row in rows}
    assert flagged["w"] == [1, 3] and flagged["same"] == []
