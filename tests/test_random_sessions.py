"""Random sessions through a real kernel (Hypothesis's ``RuleBasedStateMachine``): starts, stops and restarts of
random sizes, cells that count on each rank, training loops that report (re-run), failing ranks, deadlocks with
``--timeout``, Stops at random moments (one, two, three in quick succession; during a cell, a start, a restart,
a stop), mismatched collectives, a dead rank, gathers with checked values, ``%mpi who``, malformed lines, floods,
``breakpoint()`` without stdin.

After every step: no hang (every request has a timeout), no frame of mpinb's or ipyparallel's in what the step
showed, each rank's counter as the model says wherever mpinb kept the world, ``%mpi status`` true to the world's
processes, and nothing left after a stop. ``make test`` runs a few sequences; ``make soak`` runs them for as long
as asked (``MPINB_SOAK_SECONDS``). The seed is printed; ``MPINB_SESSION_SEED=N`` replays a sequence."""

import os
import random
import time

import pytest
from conftest import new_world_tag
from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as with_seed
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from kernel_session import kernel
from world_record import still_running

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.notebook]

SIZES = st.integers(min_value=1, max_value=3)
# what a cell's text says when mpinb had to give the ranks' variables up, and when it ended the world
FRESH = ("was restarted with", "was ended", "restart was interrupted", "start of", "restart failed")


class Sessions(RuleBasedStateMachine):
    """One notebook session: the model is the world's size (``None``: no world and none remembered) and each rank's
    counter; ``fresh`` means the next cell starts a world (the last one ended, its size remembered)."""

    session = None  # the kernel, set by the test
    record = None
    steps = 0  # steps run, every sequence counted

    def __init__(self):
        super().__init__()
        self.size, self.counters, self.default = None, {}, 2
        self.run("%load_ext mpinb\n%config MPIMagics.default_ranks = 2\n%config MPIMagics.interrupt_grace = 3.0")
        self.run("%mpi stop")

    # ------------------------------------------------------------------ how each step is checked

    def run(self, code, **options):
        shown = self.session.run(code, timeout=150, **options)
        assert not shown.internal_frames(), f"internal frames after {code!r}:\n{shown.text}"
        self.last = shown
        return shown

    def lost_world(self, shown):
        """The model after a step that may have restarted or ended the world: counters gone if it says so."""
        if any(phrase in shown.text for phrase in FRESH):
            self.counters = {}

    @invariant()
    def status_is_true(self):
        Sessions.steps += 1
        self.check_status()

    def check_status(self):
        text = self.run("%mpi status").text
        running = still_running(self.record, timeout=0)
        if text.startswith("no MPI world is running"):
            # its processes end within the stop; give a killed rank's parent a moment to be reaped
            left = still_running(self.record, timeout=10)
            assert not left, f"%mpi status says no world, but {[p.pid for p in left]} of its processes run"
            if self.size is not None:
                self.counters = {}
        else:
            assert f"MPI world of {self.size} rank" in text, (self.size, text)
            assert running, f"%mpi status shows a world, but none of its processes runs:\n{text}"

    def ensure_size(self):
        """The size the next cell runs on (it starts a world of the remembered size, else the default)."""
        if self.size is None:
            self.size = self.default
        return self.size

    # ------------------------------------------------------------------ the world

    @rule(n=SIZES)
    def start(self, n):
        self.run("%mpi stop")
        shown = self.run(f"%mpi start -n {n}")
        assert shown.status == "ok", shown.text
        self.size, self.counters = n, {}
        self.check_status()

    @rule()
    def stop(self):
        shown = self.run("%mpi stop")
        assert shown.status == "ok", shown.text
        self.size, self.counters = None, {}
        assert not still_running(self.record, timeout=10)

    @rule()
    def restart(self):
        if self.size is None:
            return
        shown = self.run("%mpi restart")
        assert shown.status == "ok", shown.text
        self.counters = {}
        self.check_status()

    @rule(what=st.sampled_from(["%mpi start -n {n}", "%mpi restart", "%mpi stop", "%%mpi -n {n}\nrank"]),
          n=SIZES, at=st.floats(min_value=0.1, max_value=1.5), presses=st.integers(min_value=1, max_value=3))
    def stop_during_lifecycle(self, what, n, at, presses):
        if what.startswith("%mpi start") or what.startswith("%%mpi -n"):
            self.run("%mpi stop")
            self.size = None
        if what == "%mpi restart" and self.size is None:
            return
        shown = self.run(what.format(n=n), stops=[at + 0.15 * i for i in range(presses)])
        if what == "%mpi stop":
            assert shown.status == "ok", shown.text
            self.size, self.counters = None, {}
        else:
            if not what.startswith("%mpi restart"):
                self.size = n
            self.counters = {}
            assert shown.status == "ok" or shown.ename in ("StartInterrupted", "Interrupted"), shown.text
        self.check_status()

    # ------------------------------------------------------------------ cells

    @rule()
    def count(self):
        size = self.ensure_size()
        shown = self.run("%%mpi\ncounter = globals().get('counter', 0) + 1\ncounter")
        assert shown.status == "ok", shown.text
        if "started in" in shown.text:
            self.counters = {}
        for rank in range(size):
            expected = self.counters.get(rank, 0) + 1
            assert f"[rank {rank}] {expected}\n" in shown.text, (self.counters, shown.text)
            self.counters[rank] = expected

    @rule(steps=st.integers(min_value=1, max_value=30))
    def train(self, steps):
        self.ensure_size()
        shown = self.run(f"%%mpi\nimport mpinb\nfor step in range({steps}):\n"
                         "    mpinb.report(step=step, loss=1.0 / (step + 1 + rank))\ncomm.Barrier()")
        assert shown.status == "ok", shown.text
        if "started in" in shown.text:
            self.counters = {}

    @rule()
    def failing_rank(self):
        size = self.ensure_size()
        shown = self.run("%%mpi\nif rank == size - 1:\n    raise ValueError('bad batch')\ncomm.Barrier()")
        assert shown.status == "error" and "ValueError: bad batch" in shown.text, shown.text
        if "started in" in shown.text:
            self.counters = {}
        self.lost_world(shown)
        assert size == self.size

    @rule()
    def deadlock(self):
        self.ensure_size()
        shown = self.run("%%mpi --timeout 2\nif rank == 0:\n    comm.recv(source=size - 1, tag=77)\nelse:\n"
                         "    comm.Barrier()")
        assert shown.status == "error", shown.text
        if "started in" in shown.text:
            self.counters = {}
        self.lost_world(shown)

    @rule(at=st.floats(min_value=0.3, max_value=2.0), presses=st.integers(min_value=1, max_value=3),
          gap=st.floats(min_value=0.05, max_value=0.6))
    def stop_during_cell(self, at, presses, gap):
        self.ensure_size()
        shown = self.run("%%mpi\nimport time\ntime.sleep(20 if rank == 0 else 0.5)\ncomm.Barrier()",
                         stops=[at + gap * i for i in range(presses)])
        assert shown.status == "error" and shown.ename in ("Interrupted", "StartInterrupted"), shown.text
        if "started in" in shown.text:
            self.counters = {}
        self.lost_world(shown)
        self.check_status()

    @rule()
    def mismatch(self):
        size = self.ensure_size()
        shown = self.run("%%mpi\nimport numpy as np\na = np.zeros(1)\ncomm.Bcast(a, root=rank % 2)")
        if size > 1:
            assert shown.status == "error" and "CollectiveMismatch" in shown.text, shown.text
        if "started in" in shown.text:
            self.counters = {}
        self.lost_world(shown)  # restarted when MPI completed it; kept when the ranks were let out

    @rule()
    def dead_rank(self):
        size = self.ensure_size()
        shown = self.run(f"%%mpi\nimport os\nif rank == {size - 1}:\n    os._exit(3)\ncomm.Barrier()")
        assert shown.status == "error", shown.text
        shown = self.run("%mpi restart")
        assert shown.status == "ok", shown.text
        self.counters = {}

    @rule(length=st.integers(min_value=0, max_value=4))
    def gather(self, length):
        size = self.ensure_size()
        shown = self.run(f"%%mpi --gather v --no-inspect\nimport numpy as np\nv = np.arange(rank * {length}, "
                         f"(rank + 1) * {length})")
        assert shown.status == "ok", shown.text
        if "started in" in shown.text:
            self.counters = {}
        shown = self.run("print(sorted((r, [int(x) for x in a]) for r, a in v.items()))")
        expected = sorted((r, list(range(r * length, (r + 1) * length))) for r in range(size))
        assert shown.text.strip() == str(expected), shown.text

    @rule()
    def who(self):
        if self.size is None:
            return
        shown = self.run("%mpi who")
        assert shown.status == "ok" or "no MPI world is running" in shown.text, shown.text

    @rule(line=st.sampled_from(["%mpi start -n x", "%mpi start -n 0", "%mpi bogus", "%%mpi --ranks 9\nrank",
                                "%%mpi --timeout -1\nrank", "%%mpi --gather 1x\nrank", "%mpi debug 99"]))
    def malformed(self, line):
        shown = self.run(line)
        assert shown.status == "error" and shown.ename == "UsageError", shown.text
        if "started in" in shown.text:  # %%mpi starts a world before it reads --ranks against its size
            self.ensure_size()
            self.counters = {}

    @rule()
    def flood(self):
        self.ensure_size()
        shown = self.run("%%mpi --no-stream\nfor i in range(3000):\n    print(rank, i)")
        assert shown.status == "ok" and f"{self.size - 1} 2999" in shown.text, shown.text[-500:]
        if "started in" in shown.text:
            self.counters = {}

    @rule()
    def breakpoint_without_stdin(self):
        self.ensure_size()
        shown = self.run("%%mpi\nif rank == 0:\n    breakpoint()\ncomm.Barrier()\n'on'", allow_stdin=False)
        assert shown.status == "ok" and "[rank 0] 'on'" in shown.text, shown.text
        if "started in" in shown.text:
            self.counters = {}

    def teardown(self):
        self.run("%mpi stop")
        left = still_running(self.record, timeout=10)
        assert not left, f"processes left after %mpi stop: {[p.pid for p in left]}"


def run_sessions(examples, steps, seed, deadline=None):
    print(f"\nrandom sessions: seed {seed}, {examples} sequences of up to {steps} steps "
          f"(replay: MPINB_SESSION_SEED={seed})", flush=True)
    Sessions.record = new_world_tag()
    with kernel() as session:
        Sessions.session = session
        run_state_machine_as_test(with_seed(seed)(Sessions), settings=settings(
            max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
            phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
    assert not still_running(Sessions.record, timeout=10)


@pytest.mark.timeout(1200)
def test_random_sessions_keep_every_promise():
    """A few sequences (``MPINB_SESSION_EXAMPLES`` of ``MPINB_SESSION_STEPS``); with ``MPINB_SOAK_SECONDS``
    (``make soak``), sequences of 25-40 steps with new seeds until that many seconds have passed."""
    soak = float(os.environ.get("MPINB_SOAK_SECONDS") or 0)
    if os.environ.get("MPINB_SESSION_SEED") or not soak:
        seed = int(os.environ.get("MPINB_SESSION_SEED") or random.randrange(2**32))
        run_sessions(int(os.environ.get("MPINB_SESSION_EXAMPLES", 2)),
                     int(os.environ.get("MPINB_SESSION_STEPS", 12)), seed)
        return
    end, sequences, Sessions.steps = time.monotonic() + soak, 0, 0
    while time.monotonic() < end:
        run_sessions(1, random.randint(25, 40), random.randrange(2**32))
        sequences += 1
    print(f"random sessions: {sequences} sequences, {Sessions.steps} steps in {soak:g} s found nothing")
