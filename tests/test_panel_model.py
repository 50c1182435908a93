"""What the MPI panel says of each rank, from the roll-call answers, reports and replies the running cell brings
(``notebook/panel/model.py``): a plain object, checked without a world; and what a real rank puts in its answer.
"""

import dataclasses

import psutil
import pytest
from waiting import wait_for

from mpinb.notebook.panel.model import PanelModel, holding_up
from mpinb.notebook.panel.publisher import CALLS
from mpinb.wire.kinds import Wait, Where, WhereAnswer

CELL_FILE = "<mpinb-cell-7>"
WORLD = {"identities": {rank: {"host": "here", "pid": 100 + rank} for rank in range(3)}, "size": 3, "mpi": "MPICH",
         "launcher": "mpiexec", "hosts": {"here": "0-2"}, "state": "running", "local": [0, 1, 2]}


def at(line, wait=None):
    return WhereAnswer(waiting=wait, frames=(("/x/site-packages/mpi4py/x.py", 1, "f"), (CELL_FILE, line, "<module>")),
                       cell_file=CELL_FILE)


def allreduce(seq, waited):
    return Wait("COMM_WORLD", (0, 1, 2), seq, ("allreduce", None, None, None), waited)


def running(model, now=0.0):
    model.cell_started(7, [0, 1, 2], "%%mpi\n...", now=now)
    return model


def test_the_rank_the_others_wait_for_is_named_with_the_reason():
    model = running(PanelModel())
    model.where(0, at(8, allreduce(5, 1.0)), now=1.0)
    model.where(1, at(7), now=1.0)
    model.where(2, at(8, allreduce(5, 0.9)), now=1.0)
    rows = model.snapshot(WORLD, now=1.5)["ranks"]
    assert [row["state"] for row in rows] == ["collective", "running", "collective"]
    assert rows[0]["text"] == "in allreduce #5 on COMM_WORLD since 1.5 s (In[7] at line 8)"
    assert rows[1]["text"] == "running In[7] at line 7"
    assert rows[1]["holding"] == ("holding up ranks 0, 2: they wait in allreduce #5 on COMM_WORLD for 1.5 s; it is "
                                  "still computing (line 7)")
    assert rows[0]["holding"] is None and rows[2]["holding"] is None


def test_an_answer_from_before_the_collective_completed_names_no_one():
    """Rank 0 is in #6 already: #5 completed, whatever rank 2's earlier answer says."""
    model = running(PanelModel())
    model.where(0, at(8, allreduce(6, 0.1)), now=1.0)
    model.where(1, at(7), now=1.0)
    model.where(2, at(8, allreduce(5, 1.2)), now=1.0)
    assert holding_up(model.cell, model.wheres, model.finished, 1.0) == {}


def test_a_short_wait_names_no_one_and_a_finished_rank_is_said_to_have_skipped_it():
    model = running(PanelModel())
    model.where(0, at(8, allreduce(5, 0.05)), now=1.0)
    assert holding_up(model.cell, model.wheres, model.finished, 1.0) == {}
    model.replied(2, failed=False)
    reasons = holding_up(model.cell, model.wheres, model.finished, 2.0)
    assert reasons[2].endswith("it finished the cell without calling it")
    assert reasons[1].endswith("it has not reached it")


def test_states_in_words_idle_paused_done_failed_dead():
    model = PanelModel()
    assert [row["text"] for row in model.snapshot(WORLD, dead={2: "its process ended"})["ranks"]] == \
        ["idle", "idle", "dead: its process ended"]
    running(model)
    model.prompt(0)
    model.replied(1, failed=True)
    model.where(2, WhereAnswer(frames=(("/usr/lib/python3.11/bdb.py", 90, "trace_dispatch"), (CELL_FILE, 4, "m")),
                               cell_file=CELL_FILE), now=0.0)
    texts = [row["text"] for row in model.snapshot(WORLD, now=0.5)["ranks"]]
    assert texts == ["paused at a debugger prompt in In[7]", "failed in In[7]", "paused at a breakpoint in In[7] at line 4"]
    model.cell_ended()
    assert [row["state"] for row in model.snapshot(WORLD)["ranks"]] == ["idle"] * 3


def test_losses_keep_the_last_values_of_the_loss_or_the_first_metric():
    model = PanelModel()
    model.metrics(0, [("main", step, 0.0, {"loss": 1.0 / (step + 1), "acc": 0.5}, 0.0) for step in range(100)])
    model.metrics(1, [("main", 0, 0.0, {"acc": 0.25}, 0.0), ("main", 1, 0.0, {"acc": float("nan")}, 0.0)])
    rows = model.snapshot(WORLD, usage={0: (50.0, 1 << 20)})["ranks"]
    assert len(rows[0]["losses"]) == 60 and rows[0]["losses"][-1] == 1.0 / 100 and rows[0]["loss_name"] == "loss"
    assert rows[1]["losses"] == [0.25] and rows[1]["loss_name"] == "acc"
    assert (rows[0]["cpu"], rows[0]["rss"]) == (50.0, 1 << 20) and rows[1]["cpu"] is None


def test_a_rank_on_another_host_shows_the_cpu_and_memory_it_told_in_its_answers():
    """The notebook cannot read the process of a rank on another host: each roll-call answer carries the rank's
    clock, CPU seconds and resident bytes, and the row shows its percent of one core between two answers."""
    model = running(PanelModel())
    world = {**WORLD, "local": [0, 1]}
    here = {0: (5.0, 1 << 20), 1: (6.0, 2 << 20)}
    model.where(2, dataclasses.replace(at(7), usage=(10.0, 1.0, 50 << 20, 102, None)), now=1.0)
    rows = model.snapshot(world, usage=here)["ranks"]
    assert [(row["cpu"], row["rss"]) for row in rows] == [(5.0, 1 << 20), (6.0, 2 << 20), (None, 50 << 20)]
    model.where(2, dataclasses.replace(at(7), usage=(10.5, 1.4, 60 << 20, 102, None)), now=1.5)
    model.where(0, dataclasses.replace(at(7), usage=(10.5, 9.0, 9 << 20, 100, None)), now=1.5)
    rows = model.snapshot(world, usage=here)["ranks"]
    assert (rows[2]["cpu"], rows[2]["rss"]) == (80.0, 60 << 20)
    assert (rows[0]["cpu"], rows[0]["rss"]) == (5.0, 1 << 20)  # a rank here: its process, read here
    model.where(2, dataclasses.replace(at(7), usage=(11.0, 0.1, 40 << 20, 202, None)), now=2.0)  # another process
    assert model.snapshot(world, usage=here)["ranks"][2]["cpu"] is None  # not the world's rank 2 (pid 102)
    restarted = {**world, "identities": {**world["identities"], 2: {"host": "there", "pid": 202}}}
    assert [model.snapshot(restarted, usage=here)["ranks"][2][key] for key in ("cpu", "rss")] == [None, 40 << 20]


def test_a_rank_that_uses_its_gpu_shows_the_memory_torch_holds_there_and_the_devices_use():
    """A rank whose code has used CUDA says, in each answer, the bytes torch's allocator holds on its device and
    the device's use (NVML's); a rank here shows them too, beside the CPU and memory read from its process."""
    model = running(PanelModel())
    model.where(0, dataclasses.replace(at(7), usage=(10.0, 1.0, 50 << 20, 100, (3 << 30, 45))), now=1.0)
    model.where(1, dataclasses.replace(at(7), usage=(10.0, 1.0, 50 << 20, 101, (1 << 30, None))), now=1.0)
    rows = model.snapshot(WORLD, usage={0: (5.0, 1 << 20)})["ranks"]
    assert [(row["gpu_memory"], row["gpu_use"]) for row in rows] == [(3 << 30, 45), (1 << 30, None), (None, None)]
    assert (rows[0]["cpu"], rows[0]["rss"]) == (5.0, 1 << 20)


@pytest.mark.mpi
def test_a_ranks_roll_call_answer_carries_what_its_process_used(world_of, mpi):
    """Asked by a roll call (the panel's, twice a second), each rank answers with its clock, its process's CPU
    seconds and its resident bytes, which agree with what the process table says of that rank."""
    world = world_of(2)
    mpi("import numpy as np\nheld = np.ones(64 << 17)  # 64 MB, touched")
    world.channel.roll_call([0, 1], CALLS + 17)
    answers = {}
    wait_for(lambda: answers.update({message.rank: message.where for message in world.channel.receive(0.2)
                                     if isinstance(message, Where) and message.where.asked == CALLS + 17})
             or len(answers) == 2, "both ranks' answers", 30)
    for rank, where in answers.items():
        process = psutil.Process(world.identities[rank]["pid"])
        clock, cpu, resident, pid, gpu = where.usage
        assert pid == process.pid and gpu is None  # no CUDA used
        assert 0 < cpu <= sum(process.cpu_times()[:2]) + 0.1, (cpu, process.cpu_times())
        assert 64 << 20 < resident and 0.5 < resident / process.memory_info().rss < 2, (resident, process.memory_info())
