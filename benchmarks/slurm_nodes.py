"""A world through Slurm across nodes against Hydra over ssh on the same hosts: start, round trip, a lost node.

    python benchmarks/slurm_nodes.py [--reps 5] [--markdown benchmarks/RESULTS.md]

Three real hosts on this machine (tests/hosts.py: network + UTS namespaces h0, h1, h2); Slurm across them
(tests/slurm_cluster.py ``SlurmNodes``: slurmctld on h0, a slurmd on each of h1 and h2). The notebook's side runs
on h0 (tests/multihost_driver.py), 4 ranks on h1 and h2, 2 each, the arms alternating --reps times:
  slurm   ``%mpi start -n 4 --launcher slurm`` with ``--nodes=2``: sbatch, then MPICH's Hydra inside the job
          starting its proxies through srun;
  ssh     ``%mpi start -n 4 --launcher ssh`` with a hostfile of h1 and h2: Hydra over ssh (the anchor).
Per start: the seconds ``%mpi start`` took (the driver's clock around it), and the median of 30 empty cells'
round trips (``%%mpi pass``). Then, --reps times: slurmd on h2 is killed while a cell runs (every rank waits in
a barrier, then sleeps): the seconds from the kill to the cell's error naming the node.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from hosts import hosts_or_exit, setup_across, wait_for  # noqa: E402
from results import publish  # noqa: E402
from slurm_cluster import SlurmNodes  # noqa: E402

MARK = "<!-- slurm nodes -->"
DRIVER = HERE.parent / "tests" / "multihost_driver.py"
TRIPS = 30


def drive(hosts, slurm, setup, steps, timeout=300):
    done = hosts.output(0, [sys.executable, str(DRIVER), json.dumps({"setup": setup, "steps": steps})],
                        timeout=timeout, env={**os.environ, **slurm.env, **hosts.mpi_env})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"the notebook's side printed no result:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def start_and_trips(hosts, slurm, setup):
    result = drive(hosts, slurm, setup, [["line", "start -n 4"], *[["cell", "", "pass"]] * TRIPS])
    start, *trips = result["steps"]
    if start["raised"]:
        raise RuntimeError(f"the start failed: {start['raised']}")
    return start["ended"] - start["started"], statistics.median(step["ended"] - step["started"] for step in trips)


def lost_node(hosts, slurm, setup):
    """Seconds from killing h2's slurmd, while every rank runs a cell, to that cell's error."""
    mark = slurm.root / "running"
    mark.unlink(missing_ok=True)
    killed = {}

    def kill():
        wait_for(mark.exists, "the cell running", 120)
        time.sleep(0.5)
        killed["at"] = time.time()
        slurm.kill_slurmd(hosts.names[2])

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    code = f"import time\nopen({str(mark)!r}, 'w').close()\ncomm.Barrier()\ntime.sleep(120)"
    try:
        result = drive(hosts, slurm, setup, [["line", "start -n 4"], ["cell", "--timeout 150", code]])
    finally:
        killer.join(timeout=5)
        slurm.restart_slurmd(hosts.names[2])
    cell = result["steps"][1]
    if not cell["raised"] or hosts.names[2] not in cell["raised"][1]:
        raise RuntimeError(f"the cell did not fail naming {hosts.names[2]}: {cell['raised']}")
    return cell["ended"] - killed["at"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--markdown", help="replace the Slurm-across-nodes section of this file with the table")
    args = parser.parse_args()
    hosts = hosts_or_exit(3)
    try:
        with SlurmNodes(hosts) as slurm:
            arms = {"slurm": {"launcher": "slurm", "ip": hosts.addresses[0], "scheduler_args": ["--nodes=2"]},
                    "ssh": setup_across(hosts, (1, 2), 2)}
            runs = {"slurm": [], "ssh": []}
            for rep in range(args.reps):
                for name in (("slurm", "ssh") if rep % 2 == 0 else ("ssh", "slurm")):
                    runs[name].append(start_and_trips(hosts, slurm, arms[name]))
            lost = [lost_node(hosts, slurm, arms["slurm"]) for _ in range(args.reps)]
    finally:
        hosts.close()

    def median(name, index):
        return statistics.median(run[index] for run in runs[name])

    rows = [MARK, f"A world of 4 ranks on two Slurm nodes (slurmctld on h0, a slurmd on each of h1 and h2, network "
            f"namespaces) against Hydra over ssh on the same hosts, medians of {args.reps} alternating starts "
            f"(`python benchmarks/slurm_nodes.py --reps {args.reps}`, {datetime.date.today()}, {platform.node()}, "
            f"{os.cpu_count()} cores):", "",
            "| case | anchor | through Slurm | anchor time | Slurm / anchor |", "|---|---|---|---|---|",
            f"| world start, N=4 on 2 nodes (sbatch → every rank registered and connected) | Hydra over ssh, same "
            f"hosts | {median('slurm', 0):.2f} s | {median('ssh', 0):.2f} s | "
            f"{median('slurm', 0) / median('ssh', 0):.2f} |",
            f"| empty cell round trip, N=4 on 2 nodes, median of {TRIPS} | Hydra over ssh, same hosts | "
            f"{median('slurm', 1) * 1e3:.2f} ms | {median('ssh', 1) * 1e3:.2f} ms | "
            f"{median('slurm', 1) / median('ssh', 1):.2f} |",
            f"| a node's slurmd killed mid-cell: kill → the cell's error naming the node | goal ≤ 10 s | "
            f"{statistics.median(lost):.1f} s (each: {', '.join(f'{s:.1f}' for s in lost)}) | | |", MARK]
    publish("\n".join(rows), args.markdown, MARK)


if __name__ == "__main__":
    main()
