"""mpinb in terminal IPython, in a real terminal (a pseudo-terminal of a set width): what a failed cell shows reads
without a word broken across lines."""

import re
import sys
from pathlib import Path

import pytest
from conftest import leftover_ranks, new_world_tag

pexpect = pytest.importorskip("pexpect")

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(240)]

IPYTHON = str(Path(sys.executable).with_name("ipython"))
PROMPT = re.compile(r"In \[\d+\]: ")
WIDTH = 60
MESSAGE = ("the model was wrapped in DistributedDataParallel on rank 1 without the others: call model.join() on "
           "every rank, or none")


def shown(terminal, line, timeout=120):
    """What terminal IPython shows for *line*, its colour codes taken out, up to its next prompt."""
    terminal.sendline(line)
    terminal.expect(PROMPT, timeout=timeout)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.before).replace("\r", "")


def test_a_failure_in_a_narrow_terminal_breaks_its_lines_between_words():
    tag = new_world_tag()
    terminal = pexpect.spawn(IPYTHON, ["--simple-prompt", "--no-banner", "--colors=NoColor"], encoding="utf-8",
                             dimensions=(40, WIDTH), timeout=120)
    try:
        terminal.expect(PROMPT)
        shown(terminal, "%load_ext mpinb")
        assert "started" in shown(terminal, "%mpi start -n 2")
        cell = f"if rank == 1: raise RuntimeError({MESSAGE!r})"
        text = shown(terminal, f"get_ipython().run_cell_magic('mpi', '', {cell!r})")
        lines = text.splitlines()
        ours = [line for line in lines if line.startswith(("[rank 1]", "RankError:", "rank 1:", "  "))
                and any(word in line for word in MESSAGE.split())]
        assert ours, text
        assert all(len(line) <= WIDTH for line in ours), "\n".join(ours)
        # every word of the message whole, in order, in the rank's header line and in the summary
        flowing = " ".join(" ".join(lines).split())
        assert f"[rank 1] RuntimeError: {MESSAGE}" in flowing and f"rank 1: RuntimeError: {MESSAGE}" in flowing, text
        shown(terminal, "%mpi stop")
        terminal.sendline("exit")
        terminal.expect(pexpect.EOF, timeout=60)
    finally:
        terminal.close(force=True)
    assert not leftover_ranks(tag)
