"""New memory for large values the notebook keeps (``mpinb/wire/pages.py``): huge pages where the kernel offers
them, read from the kernel's own account of the mapping (``/proc/self/smaps``)."""

import gc
import os
from collections import Counter
from pathlib import Path

import numpy as np
import psutil
import pytest
from mpinb.wire import bulk, pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
huge_pages = pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(),
                                reason="this kernel offers no transparent huge pages")


def huge_bytes(array):
    """Bytes of *array*'s mapping backed by huge pages, as the kernel counts them."""
    address, inside = array.ctypes.data, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if not fields[0].endswith(":"):  # a mapping's first line: "start-end perms offset device inode [path]"
            start, end = (int(x, 16) for x in fields[0].split("-"))
            inside = start <= address < end
        elif inside and fields[0] == "AnonHugePages:":
            return int(fields[1]) * 1024
    raise AssertionError("the array's mapping is not in /proc/self/smaps")


@huge_pages
def test_a_large_array_is_written_into_huge_pages_and_gives_its_memory_back():
    process = psutil.Process()
    gc.collect()
    before = process.memory_info().rss
    array = pages.empty(40 << 20)
    assert array.nbytes == 40 << 20 and array.flags.writeable and array.dtype == np.uint8
    assert array.ctypes.data % pages.HUGE == 0
    array[:] = 7
    assert huge_bytes(array) > 0  # before: np.empty's memory, on no 2 MB boundary, had none
    # whole huge pages only: the value holds what it uses and no more
    assert process.memory_info().rss - before <= (40 << 20) + (1 << 20)
    assert int(array[::4096].sum()) == 7 * (40 << 20) // 4096
    del array
    gc.collect()
    assert process.memory_info().rss - before < 4 << 20


def test_small_arrays_and_copies():
    small = pages.empty(1000)
    assert small.nbytes == 1000 and small.flags.writeable
    data = np.random.default_rng(1).integers(0, 255, 6 << 20, dtype=np.uint8)
    copied = pages.copy(memoryview(data))
    assert np.array_equal(copied, data) and copied.ctypes.data != data.ctypes.data
    copied[0] ^= 1
    assert copied[0] != data[0]


@huge_pages
def test_a_large_sealed_message_opens_into_huge_pages():
    key = os.urandom(32)
    data = np.arange(6 << 20, dtype=np.float32)  # 24 MB
    opener = bulk.Opener(key, Counter())
    for chunk in bulk.Sealer(key, "rank/2").seal([b"head", data]):
        opener.feed([bytes(frame) for frame in chunk])
    head, values = opener.take(b"rank/2")
    assert bytes(head) == b"head" and np.array_equal(values.view(np.float32), data)
    assert huge_bytes(values) > 0
