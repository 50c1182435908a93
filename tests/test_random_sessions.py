"""Random sessions through a real kernel, a state machine driven by a seeded random choice of action: starts,
stops and restarts of random sizes, cells that count on each rank, training loops that report (re-run), failing
ranks, deadlocks with ``--timeout``, Stops at random moments (one, two, three in quick succession; during a cell,
a start, a restart, a stop, as a cell ends), mismatched collectives, a dead rank, gathers with checked values,
``%mpi who``, malformed lines, floods, ``breakpoint()`` without stdin.

After every step: every request answered (each has a timeout), no frame of mpinb's or ipyparallel's in what the
step showed, each rank's counter as the model says wherever mpinb kept the world or restored it (read on the
ranks after every restart), ``%mpi status`` true to the world's processes, and nothing left after a stop. ``make
test`` runs a few sequences; ``make soak`` runs them for as long as asked (``MPINB_SOAK_SECONDS``). The seed is
printed; ``MPINB_SESSION_SEED=N`` replays a sequence, and a failure lists the steps that led to it.

(Hypothesis's ``RuleBasedStateMachine`` was tried first: without its shrinking, which would replay sessions for
hours, its generator ran one action 30 times over in most sequences; a uniform choice per step covers them all.)"""

import os
import random
import re
import time

import pytest
from conftest import new_world_tag
from kernel_session import jupyter_client_kernel
from world_record import still_running

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.notebook]

VERBOSE = bool(os.environ.get("MPINB_SESSION_VERBOSE"))  # each request of each step, as it ends
# what a cell's text says when mpinb had to give the ranks' variables up, and when it ended the world
FRESH = ("was started again with", "was ended", "restart was interrupted", "start of", "restart failed",
         "restore was stopped")
# what every restart (the user's or mpinb's own) says it put back: the cell, and the names (a line of its own after
# %mpi restart; among the cell's error's notes, without the [mpinb] mark, after mpinb's own restart)
RESTORED = re.compile(r"^(?:\[mpinb\] )?restored every rank's variables as of In\[(\d+)\], the last cell every "
                      r"rank finished and kept: (.*) \(", re.M)


class Sessions:
    """One notebook session: the model is the world's size (``None``: no world and none remembered) and each rank's
    counter, and each rank's counter as of the end of every earlier request (a restart after a death puts back the
    variables of the last cell every rank finished and kept, which one it says)."""

    session = None  # the kernel, set by the test
    record = None
    steps = 0  # steps run, every sequence counted

    def __init__(self):
        self.size, self.counters, self.default = None, {}, 2
        self.as_of, self.previous = {}, None  # In[number] -> the counters after it; the last request's number
        self.run("%load_ext mpinb\n%config MPIMagics.default_ranks = 2\n%config MPIMagics.interrupt_grace = 3.0")
        self.run("%mpi stop")

    # ------------------------------------------------------------------ how each step is checked

    def run(self, code, **options):
        # the model's counters now are those after the request before this one (each step updates them after its
        # request returns)
        self.as_of[self.previous] = dict(self.counters)
        shown = self.session.run(code, timeout=150, **options)
        self.previous = shown.number
        if VERBOSE:
            print(f"  {code!r:.60} {options.get('stops', '')}: {shown.status} {shown.ename or ''} "
                  f"{shown.seconds:.1f} s", flush=True)
        assert not shown.internal_frames(), f"internal frames after {code!r}:\n{shown.text}"
        self.last = shown
        return shown

    def lost_world(self, shown):
        """The model after a step that may have started the world again or ended it: the counters it says it
        restored (checked on the ranks at once); none while no world runs (the next start says what it
        restores)."""
        if RESTORED.search(shown.text):
            self.restarted(shown)
            self.check_counters()
        elif any(phrase in shown.text for phrase in FRESH):
            self.counters = {}

    def check_counters(self):
        """Every rank's counter is what the model says (0 where it has none), read without changing it."""
        shown = self.run("%%mpi\nglobals().get('counter', 0)")
        assert shown.status == "ok", shown.text
        for rank in range(self.size):
            assert f"[rank {rank}] {self.counters.get(rank, 0)}\n" in shown.text, (self.counters, shown.text)

    def after_start(self, shown):
        """The model after a cell that started a world first: the counters that start says it restored, if any."""
        if "started in" in shown.text:
            self.restarted(shown)

    def restarted(self, shown):
        """The model after a world came up again (``%mpi restart``, mpinb's own restart, the next cell after the
        world ended): the counters as of the cell it says it restored (when ``counter`` was among the names kept
        then), else fresh ranks."""
        assert "could not restore" not in shown.text, shown.text
        restored = RESTORED.search(shown.text)
        if restored is None:
            self.counters = {}
            return
        number, names = int(restored.group(1)), restored.group(2).split(", ")
        self.counters = dict(self.as_of[number]) if "counter" in names else {}

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

    def start(self, n):
        self.run("%mpi stop")
        shown = self.run(f"%mpi start -n {n}")
        assert shown.status == "ok", shown.text
        self.size, self.counters = n, {}
        self.check_status()

    def stop(self):
        shown = self.run("%mpi stop")
        assert shown.status == "ok", shown.text
        self.size, self.counters = None, {}
        assert not still_running(self.record, timeout=10)

    def restart(self):
        if self.size is None:
            return
        shown = self.run("%mpi restart")
        assert shown.status == "ok", shown.text
        self.restarted(shown)
        self.check_counters()
        self.check_status()

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
            if what.startswith("%mpi restart") and shown.status == "ok":
                self.restarted(shown)
            else:
                self.counters = {}
            assert shown.status == "ok" or shown.ename in ("StartInterrupted", "Interrupted"), shown.text
        self.check_status()

    # ------------------------------------------------------------------ cells

    def count(self):
        size = self.ensure_size()
        shown = self.run("%%mpi\ncounter = globals().get('counter', 0) + 1\ncounter")
        assert shown.status == "ok", shown.text
        self.after_start(shown)
        for rank in range(size):
            expected = self.counters.get(rank, 0) + 1
            assert f"[rank {rank}] {expected}\n" in shown.text, (self.counters, shown.text)
            self.counters[rank] = expected

    def train(self, steps):
        self.ensure_size()
        shown = self.run(f"%%mpi\nimport mpinb\nfor step in range({steps}):\n"
                         "    mpinb.report(step=step, loss=1.0 / (step + 1 + rank))\ncomm.Barrier()")
        assert shown.status == "ok", shown.text
        self.after_start(shown)

    def failing_rank(self):
        size = self.ensure_size()
        shown = self.run("%%mpi\nif rank == size - 1:\n    raise ValueError('bad batch')\ncomm.Barrier()")
        assert shown.status == "error" and "ValueError: bad batch" in shown.text, shown.text
        self.after_start(shown)
        self.lost_world(shown)
        assert size == self.size

    def deadlock(self):
        self.ensure_size()
        shown = self.run("%%mpi --timeout 2\nif rank == 0:\n    comm.recv(source=size - 1, tag=77)\nelse:\n"
                         "    comm.Barrier()")
        assert shown.status == "error", shown.text
        self.after_start(shown)
        self.lost_world(shown)

    def stop_during_cell(self, at, presses, gap):
        self.ensure_size()
        shown = self.run("%%mpi\nimport time\ntime.sleep(20 if rank == 0 else 0.5)\ncomm.Barrier()",
                         stops=[at + gap * i for i in range(presses)])
        assert shown.status == "error" and shown.ename in ("Interrupted", "StartInterrupted"), shown.text
        self.after_start(shown)
        self.lost_world(shown)
        self.check_status()

    def mismatch(self):
        size = self.ensure_size()
        shown = self.run("%%mpi\nimport numpy as np\na = np.zeros(1)\ncomm.Bcast(a, root=rank % 2)")
        if size > 1:
            assert shown.status == "error" and "CollectiveMismatch" in shown.text, shown.text
        self.after_start(shown)
        self.lost_world(shown)  # restarted when MPI completed it; kept when the ranks were let out

    def dead_rank(self):
        size = self.ensure_size()
        shown = self.run(f"%%mpi\nimport os\nif rank == {size - 1}:\n    os._exit(3)\ncomm.Barrier()")
        assert shown.status == "error", shown.text
        shown = self.run("%mpi restart")
        assert shown.status == "ok", shown.text
        self.restarted(shown)
        self.check_counters()

    def stop_as_cell_ends(self, delay):
        """A Stop that lands as the ranks finish, or after: while the notebook shows the result, seals its views,
        runs post-run callbacks or sends the reply. The request is answered either way."""
        self.ensure_size()
        shown = self.run("%%mpi\nimport mpinb\nmpinb.report(step=0, loss=1.0)\nprint('done', rank)", after="done",
                         stops=(delay,))
        assert shown.status == "ok" or shown.ename in ("Interrupted", "KeyboardInterrupt"), shown.text
        self.after_start(shown)
        self.lost_world(shown)

    def gather(self, length):
        size = self.ensure_size()
        shown = self.run(f"%%mpi --gather v --no-inspect\nimport numpy as np\nv = np.arange(rank * {length}, "
                         f"(rank + 1) * {length})")
        assert shown.status == "ok", shown.text
        self.after_start(shown)
        shown = self.run("print(sorted((r, [int(x) for x in a]) for r, a in v.items()))")
        expected = sorted((r, list(range(r * length, (r + 1) * length))) for r in range(size))
        assert shown.text.strip() == str(expected), shown.text

    def who(self):
        if self.size is None:
            return
        shown = self.run("%mpi who")
        assert shown.status == "ok" or "no MPI world is running" in shown.text, shown.text

    def malformed(self, line):
        shown = self.run(line)
        assert shown.status == "error" and shown.ename == "UsageError", shown.text
        if "started in" in shown.text:  # %%mpi starts a world before it reads --ranks against its size
            self.ensure_size()
            self.after_start(shown)

    def flood(self):
        self.ensure_size()
        shown = self.run("%%mpi --no-stream\nfor i in range(3000):\n    print(rank, i)")
        assert shown.status == "ok" and f"{self.size - 1} 2999" in shown.text, shown.text[-500:]
        self.after_start(shown)

    def breakpoint_without_stdin(self):
        self.ensure_size()
        shown = self.run("%%mpi\nif rank == 0:\n    breakpoint()\ncomm.Barrier()\n'on'", allow_stdin=False)
        assert shown.status == "ok" and "[rank 0] 'on'" in shown.text, shown.text
        self.after_start(shown)

    def teardown(self):
        self.run("%mpi stop")
        left = still_running(self.record, timeout=10)
        assert not left, f"processes left after %mpi stop: {[p.pid for p in left]}"


LIFECYCLE = ["%mpi start -n {n}", "%mpi restart", "%mpi stop", "%%mpi -n {n}\nrank"]
MALFORMED = ["%mpi start -n x", "%mpi start -n 0", "%mpi bogus", "%%mpi --ranks 9\nrank", "%%mpi --timeout -1\nrank",
             "%%mpi --gather 1x\nrank", "%mpi debug 99", "%mpi start -n \u0661\u0662", "%mpi start --mpi ''"]

# every action a step may take, and how its arguments are drawn
ACTIONS = {
    "start": lambda rng: {"n": rng.randint(1, 3)},
    "stop": lambda rng: {},
    "restart": lambda rng: {},
    "stop_during_lifecycle": lambda rng: {"what": rng.choice(LIFECYCLE), "n": rng.randint(1, 3),
                                          "at": round(rng.uniform(0.1, 1.5), 2), "presses": rng.randint(1, 3)},
    "count": lambda rng: {},
    "train": lambda rng: {"steps": rng.randint(1, 30)},
    "failing_rank": lambda rng: {},
    "deadlock": lambda rng: {},
    "stop_during_cell": lambda rng: {"at": round(rng.uniform(0.3, 2.0), 2), "presses": rng.randint(1, 3),
                                     "gap": round(rng.uniform(0.05, 0.6), 2)},
    "mismatch": lambda rng: {},
    "dead_rank": lambda rng: {},
    "gather": lambda rng: {"length": rng.randint(0, 4)},
    "who": lambda rng: {},
    "malformed": lambda rng: {"line": rng.choice(MALFORMED)},
    "flood": lambda rng: {},
    "breakpoint_without_stdin": lambda rng: {},
    "stop_as_cell_ends": lambda rng: {"delay": round(rng.uniform(0.0, 0.3), 3)},
}


def run_sequence(session, seed, steps):
    """*steps* random actions from *seed*, the invariants checked after each; an AssertionError lists the steps."""
    rng, done = random.Random(seed), []
    print(f"\nrandom sessions: seed {seed}, {steps} steps (replay: MPINB_SESSION_SEED={seed} "
          f"MPINB_SESSION_STEPS={steps})", flush=True)
    try:
        model = Sessions()
        for _ in range(steps):
            name = rng.choice(sorted(ACTIONS))
            arguments = ACTIONS[name](rng)
            done.append(f"{name}({', '.join(f'{key}={value!r}' for key, value in arguments.items())})")
            getattr(model, name)(**arguments)
            model.status_is_true()
        done.append("teardown()")
        model.teardown()
    except BaseException as exc:
        steps_text = "\n".join(f"  {index}. {step}" for index, step in enumerate(done, 1))
        raise AssertionError(f"seed {seed}, step {len(done)} of:\n{steps_text}\n{type(exc).__name__}: {exc}") from exc


def run_sessions(seeds, steps):
    """One kernel, a sequence per seed; nothing of their worlds left at the end."""
    Sessions.record = new_world_tag()
    with jupyter_client_kernel() as session:
        Sessions.session = session
        for seed in seeds:
            run_sequence(session, seed, steps if steps else random.Random(seed).randint(25, 40))
    assert not still_running(Sessions.record, timeout=10)
    print(f"random sessions: {Sessions.steps} steps so far", flush=True)


@pytest.mark.timeout(1200 + float(os.environ.get("MPINB_SOAK_SECONDS") or 0))
def test_random_sessions_keep_every_promise():
    """``MPINB_SESSION_EXAMPLES`` sequences (2) of ``MPINB_SESSION_STEPS`` steps (15); with ``MPINB_SOAK_SECONDS``
    (``make soak``), sequences of 25-40 steps with new seeds until that many seconds have passed."""
    soak = float(os.environ.get("MPINB_SOAK_SECONDS") or 0)
    steps = int(os.environ.get("MPINB_SESSION_STEPS") or 0)
    if os.environ.get("MPINB_SESSION_SEED"):
        run_sessions([int(os.environ["MPINB_SESSION_SEED"])], steps)
        return
    if not soak:
        run_sessions([random.randrange(2**32) for _ in range(int(os.environ.get("MPINB_SESSION_EXAMPLES", 2)))],
                     steps or 15)
        return
    end, sequences, Sessions.steps = time.monotonic() + soak, 0, 0
    while time.monotonic() < end:
        run_sessions([random.randrange(2**32)], 0)
        sequences += 1
    print(f"random sessions: {sequences} sequences, {Sessions.steps} steps in {soak:g} s found nothing")
