"""The notebook's side of a world across the test hosts (tests/hosts.py): tests/multihost_driver.py run on host 0
with the steps given, its ranks on others reached over ssh."""

import json
import sys
from pathlib import Path

from hosts import setup_across

DRIVER = Path(__file__).with_name("multihost_driver.py")


def notebook(hosts, steps, *, ranks=(1, 2), per_host=2, **setup):
    """The command that runs the notebook's side on host 0 with *steps*, and ``per_host`` ranks on each of
    *ranks*' hosts (``hosts.setup_across``: Hydra's, or with ``default_mpi="openmpi"`` in *setup* Debian's Open
    MPI and its ssh options)."""
    openmpi = setup.get("mpiexec") if setup.get("default_mpi") == "openmpi" else None
    config = {"setup": {**setup_across(hosts, ranks, per_host, openmpi=openmpi), **setup}, "steps": steps}
    return [sys.executable, str(DRIVER), json.dumps(config)]


def drive(hosts, steps, *, ranks=(1, 2), per_host=2, timeout=240, leftovers=True, **setup):
    """Run *steps* on host 0 against a world of ``per_host`` ranks on each of *ranks*' hosts; the parsed result.
    With *leftovers*, afterwards no process of the world is left on any host."""
    done = hosts.output(0, notebook(hosts, steps, ranks=ranks, per_host=per_host, **setup), timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the notebook's side printed no result:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    if leftovers:
        assert hosts.left_behind() == {}
    return json.loads(lines[-1].removeprefix("RESULT "))
