"""Bad input loses nothing: every ``%mpi inject`` argument and every ``%config MPIMagics`` setting is checked where
it is given, refused in one line that says what is allowed, and nothing of the refused value reaches the ranks."""

import logging
import math

import pytest
from IPython.core.error import UsageError

from mpinb.rank import faults

# a collective every step: a fault planted on a rank would act here
LOOP = """
import numpy as np
grads = np.ones(4)
for step in range(3):
    comm.Allreduce(MPI.IN_PLACE, grads)
    loss = comm.allreduce(1.0)
"""

BAD_INJECTIONS = [
    ("straggler --rank 1 --delay -5", "--delay takes a number of seconds from 0 to 3600, not -5.0"),
    ("straggler --rank 1 --delay nan", "--delay takes a number of seconds from 0 to 3600, not nan"),
    ("straggler --rank 1 --delay inf", "--delay takes a number of seconds from 0 to 3600, not inf"),
    ("straggler --rank 1 --delay=-inf", "--delay takes a number of seconds from 0 to 3600, not -inf"),
    ("straggler --rank 1 --delay 1e300", "--delay takes a number of seconds from 0 to 3600, not 1e+300"),
    ("straggler --rank 1 --delay soon", "--delay takes a number of seconds from 0 to 3600, not 'soon'"),
    ("perturb --rank 1 --scale inf", "--scale takes a standard deviation, a finite number >= 0, not inf"),
    ("perturb --rank 1 --scale -1", "--scale takes a standard deviation, a finite number >= 0, not -1.0"),
    ("perturb --rank 1 --scale nan", "--scale takes a standard deviation, a finite number >= 0, not nan"),
    ("kill --rank 1 --at 0", "--at takes the collective it acts at, counted from 1 (the next one), not 0"),
    ("nan --rank 1 --at -3", "--at takes the collective it acts at, counted from 1 (the next one), not -3"),
    ("stall --rank 1 --at 1.5", "--at takes the collective it acts at, counted from 1 (the next one), not '1.5'"),
]


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("line", "said"), BAD_INJECTIONS, ids=[line for line, _ in BAD_INJECTIONS])
def test_a_bad_inject_value_is_refused_in_one_line_and_plants_nothing(ip, world_of, mpi, capsys, line, said):
    world_of(2)
    ip.run_line_magic("mpi", "inject clear")
    mpi("kept = rank * 7")
    with pytest.raises(UsageError) as raised:
        ip.run_line_magic("mpi", f"inject {line}")
    message = str(raised.value)
    assert message == f"%mpi inject: {said}", message
    capsys.readouterr()
    ip.run_line_magic("mpi", "inject")
    assert "no fault is planted" in capsys.readouterr().out
    mpi(LOOP)  # every rank's collectives run as written
    assert mpi("step") == {0: 2, 1: 2}
    assert mpi("kept") == {0: 0, 1: 7}


BAD_PLANTS = [
    (dict(kind="straggler", delay=-5), "delay takes a number of seconds from 0 to 3600, not -5"),
    (dict(kind="straggler", delay=math.nan), "delay takes a number of seconds from 0 to 3600, not nan"),
    (dict(kind="straggler", delay=1e12), "delay takes a number of seconds from 0 to 3600, not 1000000000000.0"),
    (dict(kind="perturb", scale=math.inf), "scale takes a standard deviation, a finite number >= 0, not inf"),
    (dict(kind="perturb", scale=-0.5), "scale takes a standard deviation, a finite number >= 0, not -0.5"),
    (dict(kind="kill", at=0), "at takes the collective it acts at, counted from 1 (the next one), not 0"),
    (dict(kind="nan", at=-3), "at takes the collective it acts at, counted from 1 (the next one), not -3"),
    (dict(kind="stall", at=2.5), "at takes the collective it acts at, counted from 1 (the next one), not 2.5"),
]


@pytest.mark.parametrize(("options", "said"), BAD_PLANTS, ids=[str(options) for options, _ in BAD_PLANTS])
def test_plant_on_a_rank_refuses_what_would_raise_in_a_collective(options, said):
    """``faults.plant`` is called on a rank directly as well (it needs no notebook): it checks for itself."""
    faults.clear()
    try:
        with pytest.raises(ValueError) as raised:
            faults.plant(**options)
        assert str(raised.value) == said
        assert faults.planted() == [] and not faults.active
        faults.before()  # a collective: nothing planted acts
    finally:
        faults.clear()


# (setting, a bad value as %config reads it, what the one-line error says is allowed)
BAD_SETTINGS = [
    ("default_ranks", "-4", "a number of ranks >= 1"),
    ("default_ranks", "0", "a number of ranks >= 1"),
    ("snapshot_limit", "-1", "a number of bytes >= 0"),
    ("snapshot_lag", "-1", "a finite number of seconds >= 0 (0: each cell waits for the last snapshot)"),
    ("snapshot_lag", "float('nan')", "a finite number of seconds >= 0 (0: each cell waits for the last snapshot)"),
    ("interrupt_grace", "-1", "a finite number of seconds >= 0"),
    ("interrupt_grace", "float('inf')", "a finite number of seconds >= 0"),
    ("abort_grace", "float('nan')", "a finite number of seconds (negative: wait for them)"),
    ("abort_grace", "float('-inf')", "a finite number of seconds (negative: wait for them)"),
    ("collective_wait", "-0.5", "a finite number of seconds >= 0 (0: never ask)"),
    ("collective_wait", "float('nan')", "a finite number of seconds >= 0 (0: never ask)"),
    ("report_interval", "-1", "a finite number of seconds >= 0"),
    ("report_interval", "float('inf')", "a finite number of seconds >= 0"),
    ("refresh_interval", "float('nan')", "a finite number of seconds >= 0"),
    ("max_points", "1", "a number of points per curve >= 2"),
    ("trace_buffer", "0", "a number of spans >= 1"),
    ("heartbeat_ms", "-100", "a number of milliseconds >= 0 (0: 100 ms, longer for worlds over 12 ranks)"),
    ("start_timeout", "0", "a finite number of seconds > 0"),
    ("start_timeout", "float('inf')", "a finite number of seconds > 0"),
    ("status_after", "-1", "a finite number of seconds >= 0 (0: never)"),
    ("status_after", "float('nan')", "a finite number of seconds >= 0 (0: never)"),
    ("timeout", "-3", "a finite number of seconds >= 0 (0: no limit)"),
    ("timeout", "float('inf')", "a finite number of seconds >= 0 (0: no limit)"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "value", "allowed"), BAD_SETTINGS,
                         ids=[f"{name}={value}" for name, value, _ in BAD_SETTINGS])
def test_a_bad_setting_is_refused_where_it_is_given_and_the_setting_stays(ip, magics, caplog, name, value, allowed):
    before = getattr(magics, name)
    try:
        with caplog.at_level(logging.ERROR):
            ip.run_line_magic("config", f"MPIMagics.{name} = {value}")  # %config logs what the setting raised
        errors = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
        shown = repr(type(before)(eval(value)))  # noqa: S307 - the test's own literals, as the setting holds them
        assert errors == [f"MPIMagics.{name} takes {allowed}, not {shown}"], errors
        assert getattr(magics, name) == before
    finally:
        setattr(magics, name, before)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "value"), [
    ("abort_grace", -1.0), ("threads_per_rank", -1), ("threads_per_rank", 0), ("status_after", 0.0),
    ("collective_wait", 0.0), ("snapshot_lag", 0.0), ("timeout", 0.0), ("heartbeat_ms", 0), ("snapshot_limit", 0),
    ("default_ranks", 1), ("max_points", 2), ("trace_buffer", 1),
])
def test_documented_special_values_are_still_taken(ip, magics, caplog, name, value):
    before = getattr(magics, name)
    try:
        with caplog.at_level(logging.ERROR):
            ip.run_line_magic("config", f"MPIMagics.{name} = {value!r}")
        assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []
        assert getattr(magics, name) == value
    finally:
        setattr(magics, name, before)


def test_every_default_is_a_value_its_setting_takes(magics):
    for name, trait in magics.traits(config=True).items():
        before = getattr(magics, name)
        try:
            setattr(magics, name, trait.default())  # validated as a value given with %config is
        finally:
            setattr(magics, name, before)
