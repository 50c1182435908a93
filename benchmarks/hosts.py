"""--gather across hosts (each rank's bytes sealed on their own) against shared memory on one host and the link.

    python benchmarks/hosts.py [--sizes 8,32] [--reps 9] [--warm 2] [--markdown PATH]

Three real hosts on this machine (tests/hosts.py: network + UTS namespaces h0, h1, h2 joined by veth links through
a bridge, each with its own address and sshd). The notebook's side runs inside h0 (benchmarks/hosts_driver.py: an
IPython shell with mpinb loaded, driven over stdin, timing each cell with ``time.perf_counter`` around
``run_cell_magic``). Two worlds of 4 ranks stay up side by side for the whole run:

  across hosts   2 ranks on each of h1 and h2, started over ssh by Hydra (MPI's traffic over eth0), the channel on
                 h0's address (so encrypted with CurveZMQ). No rank shares the notebook's host, so --gather takes
                 the ``frames`` transport: each rank seals its own bytes and sends them to the notebook (h1 -> h0,
                 h2 -> h0). Set to ``mpi``: one MPI gather to rank 0 (on h1; the two ranks on h2 send theirs
                 across the h2 -> h1 link), then rank 0 sends every rank's bytes in one message (h1 -> h0).
  one host       4 ranks inside h0 with the notebook (local mpiexec, channel on loopback): the ``shm`` transport.

The arms, per size S of float32 per rank (each rank holds ``np.arange(n, dtype=float32) + rank``), interleaved
--reps times with the order rotated each round, each a median with half its interquartile range:
  frames         ``%%mpi --gather x --no-inspect`` (cell ``pass``) in the world across hosts;
  mpi            the same with ``gather_transport = "mpi"``;
  shm            the same in the world on one host (the anchor: shared memory on one host);
  tcp            the same 4 S bytes sent by a Python socket on h1 (``sendall``) to one on h0 (``recv_into`` a
                 preallocated buffer), over the same veth path: what the link can carry;
  tcp, fresh     the same into a new buffer each time: its pages are faulted in as the bytes arrive, as they are
                 for any values the notebook keeps (a page fault costs about 2 us on this VM);
  tcp, 2 hops    the path the mpi transport takes, store and forward: h1's peer first receives 2 S from h2, then
                 sends 4 S to h0;
and, to say where the time goes:
  first hop      a cell (no --gather) running the MPI gather to rank 0 that the transport makes (pkl5 on
                 MPI.COMM_WORLD, as the ranks' agent does);
  sealed         the 4 S bytes pushed from h1 to a PULL socket on h0 as the cell channel sends a large reply
                 across hosts: AES-GCM sealed chunks of 2 MB (wire/bulk.py), opened on h0;
  curve, zmq     the 4 S bytes as one ZeroMQ message pushed from h1 to a PULL socket on h0, with CurveZMQ (as the
                 channel sent them before) and without any encryption;
  empty          an empty cell (``pass``, no gather) in each world: the fixed cost of a cell there.
The gathered values are compared with the expected arrays once per size and world (after the warm-up rounds).
Every "wire" here is the kernel copying memory between namespaces on the same cores as the ranks, so the link
is fast and CPU-bound, not a network's; what matters is how close the gather gets to it. The hosts are
torn down at the end (every process on them killed by pid, the namespaces deleted); the script says whether
anything was still running on them before that.
"""

import argparse
import datetime
import json
import os
import platform
import queue
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # before this directory: `hosts` is tests/hosts.py, not this file

from hosts import hosts_or_exit, setup_across, wait_for  # noqa: E402
from results import publish  # noqa: E402

MARK = "<!-- across hosts -->"
DRIVER = HERE / "hosts_driver.py"
PER_HOST, RANK_HOSTS = 2, (1, 2)
RANKS = PER_HOST * len(RANK_HOSTS)
PORT = 5201


class Notebook:
    """A notebook's side (hosts_driver.py notebook) running on host 0, answering one request at a time."""

    def __init__(self, hosts, name, setup):
        self.name = name
        self.log = open(hosts.dir / f"{name}.log", "w")
        self.process = hosts.run(0, [sys.executable, str(DRIVER), "notebook", json.dumps(setup)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                 cwd=HERE.parent)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            if line.startswith("REPLY "):
                self.lines.put(json.loads(line.removeprefix("REPLY ")))
        self.lines.put(None)

    def request(self, timeout=180, **request):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        try:
            reply = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"{self.name}: no answer to {request} in {timeout} s") from None
        if reply is None:
            raise RuntimeError(f"{self.name}: the driver exited (see its log) on {request}")
        if reply["raised"]:
            raise RuntimeError(f"{self.name}: {request} raised {reply['raised']}\n{reply['output']}")
        return reply

    def cell(self, args, code):
        return self.request(op="cell", args=args, code=code)["seconds"]

    def close(self, timeout=60):
        """Stop the world and the driver: asked to, then by its pid."""
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.process.stdin.close()
                self.process.wait(timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(timeout=10)
        self.log.close()


def transport_cell(notebook, transport, args):
    """The seconds of one ``%%mpi ARGS`` cell ``pass`` with ``gather_transport`` set to *transport* for it."""
    setting = "setattr(get_ipython().magics_manager.registry['MPIMagics'], 'gather_transport', {!r})"
    notebook.request(op="eval", expr=setting.format(transport))
    try:
        return notebook.cell(args, "pass")
    finally:
        notebook.request(op="eval", expr=setting.format("auto"))


def spread(values):
    """``(median, half the interquartile range)``."""
    quartiles = statistics.quantiles(values, n=4)
    return statistics.median(values), (quartiles[2] - quartiles[0]) / 2


def versions():
    code = ("import ipyparallel, mpi4py, platform, zmq\nfrom mpi4py import MPI\n"
            "print(f'Python {platform.python_version()}, ipyparallel {ipyparallel.__version__}, mpi4py '"
            "f'{mpi4py.__version__}, pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()}), '"
            "f'{\" \".join(MPI.Get_library_version().split()[:3])}')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or "versions unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8,32", help="MB of float32 per rank, comma-separated (default 8,32)")
    parser.add_argument("--reps", type=int, default=9, help="interleaved rounds per arm (default 9)")
    parser.add_argument("--warm", type=int, default=2, help="rounds before measuring (default 2)")
    parser.add_argument("--markdown", help="also put the table in this file (its own section)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.markdown and not Path(args.markdown).exists():
        Path(args.markdown).touch()  # publish() adds its section to the file
    load_start, started = os.getloadavg(), time.monotonic()
    times, exact, transports, left = {}, {}, {}, {}
    hosts = hosts_or_exit(3)
    try:
        notebooks, servers = [], []
        try:
            for i in RANK_HOSTS:  # the TCP peers, on the ranks' hosts
                server = hosts.run(i, [sys.executable, str(DRIVER), "serve", hosts.addresses[i], str(PORT)],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)
                servers.append(server)
                if server.stdout.readline().strip() != "READY":
                    raise RuntimeError(f"the TCP peer on {hosts.names[i]} did not start")
            across = Notebook(hosts, "across", setup_across(hosts, RANK_HOSTS, PER_HOST))
            notebooks.append(across)
            local = Notebook(hosts, "local", {})
            notebooks.append(local)
            for notebook in notebooks:
                notebook.request(op="line", line=f"start -n {RANKS}")
                code = "import numpy as np\n" + "\n".join(
                    f"x{mb} = np.arange({mb << 18}, dtype=np.float32) + rank" for mb in sizes)
                notebook.cell("", code)
                transports[notebook.name] = notebook.request(
                    op="eval", expr="get_ipython().magics_manager.registry['MPIMagics'].cells.transport(None)")["value"]
            where = across.request(op="eval", expr="get_ipython().magics_manager.registry['MPIMagics'].world.hosts()")
            print(f"ranks across hosts: {where['value']}; transports: {transports}", flush=True)
            assert transports == {"across": "'frames'", "local": "'shm'"}, transports

            h0, h1, h2 = hosts.addresses
            arms = {"empty, mpi": lambda: across.cell("", "pass"), "empty, shm": lambda: local.cell("", "pass")}
            for mb in sizes:
                s = mb << 20
                arms[f"frames {mb}"] = lambda mb=mb: across.cell(f"--gather x{mb} --no-inspect", "pass")
                arms[f"shm {mb}"] = lambda mb=mb: local.cell(f"--gather x{mb} --no-inspect", "pass")
                arms[f"mpi {mb}"] = lambda mb=mb: transport_cell(across, "mpi", f"--gather x{mb} --no-inspect")
                arms[f"tcp {mb}"] = lambda s=s: across.request(op="tcp", address=h1, port=PORT,
                                                               send=RANKS * s)["seconds"]
                arms[f"tcpf {mb}"] = lambda s=s: across.request(op="tcp", address=h1, port=PORT, send=RANKS * s,
                                                                fresh=True)["seconds"]
                arms[f"tcp2 {mb}"] = lambda s=s: across.request(
                    op="tcp", address=h1, port=PORT, send=RANKS * s,
                    fetch=[h2, PORT, PER_HOST * s])["seconds"]
                arms[f"first {mb}"] = lambda mb=mb: across.cell(
                    "", f"from mpi4py import MPI\nfrom mpi4py.util import pkl5\n"
                    f"_g = pkl5.Intracomm(MPI.COMM_WORLD).gather(x{mb}, root=0)\ndel _g")
                for curve in (False, True, "sealed"):
                    name = {False: "zmq", True: "curve", "sealed": "sealed"}[curve]
                    arms[f"{name} {mb}"] = lambda s=s, curve=curve: across.request(
                        op="zmq", address=h1, port=PORT, send=RANKS * s, curve=curve, bind=h0)["seconds"]
            names = list(arms)
            times = {name: [] for name in names}
            for _ in range(args.warm):
                for arm in arms.values():
                    arm()
            for mb in sizes:  # what each transport brings, compared with what each rank holds
                for notebook, transport in ((local, "shm"), (across, "frames"), (across, "mpi")):
                    arms[f"{transport} {mb}"]()
                    exact[(notebook.name, transport, mb)] = notebook.request(
                        op="check", name=f"x{mb}", floats=mb << 18, ranks=RANKS)["value"]
            print(f"gathered values exact: {exact}", flush=True)
            for round_ in range(args.reps):
                for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                    times[name].append(arms[name]())
                print(f"round {round_ + 1}/{args.reps}: " + ", ".join(
                    f"{name} {statistics.median(t) * 1e3:.1f}" for name, t in times.items()), flush=True)
        finally:
            for notebook in notebooks:
                notebook.close()
            for server in servers:
                server.kill()
                server.wait(timeout=10)
                server.stdout.close()
            for i in range(hosts.n):
                try:
                    wait_for(lambda: not hosts.pids_on(i), f"no process on {hosts.names[i]}", 30)
                except RuntimeError:
                    pass
                left[hosts.names[i]] = hosts.pids_on(i)
    finally:
        hosts.close()
    elapsed, load_end = time.monotonic() - started, os.getloadavg()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    ours_left = [ns for ns in hosts.namespaces + [hosts.switch] if ns in namespaces]
    print(f"left on the hosts before teardown: {left}; namespaces left after it: {ours_left}; "
          f"load average {load_start[0]:.2f} at start, {load_end[0]:.2f} at end; {elapsed:.0f} s", flush=True)
    assert all(exact.values()), exact

    def ms(name, payload=None):
        median, half = spread(times[name])
        text = f"{median * 1e3:.1f} ms ± {half * 1e3:.1f}"
        return text + (f" ({payload / median / 1e9:.2f} GB/s)" if payload else "")

    def ratio(a, b):
        return f"{statistics.median(times[a]) / statistics.median(times[b]):.2f}"

    rows = ["| case | anchor | mpinb | anchor time | mpinb / anchor |", "|---|---|---|---|---|"]
    for mb in sizes:
        payload, case = RANKS * mb << 20, f"--gather {mb} MB float32 per rank, N={RANKS} ({RANKS * mb} MB)"
        rows += [
            f"| {case} across hosts (each rank sends its own, sealed: frames transport) | the same on one host "
            f"(shm transport) | {ms(f'frames {mb}', payload)} | {ms(f'shm {mb}', payload)} "
            f"| {ratio(f'frames {mb}', f'shm {mb}')} |",
            f"| the same | the link: TCP of {RANKS * mb} MB h1 → h0 | {ms(f'frames {mb}', payload)} "
            f"| {ms(f'tcp {mb}', payload)} | {ratio(f'frames {mb}', f'tcp {mb}')} |",
            f"| the same | the link into new memory: the same TCP, received into pages not touched before (as "
            f"values the notebook keeps must be) | {ms(f'frames {mb}', payload)} | {ms(f'tcpf {mb}', payload)} "
            f"| {ratio(f'frames {mb}', f'tcpf {mb}')} |",
            f"| the same set to the mpi transport (gather to rank 0, then one message) | its path over TCP: "
            f"{PER_HOST * mb} MB h2 → h1, then {RANKS * mb} MB h1 → h0 | {ms(f'mpi {mb}', payload)} "
            f"| {ms(f'tcp2 {mb}', payload)} | {ratio(f'mpi {mb}', f'tcp2 {mb}')} |",
            f"| why, first hop: a cell running only the same MPI gather to rank 0 (pkl5), no --gather | "
            f"the mpi transport | {ms(f'first {mb}')} | {ms(f'mpi {mb}')} | {ratio(f'first {mb}', f'mpi {mb}')} |",
            f"| why, second hop: the {RANKS * mb} MB h1 → h0 as the channel sends a large reply across hosts "
            f"(AES-GCM, 2 MB chunks, wire/bulk.py) | the link: TCP, the same bytes | {ms(f'sealed {mb}', payload)} "
            f"| {ms(f'tcp {mb}', payload)} | {ratio(f'sealed {mb}', f'tcp {mb}')} |",
            f"| the same bytes as one ZeroMQ message with CurveZMQ (how the channel sent them before) | the link: "
            f"TCP, the same bytes | {ms(f'curve {mb}', payload)} | {ms(f'tcp {mb}', payload)} "
            f"| {ratio(f'curve {mb}', f'tcp {mb}')} |",
            f"| the same message, neither encrypted nor authenticated | the link: TCP, the same bytes "
            f"| {ms(f'zmq {mb}', payload)} | {ms(f'tcp {mb}', payload)} | {ratio(f'zmq {mb}', f'tcp {mb}')} |",
        ]
    rows.append(f"| empty cell across hosts, N={RANKS} | the same on one host | {ms('empty, mpi')} | "
                f"{ms('empty, shm')} | {ratio('empty, mpi', 'empty, shm')} |")
    command = "python benchmarks/hosts.py" + "".join(
        f" {flag} {shlex.quote(str(value))}" for flag, value, default in
        (("--sizes", args.sizes, "8,32"), ("--reps", args.reps, 9), ("--warm", args.warm, 2)) if value != default)
    header = (
        f"{MARK}\n## --gather across hosts\n\n`{command}`, {datetime.date.today()}, {platform.node()}: "
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; {versions()}. "
        f"Hosts h0-h2 are network namespaces on this machine joined by veth links through a bridge (MTU 1500): "
        f"the notebook on h0, {PER_HOST} ranks on each of h1 and h2 (Hydra over ssh, MPI over TCP on eth0, the "
        f"cell channel encrypted with CurveZMQ, large replies sealed with AES-GCM), against a world of {RANKS} ranks on h0 with the notebook, both "
        f"up throughout. Medians ± half the interquartile range over {args.reps} interleaved rounds; GB/s is the "
        f"gathered bytes over the time; values checked exact. Load average {load_start[0]:.2f} at start, "
        f"{load_end[0]:.2f} at end.\n\n")
    publish(header + "\n".join(rows) + f"\n{MARK}", args.markdown, MARK)


if __name__ == "__main__":
    main()
