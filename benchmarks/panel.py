"""What JupyterLab's MPI panel costs: CPU on each rank and on the notebook's host, its update rate, and the Jupyter
server's read of the state, measured side by side in one run.

    python benchmarks/panel.py [--ranks 2] [--seconds 4] [--reps 3] [--markdown PATH]

The same cell (every rank sleeping --seconds, so that a rank's own CPU is next to nothing and what the panel adds
shows) runs with the panel off and on, in turns, --reps times each. The CPU each rank's process and the notebook's
process used during the cell is read from the OS (user + system time); the panel's cost is the difference, as a
percentage of one core. The update rate is the state file's writes per second while the cell ran, and the roll-call
answers per rank per second it was fed; the server's cost is its handler's read of the state, timed, at the
panel's poll of 3.3 reads a second. A rank's answer to one roll call (where it is, as the message it sends) is also
timed on the rank itself, a main thread in a training loop's depth of frames: its cost at the roll calls' rate is
the row "per answer, on a rank".
"""

import argparse
import os
import platform
import statistics
import tempfile
import time

import psutil
from results import OtherLoad, publish, shell

MARK = "<!-- mpi panel -->"
ANSWER = """
import pickle, threading, time
from mpinb.rank import tracing
from mpinb.wire.kinds import Where

def deep(n, ready, done):
    if n:
        return deep(n - 1, ready, done)
    ready.set()
    done.wait()

ready, done = threading.Event(), threading.Event()
main = threading.Thread(target=deep, args=(30, ready, done))
main.start()
ready.wait()
tracing.state.main = main.ident  # a thread 30 frames deep stands in for the main thread in a training step
began = time.thread_time()
for _ in range(500):
    pickle.dumps(Where(rank, 1, tracing.state.where()))
answer_seconds = (time.thread_time() - began) / 500
done.set()
main.join()
tracing.state.main = threading.main_thread().ident
"""


def cpu(process):
    times = process.cpu_times()
    return times.user + times.system


def one_cell(ip, processes, me, seconds):
    """CPU seconds of each rank and of this process while the cell runs, and its wall time."""
    before = [cpu(process) for process in processes], cpu(me), time.perf_counter()
    ip.run_cell_magic("mpi", "", f"time.sleep({seconds})")
    wall = time.perf_counter() - before[2]
    return [cpu(process) - start for process, start in zip(processes, before[0])], cpu(me) - before[1], wall


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2, help="ranks of the world (default 2)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds each cell sleeps (default 10)")
    parser.add_argument("--reps", type=int, default=3, help="cells with the panel off and on, each (default 3)")
    parser.add_argument("--markdown", help="also put the table in this file (its own section)")
    args = parser.parse_args()

    from mpinb.notebook import panel
    from mpinb.server.handlers import kernel_states

    directory = tempfile.mkdtemp(prefix="mpinb-panel-bench-")
    ip = shell()
    load = OtherLoad()
    ip.run_cell_magic("mpi", f"-n {args.ranks}", "import time")
    world = ip.magics_manager.registry["MPIMagics"].world
    processes = [psutil.Process(world.identities[rank]["pid"]) for rank in world.ranks]
    me = psutil.Process()
    off, on, rates, answers = [], [], [], []
    try:
        for _ in range(args.reps):
            panel.stop()
            off.append(one_cell(ip, processes, me, args.seconds))
            publisher = panel.start("bench", directory=directory)
            ip.run_cell_magic("mpi", "", "pass")  # the publisher meets the world
            writes, fed = publisher.writes, publisher.calls
            on.append(one_cell(ip, processes, me, args.seconds))
            rates.append((publisher.writes - writes) / on[-1][2])
            answers.append((publisher.calls - fed) / on[-1][2])
        # one answer, timed on each rank: the WhereAnswer of a main thread some frames deep, pickled as it is sent
        ip.run_cell_magic("mpi", "--gather answer_seconds", ANSWER)
        answer_seconds = max(ip.user_ns["answer_seconds"].values())
        state_path = os.path.join(directory, "bench.json")
        reads, began = 0, time.perf_counter()

        class Manager:  # the server's kernel manager as the handler asks it: this one kernel, busy
            def list_kernel_ids(self):
                return ["bench"]

            def get_kernel(self, kernel_id):
                return type("Kernel", (), {"execution_state": "busy"})()

        while time.perf_counter() - began < 1.0:
            assert os.path.exists(state_path) and kernel_states(Manager(), directory)
            reads += 1
        read_seconds = (time.perf_counter() - began) / reads
    finally:
        panel.stop()
        ip.run_line_magic("mpi", "stop")

    def percent(runs, which):
        """Median CPU of *which* (a rank's index, or "notebook") as a percentage of one core."""
        values = [(used[which] if which != "notebook" else mine) / wall * 100 for used, mine, wall in runs]
        return statistics.median(values)

    rows = ["| process | panel off (% of a core) | panel on | panel's cost | limit |", "|---|---|---|---|---|"]
    costs = []
    for index, rank in enumerate(world.ranks or range(args.ranks)):
        cost = percent(on, index) - percent(off, index)
        costs.append(cost)
        rows.append(f"| rank {rank} | {percent(off, index):.2f} | {percent(on, index):.2f} | {cost:+.2f} | 1 |")
    cost = percent(on, "notebook") - percent(off, "notebook")
    rows.append(f"| notebook kernel | {percent(off, 'notebook'):.2f} | {percent(on, 'notebook'):.2f} | {cost:+.2f} | 1 |")
    rate = statistics.median(answers)
    rows.append(f"| per answer, on a rank ({answer_seconds * 1e6:.0f} µs at {rate:.1f}/s) | – | – | "
                f"{answer_seconds * rate * 100:+.3f} | 1 |")
    rows.append(f"| Jupyter server, 3.3 reads/s | – | {read_seconds * 3.3 * 100:.3f} | {read_seconds * 3.3 * 100:+.3f} | 1 |")
    rows.append("")
    rows.append(f"Updates: the state file written {statistics.median(rates):.2f} times a second while the cell ran "
                f"(at least 2 wanted); each rank asked where it is {statistics.median(answers):.2f} times a second; "
                f"one server read of the state {read_seconds * 1e3:.2f} ms.")
    machine = f"{platform.node()}: {platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"
    header = (f"{MARK}\n## The MPI panel's cost\n\nOn {machine}. `python benchmarks/panel.py --ranks {args.ranks} --seconds "
              f"{args.seconds:g} --reps {args.reps}`: each rank sleeping in the cell, medians of {args.reps} cells "
              f"with the panel off and on, in turns ({load.summary()}).\n\n")
    publish(header + "\n".join(rows) + f"\n{MARK}", args.markdown, MARK)


if __name__ == "__main__":
    main()
