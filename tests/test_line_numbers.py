"""Every line number mpinb shows is the editor's: the ``%%mpi`` line is line 1 of its cell. Each test reads the
number from what the user sees and checks the cell's line there, counted as JupyterLab's gutter counts it."""

import re

import pytest

from mpinb.errors import RankError

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def editor_line(line, body, number):
    """Line *number* of the cell as the editor shows it: ``%%mpi LINE`` then *body*."""
    return ([f"%%mpi {line}".rstrip()] + body.splitlines())[number - 1]


def failure(mpi, body, line=""):
    with pytest.raises(RankError) as info:
        mpi(body, line)
    return str(info.value), ANSI.sub("", "\n".join(info.value._render_traceback_()))


def test_a_traceback_points_at_the_editors_line(world_of, mpi):
    world_of(2)
    body = "x = 1\n\nif rank == 1:\n    x = 1 / 0\n"
    _, shown = failure(mpi, body)
    number = int(re.search(r"Cell In\[\d+\], line (\d+)", shown)[1])
    assert editor_line("", body, number) == "    x = 1 / 0", shown
    assert f"----> {number}     x = 1 / 0" in shown, shown


def test_a_syntax_error_names_the_editors_line(world_of, mpi):
    world_of(2)
    body = "y = 2\nz = (y +\n"
    text, _ = failure(mpi, body)
    number = int(re.search(r"\(cell line (\d+)\)", text)[1])
    assert editor_line("", body, number).startswith("z = (y +"), text


def test_where_a_rank_waits_is_the_editors_line(world_of, mpi):
    world_of(2)
    body = "import time\n\nif rank == 0:\n    comm.Barrier()\nelse:\n    time.sleep(30)\n"
    text, _ = failure(mpi, body, "--timeout 2")
    for call in ("comm.Barrier()", "time.sleep(30)"):
        number = int(re.search(rf"blocked in {re.escape(call)} at cell line (\d+)", text)[1])
        assert editor_line("--timeout 2", body, number).strip() == call, text


def test_a_mismatch_names_the_editors_lines(world_of, mpi):
    world_of(2)
    body = "import numpy as np\n\nif rank == 0:\n    comm.Barrier()\nelse:\n    comm.Allreduce(np.zeros(8), np.zeros(8))\n"
    text, _ = failure(mpi, body, "--timeout 60")
    calls = dict(re.findall(r"rank (\d) in \w+\(.*?\) at cell line (\d+)", text))
    assert editor_line("--timeout 60", body, int(calls["0"])).strip() == "comm.Barrier()", text
    assert editor_line("--timeout 60", body, int(calls["1"])).strip().startswith("comm.Allreduce("), text


def test_a_crash_names_the_editors_line(ip, world_of, mpi):
    world_of(2)
    body = "import ctypes\n\nif rank == 1:\n    ctypes.string_at(0)\ncomm.Barrier()\n"
    try:
        text, _ = failure(mpi, body)
    finally:
        ip.run_line_magic("mpi", "restart --fresh")  # the tests after this one share the shell's world
    number = int(re.search(r"called at cell line (\d+): ctypes\.string_at\(0\)", text)[1])
    assert editor_line("", body, number).strip() == "ctypes.string_at(0)", text
