"""How soon a fault on another host fails the cell, naming the rank or the host.

    python benchmarks/remote_faults.py [--runs 3] [--markdown PATH]

Three real hosts on this machine (tests/hosts.py: network + UTS namespaces h0, h1, h2 joined by veth links
through a bridge, each with its own address and sshd). The notebook's side runs inside h0
(tests/multihost_driver.py: an IPython shell with mpinb loaded, running ``%mpi`` and ``%%mpi`` as a user does
and noting when each ended); 2 ranks on each of h1 and h2, started over ssh, ``--ip`` on h0's address. Each run
starts a fresh world for each case, in turn:

  killed, MPICH     Hydra's mpiexec; rank 3 (on h2) notes the time and kills itself with SIGKILL while every
                    rank runs the cell (``--timeout 120``): from its kill to the cell's error;
  killed, Open MPI  the same under Debian's Open MPI (its mpirun names the rank and the signal);
  partition         MPICH; h2's link to the bridge is taken down, then a cell starts whose ranks wait in a
                    barrier: from the link going down to the cell's error.

Every host shares this machine's clock, so a time noted on h2 and one noted on h0 compare. Each error is
checked for what it must say (the rank and its host; for the partition, the host and that heartbeats stopped).
The cut-off host's processes are killed by pid after each partition (left alone they end on their own, a minute
or more later), and the hosts are torn down at the end.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from hosts import hosts_or_exit, setup_across, wait_for  # noqa: E402
from results import publish  # noqa: E402

MARK = "<!-- remote faults -->"
DRIVER = HERE.parent / "tests" / "multihost_driver.py"
OPENMPI = "/usr/bin/mpiexec.openmpi"
LIMITS = {"killed, MPICH": 5.0, "killed, Open MPI": 5.0, "partition": 10.0}


def notebook(hosts, steps, openmpi=False):
    """The notebook's side on h0 with *steps*, 2 ranks on each of h1 and h2 (as tests/test_multihost.py)."""
    setup = setup_across(hosts, openmpi=OPENMPI if openmpi else None)
    return [sys.executable, str(DRIVER), json.dumps({"setup": setup, "steps": steps})]


def drive(hosts, steps, openmpi=False):
    done = hosts.output(0, notebook(hosts, steps, openmpi), timeout=240)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"the notebook's side printed no result:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))["steps"]


def killed(hosts, openmpi):
    mark = hosts.dir / "killed-at"
    mark.unlink(missing_ok=True)
    code = (f"import os, time\nif rank == 3:\n    time.sleep(1)\n    open({str(mark)!r}, 'w').write(repr(time.time()))"
            "\n    os.kill(os.getpid(), 9)\ntime.sleep(100)")
    start, cell = drive(hosts, [["line", "start -n 4"], ["cell", "--timeout 120", code]], openmpi)
    if start["raised"]:
        raise RuntimeError(f"the world did not start: {start['raised']}")
    name, text = cell["raised"] or (None, "")
    line = text.splitlines()[1] if text.count("\n") else text
    if name != "RankError" or not line.startswith(f"rank 3: RankLost: rank 3 died: its process on {hosts.names[2]}"):
        raise RuntimeError(f"the cell did not name rank 3 and its host first: {cell['raised']}")
    return cell["ended"] - float(mark.read_text()), line


def partition(hosts):
    pull = f"__import__('subprocess').run(['ip', '-n', {hosts.switch!r}, 'link', 'set', 'p2', 'down']).returncode"
    try:
        start, pulled, cell = drive(hosts, [["line", "start -n 4"], ["eval", pull],
                                            ["cell", "--timeout 60", "import time\ncomm.Barrier()\ntime.sleep(100)"]])
    finally:
        hosts.link_up(2)
        for pid in hosts.pids_on(2):  # the cut-off ranks and their ssh daemons' children: ours, by pid
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        wait_for(lambda: not hosts.pids_on(2), "no process left on the cut-off host", 30)
    if start["raised"] or pulled["value"] != "0":
        raise RuntimeError(f"the world did not start or the link stayed up: {start['raised']}, {pulled['value']}")
    name, text = cell["raised"] or (None, "")
    if name != "RankError" or hosts.names[2] not in text or "stopped answering ipyparallel's heartbeats" not in text:
        raise RuntimeError(f"the cell did not name the cut-off host: {cell['raised']}")
    return cell["ended"] - pulled["ended"], next(line for line in text.splitlines() if hosts.names[2] in line)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs of each case (default 3)")
    parser.add_argument("--markdown", help="also put the table in this file (its own section)")
    args = parser.parse_args()
    if args.markdown and not Path(args.markdown).exists():
        Path(args.markdown).touch()
    cases = {"killed, MPICH": lambda h: killed(h, False), "partition": partition}
    if Path(OPENMPI).exists():
        cases["killed, Open MPI"] = lambda h: killed(h, True)
    times, said = {name: [] for name in cases}, {}
    hosts = hosts_or_exit(3)
    try:
        for run in range(args.runs):
            for name, case in cases.items():
                seconds, said[name] = case(hosts)
                times[name].append(seconds)
                print(f"run {run + 1}/{args.runs}, {name}: {seconds:.2f} s: {said[name]}", flush=True)
    finally:
        hosts.close()
    rows = ["| fault on h2 (2 ranks on each of h1, h2) | the cell's error after the fault, median (runs) | limit "
            "| median / limit | the error's line naming it |", "|---|---|---|---|---|"]
    for name, values in times.items():
        median = statistics.median(values)
        runs = ", ".join(f"{v:.2f}" for v in values)
        rows.append(f"| {name} | {median:.2f} s ({runs}) | {LIMITS[name]:.0f} s | {median / LIMITS[name]:.2f} "
                    f"| `{said[name]}` |")
    command = "python benchmarks/remote_faults.py" + (f" --runs {args.runs}" if args.runs != 3 else "")
    header = (f"{MARK}\n## Faults on another host\n\n`{command}`, {datetime.date.today()}, {platform.node()}, "
              f"{os.cpu_count()} cores: hosts h0-h2 are network namespaces on this machine (tests/hosts.py), the "
              f"notebook on h0, ranks started over ssh; a fresh world per case and run.\n\n")
    publish(header + "\n".join(rows) + f"\n{MARK}", args.markdown, MARK)


if __name__ == "__main__":
    main()
