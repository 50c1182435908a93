"""Edges of what notebook and ranks exchange: empty values, bytes that are not UTF-8, messages nobody signed,
and files created where another user could have planted something."""

import numpy as np
import pytest
import torch

from mpinb.notebook.perrank import PerRank
from mpinb.wire import shm

EMPTY = """
import numpy as np
import torch
e = np.zeros(0)
e2 = np.zeros((3, 0), dtype=np.int16)
t = torch.zeros(0, 2)
tb = torch.zeros(0, dtype=torch.bfloat16)
"""
EMPTY_NAMES = {"e": ((0,), np.float64), "e2": ((3, 0), np.int16), "t": ((0, 2), torch.float32),
               "tb": ((0,), torch.bfloat16)}


def test_a_segment_takes_buffers_of_no_bytes(tmp_path):
    """Empty arrays have empty buffers: nothing to map, and their offsets all the same."""
    segment = shm.Segment(str(tmp_path))
    try:
        assert segment.write([np.zeros(0).data, memoryview(b"")]) == [0, 0]
        assert segment.write([np.arange(3.0).data]) == [0]  # the same segment grows later as usual
    finally:
        segment.close()


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["shm", "mpi", "frames"])
def test_empty_arrays_and_tensors_are_gathered_on_every_transport(how, world_of, ip, magics, mpi, monkeypatch):
    world_of(2)
    monkeypatch.setattr(magics, "gather_transport", how)
    mpi(EMPTY, line=f"--gather {' '.join(EMPTY_NAMES)} --no-inspect")
    for name, (shape, dtype) in EMPTY_NAMES.items():
        gathered = ip.user_ns[name]
        assert isinstance(gathered, PerRank) and sorted(gathered) == [0, 1]
        for value in gathered.values():
            assert (tuple(value.shape), value.dtype) == (shape, dtype), name
    mpi("a = np.zeros(0, dtype=np.complex64)", line="--gather a --no-inspect")  # one name alone, as users write it
    assert [(v.shape, v.dtype) for v in ip.user_ns["a"].values()] == [((0,), np.complex64)] * 2
    mpi("z = np.array(rank + 0.5)\nz0 = torch.tensor(rank)", line="--gather z z0 --no-inspect")  # 0-d
    assert [(v.shape, float(v)) for v in ip.user_ns["z"].values()] == [((), 0.5), ((), 1.5)]
    assert [(tuple(v.shape), int(v)) for v in ip.user_ns["z0"].values()] == [((), 0), ((), 1)]
    assert mpi("rank") == {0: 0, 1: 1}  # the world is as it was
